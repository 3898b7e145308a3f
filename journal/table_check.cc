#include "journal/table_check.h"

#include "knod/hex.h"
#include "knod/json.h"
#include "knod/sha256.h"
#include "knod/untrusted.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace knod::journal {
namespace {

// One SQLite value as stored, compared with a JSON value from an event. Types count: a text
// '1000' is not the integer 1000 an event records.
struct Cell {
    int type = SQLITE_NULL;
    std::int64_t i = 0;
    double f = 0;
    std::string s; // text or blob bytes
};

std::string hex_of(const std::string &bytes) {
    return knod::to_hex({reinterpret_cast<const std::uint8_t *>(bytes.data()), bytes.size()});
}

Cell cell(const Statement &st, int col) {
    Cell c;
    c.type = st.type(col);
    if (c.type == SQLITE_INTEGER) c.i = st.int64(col);
    if (c.type == SQLITE_FLOAT) c.f = st.real(col);
    if (c.type == SQLITE_TEXT) c.s = st.text(col);
    if (c.type == SQLITE_BLOB) c.s = st.blob(col);
    return c;
}

bool same(const Cell &c, const nlohmann::json &v) {
    if (v.is_number_unsigned())
        return c.type == SQLITE_INTEGER && c.i >= 0 &&
               static_cast<std::uint64_t>(c.i) == v.get<std::uint64_t>();
    if (v.is_number_integer()) return c.type == SQLITE_INTEGER && c.i == v.get<std::int64_t>();
    if (v.is_string()) return c.type == SQLITE_TEXT && c.s == v.get_ref<const std::string &>();
    if (v.is_null()) return c.type == SQLITE_NULL;
    return false;
}

// Values in messages: other users' bytes (and a tamperer's) escaped, strings quoted.
std::string shown(const Cell &c) {
    switch (c.type) {
    case SQLITE_INTEGER:
        return std::to_string(c.i);
    case SQLITE_FLOAT:
        return knod::dump_json(c.f);
    case SQLITE_TEXT:
        return quote_untrusted(c.s, 256);
    case SQLITE_BLOB:
        return "x" + quote_untrusted(hex_of(c.s), 256);
    default:
        return "NULL";
    }
}

std::string shown(const nlohmann::json &v) {
    if (v.is_null()) return "NULL";
    if (v.is_string()) return quote_untrusted(v.get_ref<const std::string &>(), 256);
    if (v.is_number()) return knod::dump_json(v);
    return quote_untrusted(knod::dump_json(v), 256);
}

std::string session_name(const std::string &id) {
    return "session " + escape_untrusted(id, Escape::value, 128);
}

// The columns an event vouches for, in the order they are selected. The `handoff` column is
// not among them: it is the daemon's private restart state (holder, region identity, key MAC),
// written at a stop that keeps bindings and cleared at the next start, never shown by `audit`.
// The daemon checks it itself: a MAC under the key secret over the whole record (every field
// adoption reads, the binding id and the journal id), refused by name when it does not match
// (docs/threat-model.md, "A restart hands over only what the kernel still vouches for").
constexpr std::array<const char *, 13> opening_columns = {
    "id",   "uid",          "pid",   "exe",    "unit", "netdev",    "gpu",
    "mode", "region_bytes", "flows", "key_id", "rule", "started_us"};
constexpr std::array<const char *, 5> end_columns = {"ended_us", "end_reason", "rx_bytes",
                                                     "rx_packets", "dropped_packets"};
constexpr const char *row_select =
    "SELECT rowid, id, uid, pid, exe, unit, netdev, gpu, mode, region_bytes, flows, key_id, "
    "rule, started_us, ended_us, end_reason, rx_bytes, rx_packets, dropped_packets FROM sessions";

struct Row {
    std::int64_t rowid = 0;
    std::string key; // the id; a non-text id gets a key no event's session id can be
    std::array<Cell, opening_columns.size()> open;
    std::array<Cell, end_columns.size()> end;
};

Row read_row(const Statement &st) {
    Row r;
    r.rowid = st.int64(0);
    for (std::size_t i = 0; i < r.open.size(); ++i)
        r.open[i] = cell(st, static_cast<int>(1 + i));
    for (std::size_t i = 0; i < r.end.size(); ++i)
        r.end[i] = cell(st, static_cast<int>(1 + r.open.size() + i));
    r.key = r.open[0].type == SQLITE_TEXT ? r.open[0].s
                                          : std::string(1, '\0') + std::to_string(r.rowid);
    return r;
}

// The fast path (most events): where the top-level `key`'s value starts in a detail as the
// writer dumps it (compact JSON), found by a scan that tracks strings and depth; no parse.
std::optional<std::size_t> top_level_value(std::string_view json, std::string_view key) {
    int depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < json.size(); ++i) {
        char c = json[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            // "key": at depth 1 is a key of the top-level object (a value is never followed by
            // a colon).
            if (depth == 1 && json.size() - i > key.size() + 2 &&
                json.compare(i + 1, key.size(), key) == 0 && json[i + 1 + key.size()] == '"' &&
                json[i + 2 + key.size()] == ':')
                return i + 3 + key.size();
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if (c == '}' || c == ']') {
            --depth;
        }
    }
    return std::nullopt;
}

// A JSON literal of a cell, for the fast path; none when unsure (the full parse decides then):
// only integers and strings of printable ASCII without escapes beyond \" and \\.
bool append_literal(std::string &out, const Cell &c) {
    if (c.type == SQLITE_INTEGER) {
        out += std::to_string(c.i);
        return true;
    }
    if (c.type != SQLITE_TEXT) return false;
    out += '"';
    for (char ch : c.s) {
        auto u = static_cast<unsigned char>(ch);
        if (u < 0x20 || u >= 0x7f) return false;
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
    }
    out += '"';
    return true;
}

// True when the detail's top-level `key` is exactly the object `literal` (a complete JSON
// object: a value that starts with it is it). False means "not known": parse and compare.
bool holds_exactly(const std::optional<std::string> &detail, std::string_view key,
                   const std::string &literal) {
    if (!detail || literal.empty()) return false;
    auto at = top_level_value(*detail, key);
    return at && detail->compare(*at, literal.size(), literal) == 0;
}

// The row's values as the writer dumps "session" (keys sorted, compact); "" when unsure. flows
// is the row's text as is: the writer stores the dump of the very array it puts in the event.
std::string session_literal(const Row &r) {
    static const std::array<std::size_t, opening_columns.size()> sorted = [] {
        std::array<std::size_t, opening_columns.size()> order{};
        for (std::size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        std::sort(order.begin(), order.end(), [](std::size_t a, std::size_t b) {
            return std::string_view(opening_columns[a]) < std::string_view(opening_columns[b]);
        });
        return order;
    }();
    std::string out = "{";
    for (std::size_t i : sorted) {
        if (out.size() > 1) out += ',';
        out += '"';
        out += opening_columns[i];
        out += "\":";
        const Cell &c = r.open[i];
        if (i == 9) {
            if (c.type != SQLITE_TEXT || c.s.empty() || c.s.front() != '[') return {};
            out += c.s;
        } else if (!append_literal(out, c)) {
            return {};
        }
    }
    return out + "}";
}

std::string end_literal(const std::array<Cell, end_columns.size()> &end) {
    // Sorted: dropped_packets, end_reason, ended_us, rx_bytes, rx_packets.
    std::string out = "{";
    for (std::size_t i : {4, 1, 0, 2, 3}) {
        if (out.size() > 1) out += ',';
        out += '"';
        out += end_columns[i];
        out += "\":";
        if (!append_literal(out, end[i])) return {};
    }
    return out + "}";
}

nlohmann::json object_in(const std::optional<std::string> &detail, const char *key) {
    if (!detail) return {};
    auto d = knod::parse_json(*detail);
    if (!d.is_object()) return {};
    auto it = d.find(key);
    return it != d.end() && it->is_object() ? *it : nlohmann::json();
}

Result<bool> has_table(Database &db, const std::string &name) {
    auto n = db.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '" +
                       name + "'");
    if (!n) return n.error();
    return *n > 0;
}

} // namespace

struct TableCheck::State {
    explicit State(Database &d) : db(d) {}
    Database &db;
    std::optional<Statement> rows;  // the sessions table in rowid order, beside the chain
    std::optional<Statement> by_id; // a row out of that order
    std::optional<Row> cur;         // the next row in rowid order; none at the end
    // Rows passed in rowid order whose grant has not come (yet): out of order, or unexplained.
    std::unordered_map<std::string, Row> passed;
    struct Open {
        std::int64_t seq; // its grant
        std::array<Cell, end_columns.size()> end;
    };
    std::unordered_map<std::string, Open> open;      // granted in the chain, not closed yet
    std::unordered_set<std::string> closed_unopened; // closed in the chain, grant pruned
    std::optional<std::string> duplicate;            // a second row with a session's id
    // policy digest -> the first load event naming it: seq, at_us
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> named;
    std::optional<std::int64_t> first_at_us; // the chain's first event
    std::map<std::int64_t, std::pair<std::int64_t, nlohmann::json>> prunes; // through -> event
    bool has_meta = false, has_policies = false, has_checkpoints = false;
    std::optional<std::string> journal_id, machine_id, hostname; // meta
    // The newest daemon-start recording its host: seq, machine_id, hostname (as recorded).
    std::optional<std::tuple<std::int64_t, std::string, std::string>> host;

    Result<void> advance() {
        auto row = rows->step();
        if (!row) return row.error();
        if (*row)
            cur = read_row(*rows);
        else
            cur.reset();
        return {};
    }

    // The row of session `id`: the next in rowid order (the usual case), or one passed, or one
    // further on (the rows before it are passed: their grants have not come).
    Result<std::optional<Row>> take(const std::string &id) {
        if (cur && cur->key == id) {
            Row r = std::move(*cur);
            if (auto a = advance(); !a) return a.error();
            return std::optional<Row>(std::move(r));
        }
        if (auto it = passed.find(id); it != passed.end()) {
            Row r = std::move(it->second);
            passed.erase(it);
            return std::optional<Row>(std::move(r));
        }
        by_id->bind(1, id);
        auto found = by_id->step();
        if (!found) return found.error();
        if (!*found) {
            by_id->reset();
            return std::optional<Row>();
        }
        Row r = read_row(*by_id);
        by_id->reset();
        if (cur && r.rowid > cur->rowid) {
            while (cur && cur->rowid < r.rowid) {
                std::string key = cur->key;
                if (!passed.emplace(key, std::move(*cur)).second) duplicate = key;
                if (auto a = advance(); !a) return a.error();
            }
            if (cur && cur->rowid == r.rowid)
                if (auto a = advance(); !a) return a.error();
        }
        return std::optional<Row>(std::move(r));
    }
};

TableCheck::TableCheck(std::unique_ptr<State> state) : s_(std::move(state)) {}
TableCheck::~TableCheck() = default;

Result<std::unique_ptr<TableCheck>> TableCheck::open(Database &db, std::int64_t schema_version) {
    auto s = std::make_unique<State>(db);
    auto rows = db.prepare(std::string(row_select) + " ORDER BY rowid");
    if (!rows) return rows.error();
    s->rows.emplace(std::move(*rows));
    auto by_id = db.prepare(std::string(row_select) + " WHERE id = ?");
    if (!by_id) return by_id.error();
    s->by_id.emplace(std::move(*by_id));
    for (auto [name, flag] : {std::pair<const char *, bool *>{"meta", &s->has_meta},
                              {"policies", &s->has_policies},
                              {"checkpoints", &s->has_checkpoints}}) {
        auto has = has_table(db, name);
        if (!has) return has.error();
        *flag = *has;
    }
    std::optional<TableProblem> first;
    auto note = [&](std::string what) {
        if (!first) first = TableProblem{0, std::move(what)};
    };
    if (s->has_meta) {
        auto st = db.prepare("SELECT key, value FROM meta WHERE key IN ('journal_id', "
                             "'machine_id', 'hostname') ORDER BY key");
        if (!st) return st.error();
        for (;;) {
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) break;
            std::string key = st->text(0);
            if (st->type(1) != SQLITE_TEXT) {
                note("meta." + key + " is " + shown(cell(*st, 1)) +
                     ": not the text the journal writes (edited)");
                continue;
            }
            (key == "journal_id"   ? s->journal_id
             : key == "machine_id" ? s->machine_id
                                   : s->hostname) = st->text(1);
        }
    }
    // Schema 4 makes the id with the meta table; none means it was deleted, and the system
    // journal's copies (matched by it) would go unfound.
    if (schema_version >= 4 && (!s->journal_id || s->journal_id->empty()))
        note("meta.journal_id is missing or empty, but schema version " +
             std::to_string(schema_version) + " always has one (deleted)");
    // A rebuilt table without its primary key can hold a second, forged row for a session:
    // found by `WHERE id = ?` instead of the one the chain vouches for.
    auto dup = db.prepare("SELECT id, count(*) FROM sessions GROUP BY id HAVING count(*) > 1 "
                          "LIMIT 1");
    if (!dup) return dup.error();
    if (auto row = dup->step(); !row)
        return row.error();
    else if (*row)
        note(session_name(dup->text(0)) + ": " + std::to_string(dup->int64(1)) +
             " rows in the sessions table (inserted)");
    if (auto a = s->advance(); !a) return a.error();
    auto check = std::unique_ptr<TableCheck>(new TableCheck(std::move(s)));
    check->problem_ = std::move(first);
    return check;
}

void TableCheck::report(std::int64_t seq, std::string what) {
    if (!problem_) problem_ = TableProblem{seq, std::move(what)};
}

Result<void> TableCheck::event(std::int64_t seq, const Event &e) {
    State &s = *s_;
    if (!s.first_at_us) s.first_at_us = e.at_us;
    std::string ev = "event " + std::to_string(seq);
    if (e.session_id && e.kind == kind::granted) {
        const std::string &id = *e.session_id;
        auto row = s.take(id);
        if (!row) return row.error();
        if (!*row) {
            report(seq, session_name(id) + ": its grant (" + ev +
                            ") is in the chain but its row is missing from the sessions table "
                            "(deleted)");
            return {};
        }
        if (holds_exactly(e.detail, "session", session_literal(**row))) {
            ++counts_.sessions_checked;
            s.open[id] = {seq, (*row)->end};
            return {};
        }
        auto values = object_in(e.detail, "session");
        if (values.is_object()) {
            for (std::size_t i = 0; i < opening_columns.size(); ++i) {
                const Cell &c = (*row)->open[i];
                auto it = values.find(opening_columns[i]);
                nlohmann::json v = it == values.end() ? nlohmann::json() : *it;
                // flows: the row holds the JSON text of the array the event holds.
                bool ok = i == 9
                              ? v.is_array() && c.type == SQLITE_TEXT && c.s == knod::dump_json(v)
                              : same(c, v);
                if (!ok) {
                    report(seq, session_name(id) + ": " + opening_columns[i] + " is " + shown(c) +
                                    " in the sessions table but " + shown(v) + " in " + ev +
                                    " (edited)");
                    break;
                }
            }
            ++counts_.sessions_checked;
        } else {
            ++counts_.sessions_not_covered; // granted by an older build: no values to compare
        }
        s.open[id] = {seq, (*row)->end};
        return {};
    }
    if (e.session_id && e.kind == kind::ended) {
        const std::string &id = *e.session_id;
        auto it = s.open.find(id);
        if (it == s.open.end()) {
            s.closed_unopened.insert(id); // its grant was pruned
            return {};
        }
        auto end = std::move(it->second.end);
        s.open.erase(it);
        if (end[0].type == SQLITE_NULL) {
            report(seq, session_name(id) + ": closed by " + ev +
                            " but open in the sessions table (ended_us is NULL) (edited)");
            return {};
        }
        if (holds_exactly(e.detail, "end", end_literal(end))) return {};
        auto values = object_in(e.detail, "end");
        if (!values.is_object()) return {}; // closed by an older build
        for (std::size_t i = 0; i < end_columns.size(); ++i) {
            auto v = values.find(end_columns[i]);
            nlohmann::json want = v == values.end() ? nlohmann::json() : *v;
            if (!same(end[i], want)) {
                report(seq, session_name(id) + ": " + end_columns[i] + " is " + shown(end[i]) +
                                " in the sessions table but " + shown(want) + " in " + ev +
                                " (edited)");
                break;
            }
        }
        return {};
    }
    if (e.kind == kind::daemon_start || e.kind == kind::reload || e.kind == kind::prune) {
        auto d = e.detail ? knod::parse_json(*e.detail) : nlohmann::json();
        if (!d.is_object()) {
            if (e.kind == kind::prune)
                report(seq, ev + " (retention-prune): its detail is not a JSON object (malformed)");
            return {};
        }
        auto text = [&](const char *key) -> std::optional<std::string> {
            auto it = d.find(key);
            if (it == d.end() || !it->is_string()) return std::nullopt;
            return it->get<std::string>();
        };
        if (e.kind != kind::prune)
            if (auto p = text("policy")) s.named.emplace(*p, std::pair{seq, e.at_us});
        // Both carry the journal's id inside the chain (a pruned journal may keep no start).
        if (auto j = text("journal_id"); j && s.journal_id != *j)
            report(seq,
                   "meta.journal_id is " +
                       (s.journal_id ? quote_untrusted(*s.journal_id) : std::string("missing")) +
                       " in the meta table but " + quote_untrusted(*j) + " in " + ev + " (" +
                       e.kind + ") (edited)");
        if (e.kind == kind::daemon_start) {
            auto m = text("machine_id"), h = text("hostname");
            if (m && h) s.host.emplace(seq, *m, *h);
        }
        if (e.kind == kind::prune) {
            auto through = d.find("pruned_through");
            if (through == d.end() || !through->is_number_integer())
                report(seq, ev + " (retention-prune): no integer pruned_through (malformed)");
            else
                s.prunes[through->get<std::int64_t>()] = {seq, d};
        }
        return {};
    }
    return {};
}

Result<void> TableCheck::finish(std::int64_t first_seq, bool pruned_by_this_build) {
    State &s = *s_;
    // Sessions the chain opened and never closed: open rows, with nothing an end would set.
    std::map<std::int64_t, std::string> still_open; // by grant, to name the first
    for (auto &[id, o] : s.open) {
        std::string ev = "event " + std::to_string(o.seq);
        if (o.end[0].type != SQLITE_NULL) {
            still_open.emplace(
                o.seq,
                session_name(id) + ": ended in the sessions table (ended_us " + shown(o.end[0]) +
                    ") but the chain has no closing event for its grant (" + ev + ") (edited)");
            continue;
        }
        const std::array<nlohmann::json, 4> unset = {nullptr, 0, 0, 0};
        for (std::size_t i = 1; i < end_columns.size(); ++i)
            if (!same(o.end[i], unset[i - 1])) {
                still_open.emplace(o.seq, session_name(id) + ": " + end_columns[i] + " is " +
                                              shown(o.end[i]) + " in the sessions table but " +
                                              shown(unset[i - 1]) +
                                              " for a session the chain has not closed (grant " +
                                              ev + ") (edited)");
                break;
            }
    }
    if (!still_open.empty()) report(still_open.begin()->first, still_open.begin()->second);

    // Rows no grant in the chain explained, in rowid order: inserted, unless an older build's
    // retention left them (their grant pruned, their closing event still in the chain).
    std::vector<Row> left;
    for (auto &[key, row] : s.passed)
        left.push_back(std::move(row));
    std::sort(left.begin(), left.end(), [](auto &a, auto &b) { return a.rowid < b.rowid; });
    auto unexplained = [&](const Row &r) {
        std::string id = r.open[0].type == SQLITE_TEXT ? r.open[0].s : shown(r.open[0]);
        if (first_seq > 1 && s.closed_unopened.count(r.key)) {
            if (!pruned_by_this_build) {
                ++counts_.sessions_not_covered;
                return;
            }
            report(0, session_name(id) +
                          ": a row in the sessions table whose grant event was pruned, by a "
                          "prune that removes such rows with their grant (inserted)");
            return;
        }
        report(0, session_name(id) +
                      ": a row in the sessions table with no grant event in the chain (inserted)");
    };
    for (auto &r : left)
        unexplained(r);
    for (; s.cur;) {
        unexplained(*s.cur);
        if (auto a = s.advance(); !a) return a.error();
    }

    if (s.duplicate)
        report(0, session_name(*s.duplicate) + ": two rows in the sessions table (inserted)");

    // The host meta says wrote the journal, against the newest start that recorded its host
    // (the daemon records the hostname escaped).
    if (s.host) {
        auto &[seq, machine, host] = *s.host;
        std::string ev = "event " + std::to_string(seq) + " (daemon-start)";
        if (s.machine_id != machine)
            report(seq, "meta.machine_id is " +
                            (s.machine_id ? quote_untrusted(*s.machine_id) : "missing") +
                            " in the meta table but " + quote_untrusted(machine) + " in " + ev +
                            " (edited)");
        else if (!s.hostname || (*s.hostname != host && escape_untrusted(*s.hostname) != host))
            report(seq, "meta.hostname is " +
                            (s.hostname ? quote_untrusted(*s.hostname) : "missing") +
                            " in the meta table but " + quote_untrusted(host) + " in " + ev +
                            " (edited)");
    }

    // Policies: every stored text matches its digest and was loaded by an event in the chain at
    // its first_loaded_us (or, after retention, before the chain's first event: its load was
    // pruned); every digest a load names is stored.
    std::set<std::string> stored;
    if (s.has_policies) {
        auto st =
            s.db.prepare("SELECT digest, text, first_loaded_us FROM policies ORDER BY digest");
        if (!st) return st.error();
        for (;;) {
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) break;
            Cell digest = cell(*st, 0), text = cell(*st, 1), loaded = cell(*st, 2);
            std::string name = "policy " + shown(digest);
            if (digest.type != SQLITE_TEXT || text.type != SQLITE_TEXT ||
                sha256_hex(text.s) != digest.s) {
                report(0, name + ": its stored text does not match its digest (edited)");
                continue;
            }
            if (!stored.insert(digest.s).second) {
                report(0, name + ": two rows in the policies table (inserted)");
                continue;
            }
            ++counts_.policies_checked; // the text is the one its digest names
            auto named = s.named.find(digest.s);
            bool load_pruned = first_seq > 1 && loaded.type == SQLITE_INTEGER && s.first_at_us &&
                               loaded.i < *s.first_at_us;
            if (named == s.named.end()) {
                if (!load_pruned)
                    report(0, name + ": named by no policy load in the chain (inserted)");
                continue;
            }
            auto [seq, at] = named->second;
            if (!(loaded.type == SQLITE_INTEGER && loaded.i == at) && !load_pruned) {
                report(seq, name + ": first_loaded_us is " + shown(loaded) +
                                " in the policies table but event " + std::to_string(seq) +
                                ", its first load, is at " + std::to_string(at) + " (edited)");
            }
        }
    }
    for (auto &[digest, load] : s.named)
        if (!stored.count(digest))
            report(load.first, "policy " + quote_untrusted(digest) + ": named by event " +
                                   std::to_string(load.first) +
                                   " but its text is missing from the policies table (deleted)");

    // Checkpoints: each one a retention-prune event in the chain made, as it made it. Older
    // ones (their prune events pruned since) are those reached back from the one the chain
    // starts at: each prune removed `events` events, so the one before it ends there.
    if (s.has_checkpoints) {
        auto st =
            s.db.prepare("SELECT seq, hash, pruned_at_us, events FROM checkpoints ORDER BY seq");
        if (!st) return st.error();
        std::set<std::int64_t> seen;
        struct Older {
            std::string name;
            std::int64_t events;
        };
        std::map<std::int64_t, Older> older; // rows no prune event in the chain names
        for (;;) {
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) break;
            Cell seq = cell(*st, 0), hash = cell(*st, 1), at = cell(*st, 2), n = cell(*st, 3);
            std::string name = "checkpoint at event " + shown(seq);
            if (seq.type != SQLITE_INTEGER || hash.type != SQLITE_BLOB || hash.s.size() != 32 ||
                at.type != SQLITE_INTEGER || n.type != SQLITE_INTEGER || n.i < 1 || seq.i < n.i) {
                report(0, name + ": not a row retention writes (hash " + shown(hash) +
                              ", pruned_at_us " + shown(at) + ", events " + shown(n) +
                              ") (inserted or edited)");
                continue;
            }
            auto it = s.prunes.find(seq.i);
            if (it == s.prunes.end()) {
                older[seq.i] = {name, n.i};
                continue;
            }
            seen.insert(seq.i);
            older[seq.i] = {name, n.i}; // where the walk back starts or passes
            auto &[by, d] = it->second;
            Cell hex = hash;
            hex.type = SQLITE_TEXT;
            hex.s = hex_of(hash.s);
            for (auto [field, c] : {std::pair<const char *, const Cell *>{"hash", &hex},
                                    {"events", &n},
                                    {"pruned_at_us", &at}}) {
                auto v = d.find(field);
                if (v == d.end()) continue; // an older build's prune event does not record it
                if (!same(*c, *v)) {
                    report(by, name + ": " + field + " is " + shown(*c) +
                                   " in the checkpoints table but " + shown(*v) + " in event " +
                                   std::to_string(by) + " (edited)");
                    break;
                }
            }
        }
        // Walk back from the checkpoint the chain starts at (verify checked that a prune event
        // in the chain made it); every row not in the chain must be on that walk.
        std::set<std::int64_t> reached;
        for (std::int64_t at = first_seq - 1; at > 0;) {
            auto it = older.find(at);
            if (it == older.end()) break;
            reached.insert(at);
            at -= it->second.events;
        }
        for (auto &[at, o] : older)
            if (!seen.count(at) && !reached.count(at))
                report(0, o.name + ": no retention-prune event in the chain made it, and no "
                                   "later checkpoint follows it (inserted)");
        for (auto &[through, p] : s.prunes)
            if (!seen.count(through))
                report(p.first, "checkpoint at event " + std::to_string(through) +
                                    ": made by event " + std::to_string(p.first) +
                                    " but missing from the checkpoints table (deleted)");
    }
    return {};
}

} // namespace knod::journal
