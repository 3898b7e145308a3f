#include "journal/reader.h"

#include "knod/json.h"
#include "knod/regular_file.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// An event's detail for json_extract: NULL when it is not JSON (or nests too deep for SQLite),
// so one malformed detail is no field rather than an error for the whole query.
const std::string detail_json = "CASE WHEN json_valid(e.detail) THEN e.detail END";

const char *session_columns =
    "id, uid, pid, exe, unit, netdev, gpu, mode, region_bytes, flows, key_id, rule, started_us, "
    "ended_us, end_reason, rx_bytes, rx_packets, dropped_packets";

std::string limit_sql(const Filter &f) {
    return f.limit ? " LIMIT " + std::to_string(*f.limit) : std::string();
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
        return make_error(Errc::io, "cannot read the journal " + path + ": " + std::strerror(err));
    }
    auto regular = require_regular(fd, path);
    ::close(fd);
    if (!regular) return regular.error();

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
    std::string uri = file_uri(open_path, query);
    auto db = Database::open(uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    if (!db)
        return make_error(db.error().code,
                          "cannot open the journal " + path + ": " + db.error().message);
    auto ok = db->scalar("SELECT count(*) FROM sqlite_master WHERE name IN ('sessions','events')");
    if (!ok)
        return make_error(Errc::corrupt, path + " is not a knod journal: " + ok.error().message);
    if (*ok != 2) return make_error(Errc::corrupt, path + " is not a knod journal");
    return ReadOnlyJournal(std::move(copy), std::move(uri), std::move(*db));
}

Result<Database> ReadOnlyJournal::another_connection() const {
    return Database::open(uri_, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
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
    w.add("coalesce(s.netdev, json_extract(" + detail_json + ", '$.netdev')) = ?", f.netdev);
    w.add("coalesce(s.gpu, json_extract(" + detail_json + ", '$.gpu')) = ?", f.gpu);
    w.add("e.rule = ?", f.rule);
    w.add("e.reason = ?", f.reason);
    w.add("e.decision = ?", f.decision);
    w.add("e.kind = ?", f.kind);
    w.add("e.seq > ?", f.after_seq);
    w.add("e.session_id = ?", f.session);
    auto st =
        j_.db().prepare("SELECT e.seq, e.at_us, e.kind, e.session_id, e.uid, e.pid, e.rule, "
                        "e.decision, e.reason, e.detail, e.prev_hash, e.hash, s.netdev, s.gpu, "
                        "s.flows FROM events e LEFT JOIN sessions s ON s.id = e.session_id" +
                        w.sql() + " ORDER BY e.seq" + limit_sql(f));
    if (!st) return st.error();
    w.bind(*st);
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return {};
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
    return std::optional<Session>(read_session(*st));
}

std::int64_t Tally::other_refusals_total() const {
    std::int64_t n = 0;
    for (auto &[decision, count] : other_refusals)
        n += count;
    return n;
}

namespace {

constexpr std::int64_t hour_us = 3600LL * 1000000;

// One aggregated row of the report query: how many events of one kind and decision, for one
// owner, device and hour.
struct ReportRow {
    std::optional<std::int64_t> uid;
    std::optional<std::string> netdev, gpu;
    std::int64_t hour = 0;
    std::string kind;
    std::optional<std::string> decision, rule;
    std::int64_t events = 0, coalesced = 0, rx_bytes = 0;
};

void count(Tally &t, const ReportRow &r) {
    if (r.kind == kind::granted) {
        t.sessions += r.events;
        if (r.decision == "would-deny") t.would_deny_grants += r.events;
    } else if (r.kind == kind::denied) {
        if (r.decision == "deny")
            t.denials += r.events;
        else if (r.decision == "quota-exceeded")
            t.quota_refusals += r.events;
        else
            t.other_refusals[r.decision.value_or("unknown")] += r.events;
    } else if (r.kind == kind::coalesced) {
        t.other_refusals["coalesced"] += r.coalesced;
    } else if (r.kind == kind::ended) {
        t.rx_bytes += r.rx_bytes;
    } else if (r.kind == kind::revoked) {
        t.revocations += r.events;
    }
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
    where += "(e.kind IN ('request-granted', 'request-denied', 'session-ended', 'revoke') OR "
             "(e.kind = 'refusals-coalesced' AND e.decision = 'request-denied'))";
    auto st = j_.db().prepare(
        "SELECT coalesce(s.uid, e.uid), coalesce(s.netdev, json_extract(" + detail_json +
        ", '$.netdev')), coalesce(s.gpu, json_extract(" + detail_json +
        ", '$.gpu')), e.at_us / 3600000000, e.kind, e.decision, e.rule, count(*), sum(CASE WHEN "
        "e.kind = 'refusals-coalesced' THEN coalesce(json_extract(" +
        detail_json +
        ", '$.count'), 0) ELSE 0 END), sum(CASE WHEN e.kind = 'session-ended' THEN "
        "coalesce(json_extract(" +
        detail_json + ", '$.rx_bytes'), json_extract(" + detail_json +
        ", '$.end.rx_bytes'), s.rx_bytes, 0) ELSE 0 END) FROM events e LEFT JOIN sessions s ON "
        "s.id = e.session_id" +
        where + " GROUP BY 1, 2, 3, 4, 5, 6, 7");
    if (!st) return st.error();
    w.bind(*st);
    Report r;
    std::map<std::int64_t, Tally> users, hours;
    std::map<std::string, Tally> netdevs, gpus;
    std::map<std::optional<std::string>, std::int64_t> denied, quota;
    std::map<std::string, std::int64_t> decisions;
    for (;;) { // a read error is the caller's error, never a silently shorter report
        auto step = st->step();
        if (!step) return step.error();
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
        count(r.totals, row);
        if (row.uid) count(users[*row.uid], row);
        if (row.netdev) count(netdevs[*row.netdev], row);
        if (row.gpu) count(gpus[*row.gpu], row);
        count(hours[row.hour], row);
        if (row.kind == kind::denied) {
            if (row.decision == "deny") denied[row.rule] += row.events;
            if (row.decision == "quota-exceeded") quota[row.rule] += row.events;
            decisions[row.decision.value_or("unknown")] += row.events;
        } else if (row.kind == kind::coalesced) {
            decisions["coalesced"] += row.coalesced;
        }
    }
    for (auto &[uid, t] : users) {
        t.key = std::to_string(uid);
        r.by_user.push_back(std::move(t));
    }
    for (auto *m : {&netdevs, &gpus})
        for (auto &[key, t] : *m)
            t.key = key;
    r.by_netdev = values(netdevs);
    r.by_gpu = values(gpus);
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
