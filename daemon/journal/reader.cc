#include "daemon/journal/reader.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

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

Session read_session(Statement &st) {
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
    auto flows = nlohmann::json::parse(st.text(9), nullptr, false);
    if (flows.is_array())
        for (auto &f : flows)
            s.flows.push_back(f.get<std::string>());
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

const char *session_columns =
    "id, uid, pid, exe, unit, netdev, gpu, mode, region_bytes, flows, key_id, "
    "rule, started_us, ended_us, end_reason, rx_bytes, rx_packets, dropped_packets";

std::string limit_sql(const Filter &f) {
    return f.limit ? " LIMIT " + std::to_string(*f.limit) : std::string();
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
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) return make_error(Errc::not_found, "no journal at " + path);
        return make_error(Errc::io, "cannot read the journal " + path + ": " + std::strerror(err));
    }
    struct stat st {};
    bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    ::close(fd);
    if (!regular) return make_error(Errc::invalid_argument, path + " is not a regular file");

    auto exists = [](const std::string &p) {
        struct stat s {};
        return ::stat(p.c_str(), &s) == 0;
    };
    std::shared_ptr<PrivateCopy> copy;
    std::string open_path = path, query = "mode=ro";
    if (!exists(path + "-wal")) {
        // A copy (or a cleanly closed journal): immutable, nothing is written beside it.
        query += "&immutable=1";
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
    auto db = Database::open(file_uri(open_path, query), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    if (!db)
        return make_error(db.error().code,
                          "cannot open the journal " + path + ": " + db.error().message);
    auto ok = db->scalar("SELECT count(*) FROM sqlite_master WHERE name IN ('sessions','events')");
    if (!ok)
        return make_error(Errc::corrupt, path + " is not a knod journal: " + ok.error().message);
    if (*ok != 2) return make_error(Errc::corrupt, path + " is not a knod journal");
    return ReadOnlyJournal(std::move(copy), std::move(*db));
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
    auto st = j_.db().prepare(std::string("SELECT ") + session_columns + " FROM sessions" +
                              w.sql() + " ORDER BY started_us" + limit_sql(f));
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row || !each(read_session(*st))) return {};
    }
}

Result<void> JournalReader::events(const Filter &f,
                                   const std::function<bool(const EventRecord &)> &each) {
    Where w;
    w.add("e.at_us >= ?", f.since_us);
    w.add("e.at_us < ?", f.until_us);
    w.add("e.uid = ?", f.uid);
    w.add("coalesce(s.netdev, json_extract(e.detail, '$.netdev')) = ?", f.netdev);
    w.add("coalesce(s.gpu, json_extract(e.detail, '$.gpu')) = ?", f.gpu);
    w.add("e.rule = ?", f.rule);
    w.add("e.reason = ?", f.reason);
    w.add("e.decision = ?", f.decision);
    w.add("e.kind = ?", f.kind);
    w.add("e.seq > ?", f.after_seq);
    auto st = j_.db().prepare("SELECT e.seq, e.at_us, e.kind, e.session_id, e.uid, e.pid, e.rule, "
                              "e.decision, e.reason, e.detail, e.prev_hash, e.hash, s.netdev, "
                              "s.gpu, s.flows FROM events e "
                              "LEFT JOIN sessions s ON s.id = e.session_id" +
                              w.sql() + " ORDER BY e.seq" + limit_sql(f));
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return {};
        EventRecord e;
        e.seq = st->int64(0);
        e.event.at_us = st->int64(1);
        e.event.kind = st->text(2);
        e.event.session_id = st->opt_text(3);
        e.event.uid = st->opt_int64(4);
        e.event.pid = st->opt_int64(5);
        e.event.rule = st->opt_text(6);
        e.event.decision = st->opt_text(7);
        e.event.reason = st->opt_text(8);
        e.event.detail = st->opt_text(9);
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
    return std::optional<Session>(read_session(*st));
}

Result<Report> JournalReader::report(const Filter &f) {
    Report r;
    Where w;
    w.add("at_us >= ?", f.since_us);
    w.add("at_us < ?", f.until_us);
    // Sessions are counted by their grant event, so the period applies to both tables alike.
    auto tally = [&](const std::string &key_sql, std::vector<Tally> &out) -> Result<void> {
        auto st = j_.db().prepare(
            "SELECT " + key_sql +
            " AS k, sum(kind = 'request-granted'), coalesce(sum(CASE WHEN kind = 'session-ended' "
            "THEN json_extract(detail, '$.rx_bytes') END), 0), sum(CASE WHEN kind = "
            "'request-denied' THEN 1 WHEN kind = 'refusals-coalesced' AND decision = "
            "'request-denied' THEN json_extract(detail, '$.count') ELSE 0 END), "
            "sum(kind = 'revoke') FROM (SELECT e.*, s.netdev AS s_netdev, s.uid AS s_uid FROM "
            "events e "
            "LEFT JOIN sessions s ON s.id = e.session_id" +
            w.sql() + ") WHERE k IS NOT NULL GROUP BY k ORDER BY k");
        if (!st) return st.error();
        w.bind(*st);
        for (;;) { // a read error is the caller's error, never a silently shorter report
            auto row = st->step();
            if (!row) return row.error();
            if (!*row) return {};
            out.push_back({st->text(0), st->int64(1), st->int64(2), st->int64(3), st->int64(4)});
        }
    };
    // A session's events count for its owner (a revoke is done by an admin, but to the owner).
    // Denials include those only counted in a refusals-coalesced event.
    if (auto t = tally("CAST(coalesce(s_uid, uid) AS TEXT)", r.by_user); !t) return t.error();
    if (auto t = tally("coalesce(s_netdev, json_extract(detail, '$.netdev'))", r.by_netdev); !t)
        return t.error();
    auto st =
        j_.db().prepare("SELECT rule, count(*) AS n FROM events" + w.sql() +
                        (w.sql().empty() ? " WHERE " : " AND ") +
                        "kind = 'request-denied' AND rule IS NOT NULL GROUP BY rule ORDER BY n "
                        "DESC, rule LIMIT 10");
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return r;
        r.top_denied_rules.emplace_back(st->text(0), st->int64(1));
    }
}

} // namespace knod::journal
