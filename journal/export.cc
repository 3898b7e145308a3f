#include "journal/export.h"

#include "journal/compact_json.h"

#include "knod/hex.h"
#include "knod/json.h"
#include "knod/untrusted.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

namespace knod::journal {
namespace {

using Json = nlohmann::ordered_json;

// As the daemon writes detail text (knod::dump_json): compact, UTF-8, invalid bytes replaced.
std::string dump_stored(const Json &j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool valid_utf8(std::string_view s) {
    char32_t cp = 0;
    for (std::size_t i = 0; i < s.size();) {
        std::size_t n = utf8_sequence(s, i, cp);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string hex_of(std::string_view bytes) {
    return knod::to_hex(
        std::span(reinterpret_cast<const std::uint8_t *>(bytes.data()), bytes.size()));
}

std::optional<std::vector<std::string>> flows_of(const Json &v) {
    // An older daemon stored the flows as a JSON-encoded string inside the detail.
    Json decoded =
        v.is_string() ? knod::parse_json<Json>(v.get_ref<const std::string &>()) : Json();
    const Json &a = v.is_string() ? decoded : v;
    if (!a.is_array()) return std::nullopt;
    std::vector<std::string> out;
    out.reserve(a.size());
    for (auto &f : a)
        out.push_back(f.is_string() ? f.get<std::string>() : dump_stored(f));
    return out;
}

std::optional<std::string> string_member(const Json &detail, const char *name) {
    if (!detail.is_object()) return std::nullopt;
    auto it = detail.find(name);
    if (it == detail.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
}

// What the detail does not name comes from the event's session row.
void session_fallback(FlatFields &f, const EventRecord &e) {
    if (!f.netdev) f.netdev = e.session_netdev;
    if (!f.gpu) f.gpu = e.session_gpu;
    if (f.flows || !e.session_flows) return;
    f.flows = scan_compact_string_array(*e.session_flows);
    if (!f.flows) f.flows = flows_of(knod::parse_json<Json>(*e.session_flows));
}

FlatFields flat_from(const Json &detail, const EventRecord &e) {
    FlatFields f;
    f.netdev = string_member(detail, "netdev");
    f.gpu = string_member(detail, "gpu");
    if (detail.is_object())
        if (auto it = detail.find("flows"); it != detail.end()) f.flows = flows_of(*it);
    session_fallback(f, e);
    return f;
}

} // namespace

std::string rfc3339_us(std::int64_t at_us) {
    std::int64_t secs = at_us / 1000000, frac = at_us % 1000000;
    if (frac < 0) { // floor, so times before 1970 still print a positive fraction
        frac += 1000000;
        --secs;
    }
    std::time_t t = static_cast<std::time_t>(secs);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[48];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(frac));
    return buf;
}

std::string export_event_id(const std::string &journal_id, std::int64_t seq) {
    return journal_id.empty() ? std::to_string(seq) : event_id(journal_id, seq);
}

std::optional<EventId> parse_event_id(std::string_view text) {
    auto dash = text.rfind('-');
    std::string_view prefix = dash == std::string_view::npos ? "" : text.substr(0, dash);
    std::string_view digits = dash == std::string_view::npos ? text : text.substr(dash + 1);
    EventId id;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), id.seq);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || id.seq < 0)
        return std::nullopt;
    if (dash != std::string_view::npos && prefix.empty()) return std::nullopt;
    id.journal_id = std::string(prefix);
    return id;
}

FlatFields flat_fields(const EventRecord &e) {
    return flat_from(e.event.detail ? knod::parse_json<Json>(*e.event.detail) : Json(), e);
}

namespace {

// Writes one record's JSON by hand: the export runs at 100k+ events/s, and building a JSON
// object per event only to dump it again costs more than the rest of the export together.
// Output is ASCII: everything else is \u-escaped, so no terminal filter can alter a byte.
class LineWriter {
  public:
    explicit LineWriter(std::string &out) : out_(out) {}
    LineWriter &key(const char *name) {
        out_ += first_ ? "{\"" : ",\"";
        first_ = false;
        out_ += name;
        out_ += "\":";
        return *this;
    }
    void null() { out_ += "null"; }
    void integer(std::int64_t v) {
        char buf[24];
        auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
        out_.append(buf, end);
    }
    void integer(const std::optional<std::int64_t> &v) { v ? integer(*v) : null(); }
    void string(const std::string &s) {
        auto plain = [](unsigned char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; };
        out_ += '"';
        std::size_t i = 0;
        while (i < s.size() && plain(static_cast<unsigned char>(s[i])))
            ++i;
        out_.append(s, 0, i);
        if (i == s.size()) { // the common case: nothing to escape
            out_ += '"';
            return;
        }
        if (!valid_utf8(s)) { // shown with U+FFFD, as nlohmann replaces it
            out_.resize(out_.size() - i - 1);
            out_ += Json(s).dump(-1, ' ', true, Json::error_handler_t::replace);
            return;
        }
        static const char hex[] = "0123456789abcdef";
        char32_t cp = 0;
        while (i < s.size()) {
            std::size_t run = i;
            while (run < s.size() && plain(static_cast<unsigned char>(s[run])))
                ++run;
            out_.append(s, i, run - i);
            if ((i = run) == s.size()) break;
            auto c = static_cast<unsigned char>(s[i]);
            if (c == '"' || c == '\\') {
                out_ += '\\';
                out_ += static_cast<char>(c);
                ++i;
                continue;
            }
            std::size_t n = utf8_sequence(s, i, cp);
            i += n;
            auto unit = [&](std::uint32_t u) {
                out_ += "\\u";
                for (int shift = 12; shift >= 0; shift -= 4)
                    out_ += hex[(u >> shift) & 15];
            };
            if (cp > 0xffff) {
                cp -= 0x10000;
                unit(0xd800 + (cp >> 10));
                unit(0xdc00 + (cp & 0x3ff));
            } else {
                unit(cp);
            }
        }
        out_ += '"';
    }
    void opt_string(const std::optional<std::string> &v) { v ? string(*v) : null(); }
    void json(const Json &j) { out_ += j.dump(-1, ' ', true, Json::error_handler_t::replace); }
    void verbatim(std::string_view json_text) { out_ += json_text; }
    void end() { out_ += '}'; }

  private:
    std::string &out_;
    bool first_ = true;
};

bool printable_ascii(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

} // namespace

std::string export_line(const EventRecord &e, const JournalIdentity &id) {
    std::vector<std::pair<const char *, std::string>> raw;
    auto check = [&](const std::optional<std::string> &v, const char *name) {
        if (v && !valid_utf8(*v)) raw.emplace_back(name, hex_of(*v)); // the bytes the hash covers
    };
    check(e.event.kind, "kind");
    check(e.event.session_id, "session");
    check(e.event.rule, "rule");
    check(e.event.decision, "decision");
    check(e.event.reason, "reason");
    // The fast path: a detail already in the daemon's exact form is copied, not parsed and
    // dumped again (most of an export's time otherwise); see compact_json.h.
    std::optional<CompactObject> compact;
    if (e.event.detail) compact = scan_compact_object(*e.event.detail);
    Json parsed;
    bool utf8_detail = compact || !e.event.detail || valid_utf8(*e.event.detail);
    FlatFields flat;
    if (compact) {
        flat = {std::move(compact->netdev), std::move(compact->gpu), std::move(compact->flows)};
        session_fallback(flat, e);
    } else {
        if (e.event.detail && utf8_detail) parsed = knod::parse_json<Json>(*e.event.detail);
        flat = flat_from(parsed, e);
    }

    std::string out;
    out.reserve(768);
    LineWriter w(out);
    w.key("event_id").string(export_event_id(id.journal_id, e.seq));
    w.key("journal_id")
        .opt_string(id.journal_id.empty() ? std::nullopt
                                          : std::optional<std::string>(id.journal_id));
    w.key("seq").integer(e.seq);
    w.key("time").string(rfc3339_us(e.event.at_us));
    w.key("at_us").integer(e.event.at_us);
    auto nonempty = [](const std::string &v) {
        return v.empty() ? std::nullopt : std::optional<std::string>(v);
    };
    w.key("host").opt_string(nonempty(id.hostname));
    w.key("machine_id").opt_string(nonempty(id.machine_id));
    w.key("kind").string(e.event.kind);
    w.key("session").opt_string(e.event.session_id);
    w.key("uid").integer(e.event.uid);
    w.key("pid").integer(e.event.pid);
    w.key("rule").opt_string(e.event.rule);
    w.key("decision").opt_string(e.event.decision);
    w.key("reason").opt_string(e.event.reason);
    w.key("netdev").opt_string(flat.netdev);
    w.key("gpu").opt_string(flat.gpu);
    w.key("flows");
    if (flat.flows) {
        out += '[';
        for (std::size_t i = 0; i < flat.flows->size(); ++i) {
            if (i) out += ',';
            w.string((*flat.flows)[i]);
        }
        out += ']';
    } else {
        w.null();
    }
    w.key("detail");
    const auto &d = e.event.detail;
    if (!d) {
        w.null();
    } else if (compact) {
        w.verbatim(*d);
    } else if (!utf8_detail) {
        w.string(*d);
        raw.emplace_back("detail", hex_of(*d));
    } else if (parsed.is_discarded()) {
        w.string(*d);
        w.key("detail_text").string(*d);
    } else if (!parsed.is_null() && dump_stored(parsed) == *d) {
        // Dumping gives the hashed text back: the text is that JSON, already in its form.
        if (printable_ascii(*d))
            w.verbatim(*d);
        else
            w.json(parsed);
    } else {
        w.json(parsed);
        w.key("detail_text").string(*d); // dumping would not give the hashed bytes back
    }
    if (!raw.empty()) {
        w.key("raw");
        LineWriter r(out);
        for (auto &[name, hex] : raw)
            r.key(name).string(hex);
        r.end();
    }
    w.key("prev_hash").string(to_hex(e.prev_hash));
    w.key("hash").string(to_hex(e.hash));
    w.end();
    return out;
}

Result<std::int64_t> export_jsonl(JournalReader &reader, const Filter &f, const JournalIdentity &id,
                                  std::ostream &out) {
    std::int64_t n = 0;
    std::string line;
    auto done = reader.events(f, [&](const EventRecord &e) {
        line = export_line(e, id);
        line += '\n';
        out.write(line.data(), static_cast<std::streamsize>(line.size()));
        ++n;
        return static_cast<bool>(out);
    });
    if (!done) return done.error();
    if (!out)
        return make_error(Errc::io,
                          "cannot write the export (" + std::to_string(n) + " event(s) written)");
    return n;
}

namespace {

// One export record read back: the event the chain hashed, and what else the record claims.
struct Rebuilt {
    std::string event_id, journal_id, time;
    std::int64_t seq = 0;
    Event event;
    Hash prev{}, hash{};
    std::string inconsistency; // a field that disagrees with another (edited)
};

class Fields {
  public:
    explicit Fields(const Json &j) : j_(j) {}

    const Json *find(const char *name) const {
        auto it = j_.find(name);
        return it == j_.end() ? nullptr : &*it;
    }
    Result<std::int64_t> integer(const char *name) const {
        auto *v = find(name);
        if (!v || !v->is_number_integer()) return bad(name, "an integer");
        return v->get<std::int64_t>();
    }
    Result<std::optional<std::int64_t>> opt_integer(const char *name) const {
        auto *v = find(name);
        if (v && v->is_null()) return std::optional<std::int64_t>();
        auto i = integer(name);
        if (!i) return bad(name, "an integer or null");
        return std::optional<std::int64_t>(*i);
    }
    Result<std::string> string(const char *name) const {
        auto *v = find(name);
        if (!v || !v->is_string()) return bad(name, "a string");
        return v->get<std::string>();
    }
    Result<std::optional<std::string>> opt_string(const char *name) const {
        auto *v = find(name);
        if (v && v->is_null()) return std::optional<std::string>();
        auto s = string(name);
        if (!s) return bad(name, "a string or null");
        return std::optional<std::string>(*s);
    }
    Result<Hash> hash(const char *name) const {
        auto s = string(name);
        auto bytes = s ? from_hex(*s) : std::nullopt;
        if (!bytes || bytes->size() != Hash{}.size()) return bad(name, "64 hex digits");
        Hash h{};
        std::copy(bytes->begin(), bytes->end(), h.begin());
        return h;
    }
    // The exact bytes of a hashed text field that `raw` carries, checked against the field.
    Result<std::optional<std::string>> raw(const char *name, std::string &inconsistency) const {
        auto *raws = find("raw");
        if (!raws) return std::optional<std::string>();
        if (!raws->is_object()) return bad("raw", "an object");
        auto it = raws->find(name);
        if (it == raws->end()) return std::optional<std::string>();
        auto bytes = it->is_string() ? from_hex(it->get<std::string>()) : std::nullopt;
        if (!bytes) return bad((std::string("raw.") + name).c_str(), "hex digits");
        std::string text(bytes->begin(), bytes->end());
        auto *shown = find(name);
        if (!shown || dump_stored(Json(text)) != dump_stored(*shown))
            inconsistency = std::string("its ") + name + " differs from raw." + name + " (edited)";
        return std::optional<std::string>(std::move(text));
    }
    Result<std::optional<std::string>> hashed_text(const char *name,
                                                   std::string &inconsistency) const {
        auto r = raw(name, inconsistency);
        if (!r || *r) return r;
        return opt_string(name);
    }

  private:
    static Error bad(const std::string &name, const char *want) {
        return make_error(Errc::corrupt, "\"" + name + "\" is not " + want);
    }
    const Json &j_;
};

// Equality as the chain sees it: the same types throughout, an integer only equal to an
// integer of the same value. nlohmann's == compares numbers as doubles, so 9007199254740992.0
// would equal the hashed 9007199254740993 (and 4096.0 the hashed 4096): a value an importer
// reads differently from the one the hash vouches for.
bool same_json(const Json &a, const Json &b) {
    if (a.is_number_integer() || b.is_number_integer()) {
        if (!a.is_number_integer() || !b.is_number_integer()) return false;
        if (a.is_number_unsigned() == b.is_number_unsigned()) return a == b;
        const Json &u = a.is_number_unsigned() ? a : b, &s = a.is_number_unsigned() ? b : a;
        auto sv = s.get<std::int64_t>();
        return sv >= 0 && static_cast<std::uint64_t>(sv) == u.get<std::uint64_t>();
    }
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
        if (a.size() != b.size()) return false;
        for (std::size_t i = 0; i < a.size(); ++i)
            if (!same_json(a[i], b[i])) return false;
        return true;
    }
    if (a.is_object()) {
        if (a.size() != b.size()) return false;
        for (auto &[key, value] : a.items()) {
            auto it = b.find(key);
            if (it == b.end() || !same_json(value, *it)) return false;
        }
        return true;
    }
    return a == b;
}

Result<std::optional<std::string>> detail_text_of(const Fields &f, std::string &inconsistency) {
    auto raw = f.raw("detail", inconsistency);
    if (!raw || *raw) return raw;
    const Json *detail = f.find("detail");
    if (!detail) return make_error(Errc::corrupt, "\"detail\" is missing");
    if (f.find("detail_text")) {
        auto text = f.string("detail_text");
        if (!text) return text.error();
        auto parsed = knod::parse_json<Json>(*text);
        bool agrees =
            parsed.is_discarded() ? same_json(*detail, Json(*text)) : same_json(*detail, parsed);
        if (!agrees) inconsistency = "its detail differs from its detail_text (edited)";
        return std::optional<std::string>(*text);
    }
    if (detail->is_null()) return std::optional<std::string>();
    return std::optional<std::string>(dump_stored(*detail));
}

Result<Rebuilt> rebuild(const Json &j) {
    Fields f(j);
    Rebuilt r;
    auto err = [](const Error &e) { return e; };
    auto event_id = f.string("event_id");
    if (!event_id) return err(event_id.error());
    r.event_id = *event_id;
    auto journal_id = f.opt_string("journal_id");
    if (!journal_id) return err(journal_id.error());
    r.journal_id = journal_id->value_or("");
    auto seq = f.integer("seq");
    if (!seq) return err(seq.error());
    r.seq = *seq;
    auto time = f.string("time");
    if (!time) return err(time.error());
    r.time = *time;
    auto at = f.integer("at_us");
    if (!at) return err(at.error());
    r.event.at_us = *at;
    auto kind = f.hashed_text("kind", r.inconsistency);
    if (!kind) return err(kind.error());
    if (!*kind) return make_error(Errc::corrupt, "\"kind\" is not a string");
    r.event.kind = **kind;
    struct Text {
        const char *name;
        std::optional<std::string> *out;
    };
    for (auto [name, out] :
         {Text{"session", &r.event.session_id}, Text{"rule", &r.event.rule},
          Text{"decision", &r.event.decision}, Text{"reason", &r.event.reason}}) {
        auto v = f.hashed_text(name, r.inconsistency);
        if (!v) return err(v.error());
        *out = std::move(*v);
    }
    auto uid = f.opt_integer("uid");
    if (!uid) return err(uid.error());
    r.event.uid = *uid;
    auto pid = f.opt_integer("pid");
    if (!pid) return err(pid.error());
    r.event.pid = *pid;
    auto detail = detail_text_of(f, r.inconsistency);
    if (!detail) return err(detail.error());
    r.event.detail = std::move(*detail);
    auto prev = f.hash("prev_hash");
    if (!prev) return err(prev.error());
    r.prev = *prev;
    auto hash = f.hash("hash");
    if (!hash) return err(hash.error());
    r.hash = *hash;
    return r;
}

// The flat fields an event's own detail vouches for must be what the record shows.
std::string flat_mismatch(const Json &record, const Rebuilt &r) {
    if (!r.event.detail) return {};
    auto detail = knod::parse_json<Json>(*r.event.detail);
    if (!detail.is_object()) return {};
    for (const char *name : {"netdev", "gpu"}) {
        auto want = string_member(detail, name);
        auto it = record.find(name);
        if (want && (it == record.end() || *it != Json(*want)))
            return std::string("its ") + name + " differs from its detail (edited)";
    }
    if (auto it = detail.find("flows"); it != detail.end()) {
        auto want = flows_of(*it);
        auto shown = record.find("flows");
        if (want && (shown == record.end() || *shown != Json(*want)))
            return "its flows differ from its detail (edited)";
    }
    // daemon-start names its journal inside the chain: the record's journal id must be it.
    if (r.event.kind == kind::daemon_start)
        if (auto id = string_member(detail, "journal_id");
            id && !id->empty() && *id != r.journal_id)
            return "its journal_id differs from the one its daemon-start event records (" + *id +
                   ")";
    return {};
}

// The top-level fields an export record may have (export_line writes no others).
std::optional<std::string> unknown_field(const Json &record) {
    static const std::set<std::string, std::less<>> known = {
        "event_id",    "journal_id", "seq",       "time", "at_us", "host",
        "machine_id",  "kind",       "session",   "uid",  "pid",   "rule",
        "decision",    "reason",     "netdev",    "gpu",  "flows", "detail",
        "detail_text", "raw",        "prev_hash", "hash"};
    for (auto &[key, value] : record.items())
        if (!known.contains(key)) return key;
    return std::nullopt;
}

// A session's later lines (its session-ended) show the netdev, GPU and flows of its sessions
// row, which no hash covers. The grant's detail records that row ("session", hashed), so when
// the grant line is in the file the later lines must show what it recorded.
class GrantValues {
  public:
    // Records a grant line's session values, or compares a later line of the same session.
    std::string mismatch(const Json &record, const Rebuilt &r) {
        if (!r.event.session_id) return {};
        auto detail = r.event.detail ? knod::parse_json<Json>(*r.event.detail) : Json();
        if (r.event.kind == kind::granted) {
            auto session = detail.is_object() ? detail.find("session") : detail.end();
            if (session == detail.end() || !session->is_object()) return {};
            Flat row; // as the sessions row holds them, and as an export shows them
            for (std::size_t i = 0; i < row.size(); ++i) {
                auto it = session->find(names[i]);
                if (it == session->end()) continue;
                if (i == flows_index) {
                    if (auto flows = flows_of(*it)) row[i] = dump_stored(Json(*flows));
                } else if (it->is_string()) {
                    row[i] = dump_stored(*it);
                }
            }
            seen_[*r.event.session_id] = std::move(row);
            return {};
        }
        auto it = seen_.find(*r.event.session_id);
        if (it == seen_.end()) return {};
        for (std::size_t i = 0; i < it->second.size(); ++i) {
            // A field the line's own detail names was checked against it (flat_mismatch).
            if (!it->second[i] || (detail.is_object() && detail.contains(names[i]))) continue;
            auto shown = record.find(names[i]);
            if (shown == record.end() || dump_stored(*shown) != *it->second[i])
                return std::string("its ") + names[i] +
                       " differs from the session its grant line records (edited)";
        }
        return {};
    }

  private:
    using Flat = std::array<std::optional<std::string>, 3>;
    static constexpr const char *names[] = {"netdev", "gpu", "flows"};
    static constexpr std::size_t flows_index = 2;
    std::map<std::string, Flat> seen_;
};

// std::getline, but a line longer than `max` stops the read instead of growing without end.
enum class LineRead { line, end, too_long };
LineRead read_line(std::istream &in, std::string &line, std::size_t max) {
    line.clear();
    std::istream::sentry ok(in, true);
    if (!ok) return LineRead::end;
    std::streambuf *buf = in.rdbuf();
    for (;;) {
        auto c = buf->sbumpc();
        if (std::char_traits<char>::eq_int_type(c, std::char_traits<char>::eof())) {
            in.setstate(std::ios::eofbit);
            return line.empty() ? LineRead::end : LineRead::line;
        }
        if (c == '\n') return LineRead::line;
        if (line.size() == max) return LineRead::too_long;
        line += std::char_traits<char>::to_char_type(c);
    }
}

std::string range(std::int64_t from, std::int64_t to) {
    return from == to ? "event " + std::to_string(from)
                      : "events " + std::to_string(from) + "-" + std::to_string(to);
}

} // namespace

Result<ExportCheck> verify_export(std::istream &in, bool allow_gaps) {
    ExportCheck c;
    std::string text;
    std::int64_t line_no = 0, prev_line = 0, prev_seq = 0;
    Hash prev_hash{};
    std::string prev_id;
    GrantValues grants;
    auto fail = [&](std::int64_t line, const std::string &id, std::string why) {
        c.ok = false;
        c.bad_line = line;
        c.bad_event_id = id;
        c.problem = std::move(why);
        return c;
    };
    for (;;) {
        auto got = read_line(in, text, max_export_line_bytes);
        if (got == LineRead::end) break;
        ++line_no;
        if (got == LineRead::too_long)
            return make_error(Errc::corrupt, "line " + std::to_string(line_no) + ": longer than " +
                                                 std::to_string(max_export_line_bytes) +
                                                 " bytes (not a knod-policy audit export record)");
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
        // Before any parse: ordered_json inserts each key by a linear search (N^2 for N keys).
        if (auto member = json_object_over_keys(text))
            return make_error(
                Errc::corrupt,
                "line " + std::to_string(line_no) + ": " +
                    (member->empty() ? std::string("the record") : quote_untrusted(*member)) +
                    " holds an object of more than " + std::to_string(max_json_object_keys) +
                    " keys (an impossible value: not read)");
        bool duplicate = false;
        auto j = knod::parse_json<Json>(text, {.duplicate_key = &duplicate});
        if (!j.is_object())
            return make_error(
                Errc::corrupt,
                "line " + std::to_string(line_no) + ": not a JSON object" +
                    (json_depth_within(text)
                         ? ""
                         : " (nested deeper than " + std::to_string(max_json_depth) + ")"));
        if (auto unknown = unknown_field(j))
            return make_error(Errc::corrupt, "line " + std::to_string(line_no) +
                                                 ": unknown field " + quote_untrusted(*unknown) +
                                                 " (not a knod-policy audit export record)");
        auto r = rebuild(j);
        if (!r)
            return make_error(Errc::corrupt, "line " + std::to_string(line_no) + ": " +
                                                 r.error().message +
                                                 " (not a knod-policy audit export record)");
        const std::string &id = r->event_id;
        if (id != export_event_id(r->journal_id, r->seq))
            return fail(line_no, id,
                        "its event_id does not match its journal_id and seq " +
                            std::to_string(r->seq) + " (edited)");
        if (r->time != rfc3339_us(r->event.at_us))
            return fail(line_no, id, "its time does not match its at_us (edited)");
        if (!r->inconsistency.empty()) return fail(line_no, id, r->inconsistency);
        if (chain_hash(r->prev, r->seq, r->event) != r->hash)
            return fail(line_no, id, "it does not match its hash (edited)");
        // Only after its hash matched: a repeated key may be how a line was edited, so say so.
        if (duplicate)
            return fail(line_no, id,
                        "it repeats a key in an object (edited: a reader may see "
                        "either value)");
        if (auto m = flat_mismatch(j, *r); !m.empty()) return fail(line_no, id, m);
        if (auto m = grants.mismatch(j, *r); !m.empty()) return fail(line_no, id, m);
        if (r->seq == 1 && r->prev != Hash{})
            return fail(line_no, id,
                        "event 1 does not start the chain (its prev_hash is not zero)");
        if (c.events == 0) {
            c.journal_id = r->journal_id;
            c.first_seq = r->seq;
            c.first_prev_hash = to_hex(r->prev);
        } else {
            if (r->journal_id != c.journal_id)
                return fail(line_no, id,
                            "it is from journal " + quote_untrusted(r->journal_id) +
                                ", the export started with " + quote_untrusted(c.journal_id) +
                                " (verify each journal's export on its own)");
            if (r->seq <= prev_seq)
                return fail(line_no, id,
                            "event " + std::to_string(r->seq) + " follows event " +
                                std::to_string(prev_seq) + " on line " + std::to_string(prev_line) +
                                " (reordered or repeated)");
            if (r->seq > prev_seq + 1) {
                c.gaps.push_back(range(prev_seq + 1, r->seq - 1) + " (between lines " +
                                 std::to_string(prev_line) + " and " + std::to_string(line_no) +
                                 ")");
                if (c.bad_line == 0) {
                    c.bad_line = line_no;
                    c.bad_event_id = id;
                }
            } else if (r->prev != prev_hash) {
                return fail(line_no, id,
                            "it does not chain to line " + std::to_string(prev_line) + " (" +
                                prev_id + "): its prev_hash is not that event's hash (replaced)");
            }
        }
        ++c.events;
        c.last_seq = r->seq;
        c.head_hash = to_hex(r->hash);
        prev_seq = r->seq;
        prev_hash = r->hash;
        prev_line = line_no;
        prev_id = id;
    }
    if (in.bad()) return make_error(Errc::io, "read error after line " + std::to_string(line_no));
    // An empty file proves nothing: a truncated or wrong file must not read as "ok".
    if (c.events == 0) return make_error(Errc::corrupt, "no events in the export");
    if (!c.gaps.empty() && !allow_gaps) {
        c.ok = false;
        c.problem = std::to_string(c.gaps.size()) + " gap(s): " + c.gaps.front() +
                    (c.gaps.size() > 1 ? " and more" : "") +
                    " missing (a deleted line, or a filtered export: --allow-gaps accepts one)";
    } else if (!c.gaps.empty()) {
        c.bad_line = 0;
        c.bad_event_id.clear();
    }
    return c;
}

} // namespace knod::journal
