#include "journal/reader.h"

#include "journal/snapshot.h"

#include "journal/migrations.h"
#include "knod/json.h"
#include "knod/regular_file.h"
#include "knod/untrusted.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

namespace knod::journal {
namespace {

// Builds "WHERE a AND b ..." with positional parameters, bound in order.
class Where {
  public:
    void add(const std::string &clause, std::optional<std::string> text) {
        if (!text) return;
        clauses_.push_back(clause);
        params_.push_back(*text);
    }
    void add(const std::string &clause, std::optional<std::int64_t> v) {
        if (!v) return;
        clauses_.push_back(clause);
        params_.push_back(*v);
    }
    std::string sql() const {
        std::string out;
        for (auto &c : clauses_)
            out += (out.empty() ? " WHERE " : " AND ") + c;
        return out;
    }
    void bind(Statement &st) const {
        int i = 1;
        for (auto &p : params_) {
            if (auto *s = std::get_if<std::string>(&p))
                st.bind(i++, *s);
            else
                st.bind(i++, std::get<std::int64_t>(p));
        }
    }

  private:
    std::vector<std::string> clauses_;
    std::vector<std::variant<std::string, std::int64_t>> params_;
};

// A value the journal's writer could never have stored, named by its row and field.
Error impossible(const std::string &row, const std::string &field, const std::string &why) {
    return make_error(Errc::invalid_argument,
                      row + ": " + field + " " + why + " (an impossible value: not read)");
}

Result<void> check_time(const std::string &row, const char *field, const Statement &st, int col,
                        bool nullable) {
    int t = st.type(col);
    if (t == SQLITE_NULL && nullable) return {};
    if (t != SQLITE_INTEGER) return impossible(row, field, "is not an integer");
    std::int64_t v = st.int64(col);
    if (v < earliest_us || v >= latest_us)
        return impossible(row, field,
                          std::to_string(v) + " is outside 1970-01-01..2200-01-01 (microseconds)");
    return {};
}

Result<void> check_count(const std::string &row, const char *field, const Statement &st, int col,
                         bool nullable, std::int64_t max = INT64_MAX) {
    int t = st.type(col);
    if (t == SQLITE_NULL && nullable) return {};
    if (t != SQLITE_INTEGER) return impossible(row, field, "is not an integer");
    std::int64_t v = st.int64(col);
    if (v < 0) return impossible(row, field, std::to_string(v) + " is negative");
    if (v > max)
        return impossible(row, field, std::to_string(v) + " is above " + std::to_string(max));
    return {};
}

constexpr std::int64_t max_uid = 0xffffffffLL;

Result<Session> read_session(Statement &st) {
    std::string row = "session " + quote_untrusted(st.text(0));
    for (auto [col, field, nullable] :
         {std::tuple{12, "started_us", false}, std::tuple{13, "ended_us", true}})
        if (auto c = check_time(row, field, st, col, nullable); !c) return c.error();
    for (auto [col, field, max] :
         {std::tuple{1, "uid", max_uid}, std::tuple{2, "pid", INT64_MAX},
          std::tuple{8, "region_bytes", INT64_MAX}, std::tuple{15, "rx_bytes", INT64_MAX},
          std::tuple{16, "rx_packets", INT64_MAX}, std::tuple{17, "dropped_packets", INT64_MAX}})
        if (auto c = check_count(row, field, st, col, false, max); !c) return c.error();
    Session s;
    s.id = st.text(0);
    s.uid = static_cast<std::uint32_t>(st.int64(1));
    s.pid = st.int64(2);
    s.exe = st.text(3);
    s.unit = st.text(4);
    s.netdev = st.text(5);
    s.gpu = st.text(6);
    s.mode = st.text(7);
    s.region_bytes = static_cast<std::uint64_t>(st.int64(8));
    // The column is JSON the daemon wrote; anything else in it is shown as what it is.
    std::string flows_text = st.text(9);
    auto flows = knod::parse_json(flows_text);
    if (flows.is_array())
        for (auto &f : flows)
            s.flows.push_back(f.is_string() ? f.get<std::string>() : knod::dump_json(f));
    else if (!flows_text.empty() && flows_text != "[]")
        s.flows.push_back(flows_text);
    s.key_id = st.text(10);
    s.rule = st.text(11);
    s.started_us = st.int64(12);
    s.ended_us = st.opt_int64(13);
    s.end_reason = st.opt_text(14);
    s.counters = {static_cast<std::uint64_t>(st.int64(15)),
                  static_cast<std::uint64_t>(st.int64(16)),
                  static_cast<std::uint64_t>(st.int64(17))};
    return s;
}

} // namespace

Result<void> check_event_row(const Statement &st) {
    std::string row = "event " + std::to_string(st.int64(0));
    if (st.type(0) != SQLITE_INTEGER) return impossible(row, "seq", "is not an integer");
    if (auto c = check_time(row, "at_us", st, 1, false); !c) return c;
    if (auto c = check_count(row, "uid", st, 4, true, max_uid); !c) return c;
    if (auto c = check_count(row, "pid", st, 5, true); !c) return c;
    if (st.type(9) == SQLITE_NULL) return {};
    std::string_view detail = st.text_view(9); // checked in place: no copy per event
    if (detail.size() > max_detail_bytes)
        return impossible(row, "detail",
                          "is " + std::to_string(detail.size()) + " bytes, above " +
                              std::to_string(max_detail_bytes));
    if (auto member = knod::json_object_over_keys(detail))
        return impossible(
            row,
            member->empty() ? "detail" : "detail." + escape_untrusted(*member, Escape::value, 64),
            "holds an object of more than " + std::to_string(knod::max_json_object_keys) + " keys");
    return {};
}

namespace {

// An event's detail for json_extract: NULL when it is not JSON (or nests too deep for SQLite),
// so one malformed detail is no field rather than an error for the whole query.
const std::string detail_json = "CASE WHEN json_valid(e.detail) THEN e.detail END";

// The Kubernetes namespace an event counts under. An event of a session (its end, a
// revocation) counts under the pod its session's first grant named, whatever the event itself
// says (a revocation, made by an admin, names none; a session taken back across a restart ends
// without one); an event of no session (a refusal) under the pod its own detail names. Only a
// string counts: a crafted journal's number or object there is no namespace. The grants'
// namespaces are read once (the CTE below), not looked up per event.
std::string namespace_of_detail(const std::string &column) {
    return "CASE WHEN json_valid(" + column + ") AND json_type(" + column +
           ", '$.pod.namespace') = 'text' THEN json_extract(" + column + ", '$.pod.namespace') END";
}
const std::string grant_namespaces_cte =
    // SQLite takes a bare column of an aggregate query with one min() from the row of the min:
    // each session's first grant, in one pass however many grants a crafted file repeats.
    "WITH grant_ns(session_id, ns, first_seq) AS (SELECT g.session_id, " +
    namespace_of_detail("g.detail") +
    ", min(g.seq) FROM events g WHERE g.kind = 'request-granted' AND g.session_id IS NOT NULL "
    "GROUP BY g.session_id) ";
const std::string k8s_namespace_sql = "CASE WHEN e.session_id IS NOT NULL THEN gn.ns ELSE " +
                                      namespace_of_detail("e.detail") + " END";

const char *session_columns =
    "id, uid, pid, exe, unit, netdev, gpu, mode, region_bytes, flows, key_id, rule, started_us, "
    "ended_us, end_reason, rx_bytes, rx_packets, dropped_packets";

std::string limit_sql(const Filter &f) {
    return f.limit ? " LIMIT " + std::to_string(*f.limit) : std::string();
}

// `select` ordered by `order` (its column number `position`), limited as the filter says. The
// newest rows are taken in reverse through the same index, then put back in order: SQLite reads
// only `limit` rows of the index either way.
std::string ordered_sql(const std::string &select, const std::string &order, int position,
                        const Filter &f) {
    if (!f.newest || !f.limit) return select + " ORDER BY " + order + limit_sql(f);
    return "SELECT * FROM (" + select + " ORDER BY " + order + " DESC" + limit_sql(f) +
           ") ORDER BY " + std::to_string(position);
}

} // namespace

Event event_from_row(const Statement &st) {
    Event e;
    e.at_us = st.int64(1);
    e.kind = st.text(2);
    e.session_id = st.opt_text(3);
    e.uid = st.opt_int64(4);
    e.pid = st.opt_int64(5);
    e.rule = st.opt_text(6);
    e.decision = st.opt_text(7);
    e.reason = st.opt_text(8);
    e.detail = st.opt_text(9);
    return e;
}

std::string normalized_sql(const std::string &sql) {
    std::string out;
    auto space = [&] {
        if (!out.empty() && out.back() != ' ') out += ' ';
    };
    for (std::size_t i = 0; i < sql.size(); ++i) {
        char c = sql[i];
        if (c == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
            i = sql.find('\n', i);
            if (i == std::string::npos) break;
            space();
        } else if (c == '/' && i + 1 < sql.size() && sql[i + 1] == '*') {
            i = sql.find("*/", i + 2);
            if (i == std::string::npos) break;
            ++i;
            space();
        } else if (c == '\'' || c == '"' || c == '`' || c == '[') {
            char close = c == '[' ? ']' : c; // quoted: kept as is
            std::size_t end = sql.find(close, i + 1);
            if (end == std::string::npos) end = sql.size() - 1;
            out.append(sql, i, end - i + 1);
            i = end;
        } else if (std::isspace(static_cast<unsigned char>(c))) {
            space();
        } else {
            out += c;
        }
    }
    while (!out.empty() && out.back() == ' ')
        out.pop_back();
    return out;
}

bool is_tampering(const Error &e) {
    return e.code == Errc::corrupt && e.message.find(tampered_mark) != std::string::npos;
}

namespace {

// Every object the migrations make, up to the newest version: (type, name) -> its SQL,
// normalized. Made once per process in memory.
Result<std::map<std::pair<std::string, std::string>, std::string>> own_objects() {
    using Objects = std::map<std::pair<std::string, std::string>, std::string>;
    static const Result<Objects> made = []() -> Result<Objects> {
        auto db = Database::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
        if (!db) return db.error();
        for (auto &m : migrations())
            if (auto r = db->exec(std::string(m.sql)); !r)
                return std::move(r).error().context("migration " + std::string(m.name));
        auto st = db->prepare("SELECT type, name, sql FROM sqlite_master");
        if (!st) return st.error();
        Objects out;
        for (;;) {
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) return out;
            out[{st->text(0), st->text(1)}] = normalized_sql(st->text(2));
        }
    }();
    return made;
}

// The schema as stored, compared before any query reads a table: an object that could run
// code of the file's author inside the auditor's queries (a view, such as an `events` that is
// a recursive query without end; a virtual table; a trigger the journal's schema does not
// define) is tampering (exit 1), refused by every command. Plain tables and indexes the
// schema does not make run nothing; verify's full comparison (changed_schema) names them. A
// file with neither `sessions` nor `events` is no journal at all (exit 2).
Result<void> check_objects(Database &db, const std::string &path) {
    auto own = own_objects();
    if (!own) return std::move(own).error().context("the project's schema");
    auto version = db.scalar("PRAGMA user_version");
    if (!version) return std::move(version).error().context(path + " is not a knod journal");
    std::string v = std::to_string(*version);
    auto st = db.prepare("SELECT type, name, sql FROM sqlite_master");
    if (!st) return std::move(st).error().context(path + " is not a knod journal");
    bool has_events = false, has_sessions = false;
    std::optional<std::string> problem;
    for (;;) {
        auto row = st->step();
        if (!row) return std::move(row).error().context(path + " is not a knod journal");
        if (!*row) break;
        std::string type = st->text(0), name = st->text(1), sql = normalized_sql(st->text(2));
        has_events = has_events || name == "events";
        has_sessions = has_sessions || name == "sessions";
        if (problem) continue;
        std::string what = "the " + escape_untrusted(name) + " " + escape_untrusted(type);
        std::string upper = sql.substr(0, 20);
        std::transform(upper.begin(), upper.end(), upper.begin(),
                       [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
        if (type == "table" && upper.rfind("CREATE VIRTUAL TABLE", 0) == 0)
            problem = what + " is a virtual table, not part of schema version " + v +
                      " (added: " + std::string(tampered_mark) + ")";
        else if (type == "trigger" && own->count({type, name}) && own->at({type, name}) != sql)
            problem = what + " is not defined as schema version " + v +
                      " defines it (rebuilt or altered: " + std::string(tampered_mark) + ")";
        else if ((type == "view" || type == "trigger") && !own->count({type, name}))
            problem = what + " is not part of schema version " + v +
                      " (added: " + std::string(tampered_mark) + ")";
        else if (type != "table" && type != "index" && type != "trigger")
            problem = what +
                      " is not an object a journal has (added: " + std::string(tampered_mark) + ")";
    }
    if (!has_events || !has_sessions)
        return make_error(Errc::corrupt, path + " is not a knod journal (no " +
                                             (has_events ? "sessions" : "events") + " table)");
    if (problem) return make_error(Errc::corrupt, path + ": " + *problem);
    return {};
}

} // namespace

struct ReadOnlyJournal::Budget {
    std::chrono::steady_clock::time_point deadline;
    static int check(void *self) {
        return std::chrono::steady_clock::now() > static_cast<Budget *>(self)->deadline ? 1 : 0;
    }
};

std::int64_t audit_time_budget_s() {
    const char *env = std::getenv("KNOD_AUDIT_TIME_BUDGET");
    std::int64_t v = 3600;
    if (env && *env) {
        std::int64_t parsed = 0;
        auto [end, ec] = std::from_chars(env, env + std::strlen(env), parsed);
        if (ec == std::errc() && *end == '\0' && parsed >= 0 && parsed <= 366LL * 86400) v = parsed;
    }
    return v;
}

namespace {

// SQLite's defensive settings for a file from a host the auditor need not trust: no writes
// to the schema, the schema's functions untrusted, no extensions, no trigger or view ever
// run, values at most 64 MiB, and a time budget after which any statement stops with an error.
Result<void> harden(Database &db, ReadOnlyJournal::Budget *budget) {
    sqlite3 *h = db.get();
    struct Setting {
        int op, value;
        const char *name;
    };
    for (auto s : {Setting{SQLITE_DBCONFIG_DEFENSIVE, 1, "DEFENSIVE"},
                   Setting{SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, "TRUSTED_SCHEMA"},
                   Setting{SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, "ENABLE_LOAD_EXTENSION"},
                   Setting{SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, "ENABLE_TRIGGER"},
                   Setting{SQLITE_DBCONFIG_ENABLE_VIEW, 0, "ENABLE_VIEW"}}) {
        int now = -1;
        if (sqlite3_db_config(h, s.op, s.value, &now) != SQLITE_OK || now != s.value)
            return make_error(Errc::unsupported,
                              std::string("SQLite refused SQLITE_DBCONFIG_") + s.name);
    }
    if (auto r = db.exec("PRAGMA trusted_schema=OFF"); !r) return r;
    sqlite3_limit(h, SQLITE_LIMIT_LENGTH, 64 << 20);
    sqlite3_progress_handler(h, 1000, &ReadOnlyJournal::Budget::check, budget);
    return {};
}

} // namespace

struct ReadOnlyJournal::PrivateCopy {
    std::string dir;
    ~PrivateCopy() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
};

Result<ReadOnlyJournal> ReadOnlyJournal::open(const std::string &path) {
    // Our own open first, so the reason reaches the auditor: a missing file is "no journal", an
    // unreadable one (or one in an unreadable directory) says so with the system's reason.
    // O_NONBLOCK: a FIFO named as the journal must not wait for a writer before it is refused.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) return make_error(Errc::not_found, "no journal at " + path);
        std::string why = "cannot read the journal " + path + ": " + std::strerror(err);
        // The daemon's own journal, before its first snapshot: say that, not only EACCES.
        if (err == EACCES)
            if (auto note = snapshot_not_published(path)) why += "; " + *note;
        return make_error(Errc::io, why);
    }
    auto regular = require_regular(fd, path);
    // The database header's read and write versions (bytes 18 and 19): 1 for a rollback journal,
    // 2 for WAL.
    unsigned char header[20] = {};
    bool rollback_mode =
        regular && ::pread(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header) &&
        header[18] == 1 && header[19] == 1;
    ::close(fd);
    if (!regular) return regular.error();
    // Where the daemon publishes, a file without a rollback journal's header is not a whole
    // copy (one an unfinished publication of an older daemon left; the daemon now renames each
    // first copy into place whole): never read as a journal, whatever its bytes say.
    if (!rollback_mode && published_snapshot_of(path))
        return make_error(Errc::unavailable,
                          "cannot read the journal " + path + ": it is not a whole auditors' " +
                              "snapshot (no SQLite rollback-journal header): the daemon has " +
                              "not finished publishing it; its next publication replaces it " +
                              "whole: retry then");

    auto exists = [](const std::string &p) {
        struct stat s {};
        return ::stat(p.c_str(), &s) == 0;
    };
    std::shared_ptr<PrivateCopy> copy;
    std::string open_path = path, query = "mode=ro";
    bool locked = false;
    if (!exists(path + "-wal")) {
        // The daemon's published snapshot is rewritten in place while auditors read it
        // (journal/snapshot.h): it is read under SQLite's shared lock, which needs read access
        // only. Only there: with locks SQLite also opens a -journal beside the file, and in a
        // directory someone else may write that could be a FIFO (an open that never returns) or
        // a link to a device. Anything else (a copy, a cleanly closed journal) is immutable, so
        // nothing beside it is opened or written.
        locked = rollback_mode && published_snapshot_of(path).has_value();
        if (locked) {
            struct stat j {};
            if (::lstat((path + "-journal").c_str(), &j) == 0 && !S_ISREG(j.st_mode))
                return make_error(Errc::corrupt, "cannot read the journal " + path + ": " + path +
                                                     "-journal is " + file_kind(j.st_mode) +
                                                     ", not a rollback journal");
        } else {
            query += "&immutable=1";
        }
    } else if (!exists(path + "-shm")) {
        // Committed events may sit in the -wal only; immutable would ignore them. Read both from
        // a private copy, where SQLite may create its -shm.
        const char *tmp = std::getenv("TMPDIR");
        std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/knod-audit-XXXXXX";
        if (!::mkdtemp(templ.data()))
            return make_error(Errc::io, "a private copy of " + path + " (it has a -wal but no " +
                                            "-shm): mkdtemp " + templ + ": " +
                                            std::strerror(errno));
        copy = std::make_shared<PrivateCopy>();
        copy->dir = templ;
        open_path = templ + "/journal.db";
        std::error_code ec;
        for (const char *suffix : {"", "-wal"}) {
            std::filesystem::copy_file(path + suffix, open_path + suffix, ec);
            if (ec)
                return make_error(Errc::io, "a private copy of " + path + suffix + " in " + templ +
                                                ": " + ec.message());
        }
    }
    std::string uri = file_uri(open_path, query);
    auto db = Database::open(uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    if (!db)
        return make_error(db.error().code,
                          "cannot open the journal " + path + ": " + db.error().message);
    auto budget = std::make_shared<Budget>();
    budget->deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(audit_time_budget_s());
    if (auto h = harden(*db, budget.get()); !h)
        return std::move(h).error().context("cannot open the journal " + path);
    if (auto c = check_objects(*db, path); !c) {
        struct stat j {};
        if (locked && ::stat((path + "-journal").c_str(), &j) == 0 && j.st_size > 0)
            return make_error(Errc::unavailable,
                              "cannot read the journal " + path +
                                  ": an unfinished write is left "
                                  "beside it (" +
                                  path +
                                  "-journal, a publication the daemon did "
                                  "not finish); the daemon rolls it back at its next publication: "
                                  "retry then (" +
                                  c.error().message + ")");
        return c.error();
    }
    return ReadOnlyJournal(std::move(copy), std::move(budget), std::move(uri), std::move(*db));
}

Result<Database> ReadOnlyJournal::another_connection() const {
    auto db = Database::open(uri_, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    if (!db) return db;
    if (auto h = harden(*db, budget_.get()); !h) return h.error();
    return db;
}

Result<JournalReader> JournalReader::open(const std::string &path) {
    auto j = ReadOnlyJournal::open(path);
    if (!j) return j.error();
    return JournalReader(std::move(*j));
}

Result<void> JournalReader::sessions(const Filter &f,
                                     const std::function<bool(const Session &)> &each) {
    Where w;
    w.add("started_us >= ?", f.since_us);
    w.add("started_us < ?", f.until_us);
    w.add("uid = ?", f.uid);
    w.add("netdev = ?", f.netdev);
    w.add("gpu = ?", f.gpu);
    w.add("rule = ?", f.rule);
    w.add("end_reason = ?", f.reason);
    auto st = j_.db().prepare(
        ordered_sql(std::string("SELECT ") + session_columns + " FROM sessions" + w.sql(),
                    "started_us", 13, f));
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return {};
        auto s = read_session(*st);
        if (!s) return s.error();
        if (!each(*s)) return {};
    }
}

Result<void> JournalReader::events(const Filter &f,
                                   const std::function<bool(const EventRecord &)> &each) {
    Where w;
    w.add("e.at_us >= ?", f.since_us);
    w.add("e.at_us < ?", f.until_us);
    w.add("e.uid = ?", f.uid);
    w.add("coalesce(s.netdev, json_extract(" + detail_json + ", '$.netdev')) = ?", f.netdev);
    w.add("coalesce(s.gpu, json_extract(" + detail_json + ", '$.gpu')) = ?", f.gpu);
    w.add("e.rule = ?", f.rule);
    w.add("e.reason = ?", f.reason);
    w.add("e.decision = ?", f.decision);
    w.add("e.kind = ?", f.kind);
    w.add("e.seq > ?", f.after_seq);
    w.add("e.session_id = ?", f.session);
    auto st = j_.db().prepare(
        ordered_sql("SELECT e.seq, e.at_us, e.kind, e.session_id, e.uid, e.pid, e.rule, "
                    "e.decision, e.reason, e.detail, e.prev_hash, e.hash, s.netdev, s.gpu, "
                    "s.flows FROM events e LEFT JOIN sessions s ON s.id = e.session_id" +
                        w.sql(),
                    "e.seq", 1, f));
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return {};
        if (auto c = check_event_row(*st); !c) return c.error();
        EventRecord e;
        e.seq = st->int64(0);
        e.event = event_from_row(*st);
        for (auto [column, hash] : {std::pair{10, &e.prev_hash}, std::pair{11, &e.hash}}) {
            std::string h = st->blob(column);
            if (h.size() == hash->size()) std::copy(h.begin(), h.end(), hash->begin());
        }
        e.session_netdev = st->opt_text(12);
        e.session_gpu = st->opt_text(13);
        e.session_flows = st->opt_text(14);
        if (!each(e)) return {};
    }
}

Result<std::optional<Session>> JournalReader::session(const std::string &id) {
    auto st =
        j_.db().prepare(std::string("SELECT ") + session_columns + " FROM sessions WHERE id = ?");
    if (!st) return st.error();
    st->bind(1, id);
    auto row = st->step();
    if (!row) return row.error();
    if (!*row) return std::optional<Session>();
    auto s = read_session(*st);
    if (!s) return s.error();
    return std::optional<Session>(std::move(*s));
}

std::int64_t Tally::other_refusals_total() const {
    // Each count is a checked sum of non-negative values; their total saturates.
    std::int64_t n = 0;
    for (auto &[decision, count] : other_refusals)
        if (__builtin_add_overflow(n, count, &n)) return INT64_MAX;
    return n;
}

namespace {

constexpr std::int64_t hour_us = 3600LL * 1000000;

// One aggregated row of the report query: how many events of one kind and decision, for one
// owner, device and hour.
struct ReportRow {
    std::optional<std::int64_t> uid;
    std::optional<std::string> netdev, gpu, k8s_namespace;
    std::int64_t hour = 0;
    std::string kind;
    std::optional<std::string> decision, rule;
    std::int64_t events = 0, coalesced = 0, rx_bytes = 0;
};

// Adds n to a count; false where the sum would not fit (journal values are attacker data).
[[nodiscard]] bool add(std::int64_t &to, std::int64_t n) {
    return n >= 0 && !__builtin_add_overflow(to, n, &to);
}

[[nodiscard]] bool count(Tally &t, const ReportRow &r) {
    // A pod refused at its sandbox's creation (pod-refused) is a refusal like a request's.
    if (r.kind == kind::granted)
        return add(t.sessions, r.events) &&
               (r.decision != "would-deny" || add(t.would_deny_grants, r.events));
    if (r.kind == kind::denied || r.kind == kind::pod_refused) {
        if (r.decision == "deny") return add(t.denials, r.events);
        if (r.decision == "quota-exceeded") return add(t.quota_refusals, r.events);
        return add(t.other_refusals[r.decision.value_or("unknown")], r.events);
    }
    if (r.kind == kind::coalesced) return add(t.other_refusals["coalesced"], r.coalesced);
    if (r.kind == kind::ended) return add(t.rx_bytes, r.rx_bytes);
    if (r.kind == kind::revoked) return add(t.revocations, r.events);
    return true;
}

std::vector<RuleCount> most_first(const std::map<std::optional<std::string>, std::int64_t> &m) {
    std::vector<RuleCount> out;
    for (auto &[rule, n] : m)
        out.push_back({rule, n});
    std::stable_sort(out.begin(), out.end(),
                     [](const RuleCount &a, const RuleCount &b) { return a.count > b.count; });
    return out;
}

std::vector<Tally> values(std::map<std::string, Tally> &m) {
    std::vector<Tally> out;
    for (auto &[key, t] : m)
        out.push_back(std::move(t));
    return out;
}

} // namespace

Result<Report> JournalReader::report(const Filter &f) {
    Where w;
    w.add("e.at_us >= ?", f.since_us);
    w.add("e.at_us < ?", f.until_us);
    w.add("coalesce(s.uid, e.uid) = ?", f.uid);
    w.add("coalesce(s.netdev, json_extract(" + detail_json + ", '$.netdev')) = ?", f.netdev);
    w.add("coalesce(s.gpu, json_extract(" + detail_json + ", '$.gpu')) = ?", f.gpu);
    // One pass over the period's events, grouped by everything a view needs; each view is then
    // a sum over these rows. A session's events count for its owner (a revoke is done by an
    // admin, but to the owner) and its device; a refusal names the requested device in detail.
    // Bytes come from the closing event (chained), the session row only for an event without.
    std::string where = w.sql();
    where += (where.empty() ? " WHERE " : " AND ");
    where += "(e.kind IN ('request-granted', 'request-denied', 'pod-refused', 'session-ended', "
             "'revoke') OR "
             "(e.kind = 'refusals-coalesced' AND e.decision = 'request-denied'))";
    // Every value the sums and the hours are made of, checked first: the first row with one no
    // daemon writes (a time outside the sane range, a negative or non-integer count) is
    // refused by name, rather than summed into an overflow or drawn at an impossible hour.
    {
        auto d = [](const char *path) { return "json_type(" + detail_json + ", '" + path + "')"; };
        auto negative_or_not_int = [&](const char *path) {
            return "(" + d(path) + " IS NOT NULL AND (" + d(path) +
                   " != 'integer' OR json_extract(" + detail_json + ", '" + path + "') < 0))";
        };
        std::string bad =
            "CASE WHEN typeof(e.at_us) != 'integer' OR e.at_us < " + std::to_string(earliest_us) +
            " OR e.at_us >= " + std::to_string(latest_us) +
            " THEN 'at_us' WHEN e.uid IS NOT NULL AND (typeof(e.uid) != 'integer' OR e.uid < 0 "
            "OR e.uid > 4294967295) THEN 'uid' WHEN s.id IS NOT NULL AND (typeof(s.uid) != "
            "'integer' OR s.uid < 0 OR s.uid > 4294967295) THEN 'uid of its session' WHEN e.kind "
            "= 'session-ended' AND " +
            negative_or_not_int("$.rx_bytes") +
            " THEN 'detail.rx_bytes' WHEN e.kind = 'session-ended' AND " +
            negative_or_not_int("$.end.rx_bytes") +
            " THEN 'detail.end.rx_bytes' WHEN e.kind = 'session-ended' AND s.id IS NOT NULL AND "
            "(typeof(s.rx_bytes) != 'integer' OR s.rx_bytes < 0) THEN 'rx_bytes of its session' "
            "WHEN e.kind = 'refusals-coalesced' AND " +
            negative_or_not_int("$.count") + " THEN 'detail.count' END";
        auto check = j_.db().prepare("SELECT seq, bad FROM (SELECT e.seq AS seq, " + bad +
                                     " AS bad FROM events e LEFT JOIN sessions s ON s.id = "
                                     "e.session_id" +
                                     where + ") WHERE bad IS NOT NULL ORDER BY seq LIMIT 1");
        if (!check) return check.error();
        w.bind(*check);
        auto found = check->step();
        if (!found) return std::move(found).error().context("checking the report's values");
        if (*found)
            return impossible("event " + std::to_string(check->int64(0)), check->text(1).c_str(),
                              "is out of range or not a non-negative integer");
    }
    auto st = j_.db().prepare(
        grant_namespaces_cte + "SELECT coalesce(s.uid, e.uid), coalesce(s.netdev, json_extract(" +
        detail_json + ", '$.netdev')), coalesce(s.gpu, json_extract(" + detail_json +
        ", '$.gpu')), e.at_us / 3600000000, e.kind, e.decision, e.rule, count(*), sum(CASE WHEN "
        "e.kind = 'refusals-coalesced' THEN coalesce(json_extract(" +
        detail_json +
        ", '$.count'), 0) ELSE 0 END), sum(CASE WHEN e.kind = 'session-ended' THEN "
        "coalesce(json_extract(" +
        detail_json + ", '$.rx_bytes'), json_extract(" + detail_json +
        ", '$.end.rx_bytes'), s.rx_bytes, 0) ELSE 0 END), " + k8s_namespace_sql +
        " FROM events e LEFT JOIN sessions s ON s.id = e.session_id LEFT JOIN grant_ns gn ON "
        "gn.session_id = e.session_id" +
        where + " GROUP BY 1, 2, 3, 4, 5, 6, 7, 11");
    if (!st) return st.error();
    w.bind(*st);
    Report r;
    std::map<std::int64_t, Tally> users, hours;
    std::map<std::string, Tally> netdevs, gpus, namespaces;
    std::map<std::optional<std::string>, std::int64_t> denied, quota;
    std::map<std::string, std::int64_t> decisions;
    for (;;) { // a read error is the caller's error, never a silently shorter report
        auto step = st->step();
        if (!step) return std::move(step).error().context("summing the report");
        if (!*step) break;
        ReportRow row;
        row.uid = st->opt_int64(0);
        row.netdev = st->opt_text(1);
        row.gpu = st->opt_text(2);
        row.hour = st->int64(3);
        row.kind = st->text(4);
        row.decision = st->opt_text(5);
        row.rule = st->opt_text(6);
        row.events = st->int64(7);
        row.coalesced = st->int64(8);
        row.rx_bytes = st->int64(9);
        row.k8s_namespace = st->opt_text(10);
        bool fits = count(r.totals, row) && (!row.uid || count(users[*row.uid], row)) &&
                    (!row.netdev || count(netdevs[*row.netdev], row)) &&
                    (!row.gpu || count(gpus[*row.gpu], row)) &&
                    (!row.k8s_namespace || count(namespaces[*row.k8s_namespace], row)) &&
                    count(hours[row.hour], row);
        if (row.kind == kind::denied || row.kind == kind::pod_refused) {
            if (row.decision == "deny") fits = fits && add(denied[row.rule], row.events);
            if (row.decision == "quota-exceeded") fits = fits && add(quota[row.rule], row.events);
            fits = fits && add(decisions[row.decision.value_or("unknown")], row.events);
        } else if (row.kind == kind::coalesced) {
            fits = fits && add(decisions["coalesced"], row.coalesced);
        }
        if (!fits)
            return make_error(Errc::invalid_argument,
                              "the report's counts for the hour starting at " +
                                  std::to_string(row.hour * hour_us) + " us (" + row.kind +
                                  ") do not fit in 64 bits: impossible values (not summed)");
    }
    for (auto &[uid, t] : users) {
        t.key = std::to_string(uid);
        r.by_user.push_back(std::move(t));
    }
    for (auto *m : {&netdevs, &gpus, &namespaces})
        for (auto &[key, t] : *m)
            t.key = key;
    r.by_netdev = values(netdevs);
    r.by_gpu = values(gpus);
    r.by_k8s_namespace = values(namespaces);
    r.denied_by_rule = most_first(denied);
    r.quota_by_rule = most_first(quota);
    for (auto &[decision, n] : decisions)
        if (n > 0) r.refusals_by_decision.emplace_back(decision, n);
    std::stable_sort(r.refusals_by_decision.begin(), r.refusals_by_decision.end(),
                     [](auto &a, auto &b) { return a.second > b.second; });
    for (auto &[hour, t] : hours)
        r.timeline.emplace_back(hour * hour_us, std::move(t));
    return r;
}

} // namespace knod::journal
