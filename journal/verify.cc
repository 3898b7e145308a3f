#include "journal/verify.h"

#include "journal/migrations.h"
#include "journal/reader.h"
#include "journal/records.h"
#include "journal/retention.h"
#include "journal/sqlite.h"
#include "journal/table_check.h"

#include "knod/json.h"
#include "knod/regular_file.h"
#include "knod/untrusted.h"
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <set>

namespace knod::journal {
namespace {

bool to_hash(const std::string &blob, Hash &out) {
    if (blob.size() != out.size()) return false;
    std::copy(blob.begin(), blob.end(), out.begin());
    return true;
}

struct Anchor {
    std::int64_t seq = 0;
    std::string hash;
    std::optional<SnapshotMark> snapshot;
    // The file's mtime, in 128 bits (a touched file's time may be anything): when the daemon
    // wrote it (kept by cp -p) or when it was copied, after its event either way.
    wide_int modified_us = 0;
};

// The anchor file as the daemon writes it: {"seq": N, "hash": "<64 hex digits>"}, and for a
// published snapshot "snapshot": {"at_us": N, "live": "<path>"} (journal/snapshot.h). Absent
// is nullopt; anything else that is not exactly that is an error naming the file.
Result<std::optional<Anchor>> read_anchor(const std::string &path) {
    auto bad = [&](const std::string &why) {
        return make_error(Errc::corrupt, "the anchor file " + path + " is malformed: " + why);
    };
    // The daemon writes ~100 bytes; anything much longer is not its anchor (and is never
    // parsed whole, nor nested deep enough to exhaust the stack). A FIFO or device is refused.
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return std::optional<Anchor>();
        st = {}; // read_regular_file names the error
    }
    auto read = read_regular_file(path, 4096);
    if (!read) return make_error(Errc::io, "cannot read the anchor file: " + read.error().message);
    std::string &text = *read;
    if (text.size() > 4096) return bad("longer than 4 KiB");
    auto j = knod::parse_json(text);
    if (!j.is_object()) return bad("not a JSON object");
    auto seq = j.find("seq");
    auto hash = j.find("hash");
    if (seq == j.end() || !seq->is_number_integer() || seq->get<std::int64_t>() < 1)
        return bad("\"seq\" is not a positive integer");
    if (hash == j.end() || !hash->is_string()) return bad("\"hash\" is not a string");
    auto h = hash->get<std::string>();
    if (h.size() != 64 || !std::all_of(h.begin(), h.end(),
                                       [](char c) { return std::isxdigit(c) && !std::isupper(c); }))
        return bad("\"hash\" is not 64 lowercase hex digits");
    Anchor out{seq->get<std::int64_t>(), h, std::nullopt,
               static_cast<wide_int>(st.st_mtim.tv_sec) * 1000000 + st.st_mtim.tv_nsec / 1000};
    if (auto mark = j.find("snapshot"); mark != j.end()) {
        if (!mark->is_object()) return bad("\"snapshot\" is not an object");
        auto at = mark->find("at_us");
        auto live = mark->find("live");
        if (at == mark->end() || !at->is_number_integer() || at->get<std::int64_t>() < 0)
            return bad("\"snapshot\".\"at_us\" is not a time in microseconds");
        if (live == mark->end() || !live->is_string())
            return bad("\"snapshot\".\"live\" is not a path");
        out.snapshot = SnapshotMark{at->get<std::int64_t>(), live->get<std::string>()};
    }
    return std::optional<Anchor>(std::move(out));
}

// Checkpoints left by retention: the last pruned event's seq -> its hash. A row of other types
// (a text hash the same 32 bytes, a text seq) is not one the journal made: table_check.cc says so.
Result<std::map<std::int64_t, Hash>> read_checkpoints(Database &db) {
    std::map<std::int64_t, Hash> out;
    auto has = db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'checkpoints'");
    if (!has) return has.error();
    if (*has == 0) return out;
    auto st = db.prepare("SELECT seq, hash FROM checkpoints");
    if (!st) return st.error();
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return out;
        if (st->type(0) != SQLITE_INTEGER || st->type(1) != SQLITE_BLOB) continue;
        Hash h{};
        if (to_hash(st->blob(1), h)) out[st->int64(0)] = h;
    }
}

// The storage type of each events column as the writer binds it. SQLite keeps whatever type
// an UPDATE gives a value, and reading it as text or integer coerces: a BLOB 'request-denied'
// hashes like the text but is not what `audit` filters on, an at_us '17... UTC' reads as its
// number. Checked on the row the walk reads (no second pass).
struct ColumnType {
    const char *name;
    int type;
    bool nullable;
};
constexpr std::array<ColumnType, 12> event_columns = {{{"seq", SQLITE_INTEGER, false},
                                                       {"at_us", SQLITE_INTEGER, false},
                                                       {"kind", SQLITE_TEXT, false},
                                                       {"session_id", SQLITE_TEXT, true},
                                                       {"uid", SQLITE_INTEGER, true},
                                                       {"pid", SQLITE_INTEGER, true},
                                                       {"rule", SQLITE_TEXT, true},
                                                       {"decision", SQLITE_TEXT, true},
                                                       {"reason", SQLITE_TEXT, true},
                                                       {"detail", SQLITE_TEXT, true},
                                                       {"prev_hash", SQLITE_BLOB, false},
                                                       {"hash", SQLITE_BLOB, false}}};

const char *type_name(int type) {
    switch (type) {
    case SQLITE_INTEGER:
        return "integer";
    case SQLITE_FLOAT:
        return "real";
    case SQLITE_TEXT:
        return "text";
    case SQLITE_BLOB:
        return "blob";
    default:
        return "null";
    }
}

// The first column of the current row whose storage type is not the writer's; "" when none.
std::string mistyped_column(const Statement &st) {
    for (std::size_t i = 0; i < event_columns.size(); ++i) {
        int t = st.type(static_cast<int>(i));
        const ColumnType &c = event_columns[i];
        if (t != c.type && !(c.nullable && t == SQLITE_NULL))
            return std::string(c.name) + " is stored as " + type_name(t) +
                   " where the journal writes " + type_name(c.type) +
                   (c.nullable ? " or null" : "");
    }
    return {};
}

// The journal's schema (every table, index, trigger and view in sqlite_master) as the
// migrations up to its version make it. A table rebuilt another way (no primary key, so a
// second row with a session's id; a column type changed) reads differently from what the
// chain vouches for, however its rows look; an index the audit queries use, defined another
// way (a partial or expression index whose stored text was rewritten) answers them wrongly; a
// trigger added would run inside the daemon's next write. Only SQLite's own statistics tables
// (ANALYZE) may be added, and an index or trigger may be missing. The first object that
// differs, named; nullopt when all are as made.
Result<std::optional<std::string>> changed_schema(Database &db) {
    auto version = db.scalar("PRAGMA user_version");
    if (!version) return version.error();
    auto made = Database::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    if (!made) return made.error();
    for (auto &m : migrations())
        if (m.version <= *version)
            if (auto r = made->exec(std::string(m.sql)); !r)
                return std::move(r).error().context("migration " + std::string(m.name));
    using Objects = std::map<std::pair<std::string, std::string>, std::string>; // type, name
    auto objects = [](Database &d) -> Result<Objects> {
        Objects out;
        auto st = d.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name "
                            "NOT LIKE 'sqlite\\_stat%' ESCAPE '\\'");
        if (!st) return st.error();
        for (;;) {
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) return out;
            out[{st->text(0), st->text(1)}] = st->text(2) + " " + normalized_sql(st->text(3));
        }
    };
    auto want = objects(*made);
    if (!want) return want.error();
    auto have = objects(db);
    if (!have) return have.error();
    std::string v = std::to_string(*version);
    // The name is the file's: one holding a newline could forge a line after "FAILED".
    auto named = [](const std::pair<std::string, std::string> &o) {
        return "the " + escape_untrusted(o.second, Escape::value, 256) + " " +
               escape_untrusted(o.first, Escape::value, 64);
    };
    // Tables first: a rebuilt table is the finding, not the indexes it took with it.
    for (bool tables : {true, false}) {
        for (auto &[object, definition] : *want) {
            if ((object.first == "table") != tables) continue;
            auto h = have->find(object);
            // A dropped index or append-only trigger changes no answer (the chain, not the
            // trigger, is the guarantee); a dropped table loses rows.
            if (h == have->end() && tables)
                return std::optional<std::string>(named(object) + " is missing (schema version " +
                                                  v + " makes it) (deleted)");
            if (h != have->end() && h->second != definition)
                return std::optional<std::string>(named(object) +
                                                  " is not defined as schema version " + v +
                                                  " defines it (rebuilt or altered: tampered)");
        }
        for (auto &[object, definition] : *have)
            if ((object.first == "table") == tables && !want->count(object))
                return std::optional<std::string>(
                    named(object) + " is not part of schema version " + v + " (added: tampered)");
    }
    return std::optional<std::string>();
}

// SQLite's own check that every index holds exactly what its table and its definition give
// (and that the file's structure is sound): an index built from another definition, whose
// stored text was then rewritten to the expected one, passes changed_schema() but not this.
// Runs on a connection of its own, beside the chain walk.
Result<std::optional<std::string>> index_problem(Database db) {
    auto st = db.prepare("PRAGMA integrity_check(10)");
    if (!st) return st.error();
    std::string problems;
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) break;
        std::string line = st->text(0);
        if (line == "ok") return std::optional<std::string>();
        problems += (problems.empty() ? "" : "; ") + escape_untrusted(line);
    }
    return std::optional<std::string>("SQLite's integrity check fails (an index or the file was "
                                      "altered: tampered): " +
                                      problems);
}

} // namespace

Result<VerifyReport> verify_chain(const std::string &path, const VerifyProgress &progress,
                                  const std::string &anchor_file, AnchorUse use,
                                  std::optional<std::int64_t> retention_us) {
    auto journal = ReadOnlyJournal::open(path);
    if (!journal) return journal.error();
    return verify_chain(*journal, path, progress, anchor_file, use, retention_us);
}

Result<VerifyReport> verify_chain(ReadOnlyJournal &opened, const std::string &path,
                                  const VerifyProgress &progress, const std::string &anchor_file,
                                  AnchorUse use, std::optional<std::int64_t> retention_us) {
    ReadOnlyJournal *journal = &opened;
    Database *db = &journal->db();
    // One read transaction, so a live daemon appending meanwhile does not move the ground.
    if (sqlite3_get_autocommit(db->get()))
        if (auto r = db->exec("BEGIN"); !r) return std::move(r).error().context(path);
    // The schema first: no query reads a table before its definition is known to be the
    // journal's own (a view named events may not end).
    auto changed = changed_schema(*db);
    if (!changed) return std::move(changed).error().context(path);
    auto total = db->scalar("SELECT count(*) FROM events");
    if (!total) return std::move(total).error().context(path + ": not a knod journal");
    auto second = journal->another_connection();
    if (!second) return std::move(second).error().context(path);
    // Beside the walk, on the second core: about half the walk's time on its own. Declared after
    // `journal`, so it is waited for before the journal (and any private copy) goes.
    auto indexes = std::async(std::launch::async, index_problem, std::move(*second));
    if (*changed) {
        // Not walked: what a changed table holds is not what the chain vouches for.
        VerifyReport report;
        report.total_events = *total;
        report.ok = report.chain_intact = false;
        report.problem = **changed;
        return report;
    }
    auto checkpoints = read_checkpoints(*db);
    if (!checkpoints) return checkpoints.error();
    auto st = db->prepare("SELECT seq, at_us, kind, session_id, uid, pid, rule, decision, reason, "
                          "detail, prev_hash, hash FROM events ORDER BY seq");
    if (!st) return st.error();
    auto version = db->scalar("PRAGMA user_version");
    if (!version) return std::move(version).error().context(path);
    auto tables = TableCheck::open(*db, *version);
    if (!tables) return std::move(tables).error().context(path);

    std::string anchor_path_used = anchor_file.empty() ? anchor_path(path) : anchor_file;
    std::optional<Anchor> anchor;
    if (use != AnchorUse::ignore) {
        auto read = read_anchor(anchor_path_used);
        if (!read) return read.error();
        if (!*read && !anchor_file.empty())
            return make_error(Errc::not_found, "no anchor file " + anchor_file);
        anchor = *read;
    }

    VerifyReport report;
    report.total_events = *total;
    if (anchor) report.snapshot_mark = anchor->snapshot;
    Hash prev{};
    std::int64_t expected = 1;
    std::map<std::int64_t, PruneRecord> prunes; // by checkpoint: those the chain vouches for
    std::int64_t start_with_retention = 0;      // the last daemon-start, if it records it (0: not)
    std::optional<std::int64_t> checkpoint_used;
    std::string anchor_seen_hash;
    auto fail = [&](std::int64_t seq, std::string why) {
        report.ok = false;
        report.first_bad_seq = seq;
        report.problem = std::move(why);
    };
    bool first_row = true;
    for (;;) {
        auto row = st->step();
        if (!row) return std::move(row).error().context(path);
        if (!*row) break;
        std::int64_t seq = st->int64(0);
        // Before any read: reading converts the value the statement holds.
        std::string mistyped = mistyped_column(*st);
        Event e = event_from_row(*st);
        if (first_row) {
            first_row = false;
            report.first_seq = seq;
            if (seq > 1) {
                // Retention removed the oldest events: a checkpoint must anchor the rest.
                auto cp = checkpoints->find(seq - 1);
                if (cp == checkpoints->end()) {
                    fail(seq,
                         "events 1-" + std::to_string(seq - 1) +
                             " are missing (deleted) and no retention checkpoint anchors the rest");
                    break;
                }
                prev = cp->second;
                expected = seq;
                checkpoint_used = seq - 1;
            }
        }
        Hash stored_prev{}, stored{};
        if (seq != expected) {
            fail(seq, seq > expected
                          ? "event " + std::to_string(seq) + " follows event " +
                                std::to_string(expected - 1) + ": event(s) " +
                                std::to_string(expected) +
                                (seq - 1 > expected ? "-" + std::to_string(seq - 1) : "") +
                                " are missing (deleted)"
                          : "event " + std::to_string(seq) + " is out of sequence (inserted)");
            break;
        }
        if (!mistyped.empty()) {
            fail(seq, "event " + std::to_string(seq) + ": " + mistyped + " (edited)");
            break;
        }
        if (!to_hash(st->blob(10), stored_prev) || !to_hash(st->blob(11), stored)) {
            fail(seq, "event " + std::to_string(seq) + " has a malformed hash");
            break;
        }
        if (stored_prev != prev) {
            fail(seq,
                 "event " + std::to_string(seq) +
                     " does not chain to the event before it (inserted, deleted or reordered)");
            break;
        }
        if (chain_hash(prev, seq, e) != stored) {
            fail(seq, "event " + std::to_string(seq) + " does not match its hash (edited)");
            break;
        }
        // A chain that holds, made by whoever rewrote it whole: its values are still checked
        // before anything computes with them (exit 2, the event and field named).
        if (auto c = check_event_row(*st); !c) return std::move(c).error().context(path);
        if (e.kind == kind::daemon_start) {
            auto d = e.detail ? knod::parse_json(*e.detail) : nlohmann::json();
            start_with_retention = d.is_object() && d.contains("retention") ? seq : 0;
        }
        if (e.kind == kind::prune) {
            auto p = read_prune(seq, e.detail ? knod::parse_json(*e.detail) : nlohmann::json());
            if (!p) {
                fail(seq, p.error().message);
                break;
            }
            // A daemon that records its retention at start records it in every prune: one
            // without it after such a start poses as an older build's, to escape the check.
            if (!p->records_retention && start_with_retention) {
                fail(seq, "event " + std::to_string(seq) +
                              " (retention-prune) records no retention setting, though the "
                              "daemon started at event " +
                              std::to_string(start_with_retention) +
                              " records its settings (malformed)");
                break;
            }
            prunes.emplace(p->pruned_through, *p);
        }
        if (anchor && seq == anchor->seq) anchor_seen_hash = to_hex(stored);
        if (auto t = (*tables)->event(seq, e); !t) return std::move(t).error().context(path);
        prev = stored;
        ++expected;
        ++report.events_checked;
        if (progress && report.events_checked % 65536 == 0)
            progress(report.events_checked, report.total_events);
    }
    if (progress) progress(report.events_checked, report.total_events);
    report.head_hash = to_hex(prev);
    if (report.ok && checkpoint_used && !prunes.count(*checkpoint_used))
        fail(report.first_seq,
             "the checkpoint at event " + std::to_string(*checkpoint_used) +
                 " was not made by a retention-prune event in the chain (forged)");
    // Each prune against the retention it records, and the auditor's --retention.
    for (auto &[through, p] : prunes) {
        if (!report.ok) break;
        if (auto problem = prune_problem(p, retention_us)) fail(p.seq, *problem);
    }
    if (report.ok && anchor) {
        std::int64_t last = expected - 1;
        report.anchor_seq = anchor->seq;
        if (anchor->seq > last) {
            fail(last + 1, "the journal ends at event " + std::to_string(last) +
                               " but its anchor (" + anchor_path_used + ") records event " +
                               std::to_string(anchor->seq) + ": the tail was removed (truncated)");
        } else if (anchor->seq >= report.first_seq && anchor_seen_hash != anchor->hash) {
            fail(anchor->seq, "event " + std::to_string(anchor->seq) +
                                  " differs from the anchor kept outside the database (rewritten)");
        } else if (anchor->seq >= report.first_seq) {
            report.anchor_checked = true;
        } else if (auto cp = checkpoints->find(anchor->seq);
                   cp != checkpoints->end() && to_hex(cp->second) != anchor->hash) {
            // Pruned through exactly the anchor's event: the checkpoint must be that event.
            fail(anchor->seq, "the retention checkpoint at event " + std::to_string(anchor->seq) +
                                  " differs from the anchor (" + anchor_path_used +
                                  ") kept outside the database: the history up to it was "
                                  "rewritten and the checkpoint invented (forged)");
        } else if (use != AnchorUse::allow_pruned && retention_us) {
            // Accepted once the anchor file (its mtime) is AGE old by this clock: the prune's
            // own times are whoever wrote the chain's word.
            std::int64_t now = now_us();
            wide_int at = anchor->modified_us;
            std::string head = "the anchor (" + anchor_path_used + ") records event " +
                               std::to_string(anchor->seq) + ", which is no longer in the journal";
            if (prunes.lower_bound(anchor->seq) == prunes.end())
                fail(anchor->seq, head +
                                      ", and no retention-prune in the chain removed it: it "
                                      "cannot be checked against --retention " +
                                      age_text(*retention_us));
            else if (at + *retention_us > now)
                fail(anchor->seq,
                     head + "; the anchor file is " +
                         age_text(static_cast<std::int64_t>(
                             std::clamp<wide_int>(now - at, INT64_MIN, INT64_MAX))) +
                         " old (its mtime), younger than --retention " + age_text(*retention_us) +
                         ": a retention that keeps that long cannot have pruned its event yet (a "
                         "wipe and rewrite; keep the anchor's time when copying it off the host: "
                         "cp -p, rsync -t)");
            else
                report.anchor_pruned = report.anchor_pruned_by_retention = true;
        } else if (use != AnchorUse::allow_pruned) {
            fail(anchor->seq,
                 "the anchor (" + anchor_path_used + ") records event " +
                     std::to_string(anchor->seq) +
                     ", which is no longer in the journal (its first event is " +
                     std::to_string(report.first_seq) +
                     "): it cannot be compared, and a wipe and rewrite of all history looks the "
                     "same, even on a checkpoint that holds its hash (heads are public) (pass "
                     "--allow-pruned-anchor or --retention AGE if a prune since the anchor was "
                     "copied is expected)");
        } else {
            report.anchor_pruned = true;
        }
    } else if (report.ok && use == AnchorUse::require) {
        // The daemon writes the anchor after every commit that adds events; without it a
        // truncated tail looks like a whole chain. A copy taken without it needs --no-anchor.
        fail(expected, "no anchor file " + anchor_path_used +
                           " beside the journal: a truncated tail could not be found (deleted "
                           "anchor?); copy the anchor with the journal, name it with --anchor, "
                           "or check the chain alone with --no-anchor");
    }
    for (auto &[through, p] : prunes)
        report.prunes.push_back(p);
    report.chain_intact = report.ok;
    if (report.ok) {
        bool by_this_build = false;
        if (checkpoint_used)
            if (auto p = prunes.find(*checkpoint_used); p != prunes.end())
                by_this_build = p->second.records_retention;
        if (auto t = (*tables)->finish(report.first_seq, by_this_build); !t)
            return std::move(t).error().context(path);
        if (auto &p = (*tables)->problem()) fail(p->seq, p->what);
        auto &n = (*tables)->counts();
        report.sessions_checked = n.sessions_checked;
        report.sessions_not_covered = n.sessions_not_covered;
        report.policies_checked = n.policies_checked;
    }
    auto index = indexes.get();
    if (!index) return std::move(index).error().context(path);
    if (report.ok && *index) {
        report.ok = false;
        report.problem = **index;
    }
    return report;
}

} // namespace knod::journal
