// Read-only access to a journal for the audit tools: filtered, streaming queries over sessions
// and events, one session with its events, and a report (per user, netdev, GPU, rule, hour). Works
// on the live file without blocking the daemon (WAL readers never block the writer) and on a copy
// without writing anything beside it: a file with no -wal beside it is opened immutable, so
// SQLite creates no -wal or -shm files; a file with a -wal but no -shm (a copy: a live journal
// always has both) is read from a private temporary copy, because SQLite would otherwise have
// to create the -shm beside it (impossible on read-only media). Paths are passed to SQLite
// percent-encoded, so no character in them is URI syntax.
#pragma once

#include "journal/identity.h"
#include "journal/records.h"
#include "journal/sqlite.h"
#include "knod/result.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace knod::journal {

struct Filter {
    std::optional<std::int64_t> since_us, until_us;
    std::optional<std::int64_t> uid;
    std::optional<std::string> netdev, gpu, rule, reason;
    std::optional<std::string> decision;   // events only: allow, deny, quota-exceeded, would-deny
    std::optional<std::string> kind;       // events only
    std::optional<std::int64_t> after_seq; // events only: those after this one (export --after)
    std::optional<std::string> session;    // events only: of this session (audit show)
    std::optional<std::int64_t> limit;
    bool newest = false; // with limit: the newest `limit` rows that match, still oldest first
};

// An event as the audit tools read it: the chained row plus what its session row says, for
// events whose own detail does not name the netdev, GPU or flows (a session-ended event).
struct EventRecord : StoredEvent {
    std::optional<std::string> session_netdev, session_gpu;
    std::optional<std::string> session_flows; // the sessions.flows column: a JSON array
};

struct Tally {
    // Counts for one user, netdev, GPU or hour (or everything) over a report's period. Each
    // refusal is counted as what it was: a denial (a deny rule, or no rule matched), a quota
    // refusal (a rule allowed the request but the caller's quota was full), or another decision
    // (isolation-violation, flow-conflict, driver-failure, journal-unavailable; "coalesced" for
    // refusals the daemon only counted, whose decision is not recorded).
    std::string key; // a uid (decimal), a netdev, a GPU, a Kubernetes namespace; empty in totals
    std::int64_t sessions = 0;       // grants (request-granted), permissive would-deny included
    std::int64_t rx_bytes = 0;       // of sessions that ended in the period
    std::int64_t denials = 0;        // decision "deny"
    std::int64_t quota_refusals = 0; // decision "quota-exceeded"
    std::map<std::string, std::int64_t> other_refusals; // by decision
    std::int64_t revocations = 0;
    std::int64_t would_deny_grants = 0; // grants that permissive mode made over a refusal

    std::int64_t other_refusals_total() const;
};

// A rule and how often it decided; no rule is a default deny (no rule matched).
struct RuleCount {
    std::optional<std::string> rule;
    std::int64_t count = 0;
};

struct Report {
    Tally totals;
    std::vector<Tally> by_user; // numeric uid order
    std::vector<Tally> by_netdev, by_gpu;
    // The pod's namespace an event names (detail.pod.namespace, a string), else the one its
    // session's grant named (a revocation names none); events of no pod count in no namespace.
    std::vector<Tally> by_k8s_namespace;
    std::vector<RuleCount> denied_by_rule; // decision deny, most first
    std::vector<RuleCount> quota_by_rule;  // decision quota-exceeded, most first
    std::vector<std::pair<std::string, std::int64_t>> refusals_by_decision; // most first
    std::vector<std::pair<std::int64_t, Tally>> timeline; // hour start (us), only hours with counts
};

// The times a journal can hold: a value outside [1970-01-01, 2200-01-01) in microseconds is
// one no daemon wrote (a hostile file's int64 extremes), refused by every reader with the row
// and field named (Errc::invalid_argument: exit 2), as are negative counts and uids.
inline constexpr std::int64_t earliest_us = 0; // the epoch: tests write hours after it
inline constexpr std::int64_t latest_us = 7258118400LL * 1000000;

// The largest detail a reader takes: the daemon's are a few hundred bytes (at most 64 flows a
// binding). Longer, or holding an object of more than knod::max_json_object_keys keys (the
// daemon's have a few dozen), is an impossible value as above: parsing it would cost time
// (nlohmann::ordered_json inserts each key by a linear search) for nothing a daemon wrote.
inline constexpr std::size_t max_detail_bytes = 1 << 20;

// The values of an events row (seq, at_us, kind, session_id, uid, pid, ..., detail) the audit
// tools compute with, show as times or parse, checked as above: an error naming the event and
// the field.
Result<void> check_event_row(const Statement &st);

// The columns after seq of a row of "SELECT seq, at_us, kind, session_id, uid, pid, rule,
// decision, reason, detail, ... FROM events": the event as stored.
Event event_from_row(const Statement &st);

// SQL as compared: comments dropped (SQLite stores those inside a CREATE TABLE, and editing one
// in schema/ must not fail older journals), runs of white space one space.
std::string normalized_sql(const std::string &sql);

// Errors that say the journal was tampered with (the CLI's exit 1, where other errors are exit
// 2) are Errc::corrupt with this mark in their message.
inline constexpr std::string_view tampered_mark = "tampered";
bool is_tampering(const Error &e);

// Seconds any one read-only connection may spend in SQLite before its statements stop with an
// error (a runaway query on a hostile file): KNOD_AUDIT_TIME_BUDGET, default 3600.
std::int64_t audit_time_budget_s();

// A journal opened read-only as described above; removes its private copy, if any, on close.
// The file is hostile input: opening compares the schema's objects first (only the journal's
// own tables, indexes and triggers; a view, virtual table or unknown object is tampering), and
// every connection runs with SQLite's defensive settings (SQLITE_DBCONFIG_DEFENSIVE,
// trusted_schema off, no extensions, triggers and views off) and a time budget.
class ReadOnlyJournal {
  public:
    struct Budget; // the deadline the progress handler compares
    static Result<ReadOnlyJournal> open(const std::string &path);
    Database &db() { return db_; }
    // A second read-only connection to the same file (or private copy), for work on another
    // thread; it must be closed before this object goes.
    Result<Database> another_connection() const;

  private:
    struct PrivateCopy; // a temporary directory, removed with everything in it
    ReadOnlyJournal(std::shared_ptr<PrivateCopy> copy, std::shared_ptr<Budget> budget,
                    std::string uri, Database db)
        : copy_(std::move(copy)), budget_(std::move(budget)), uri_(std::move(uri)),
          db_(std::move(db)) {}
    std::shared_ptr<PrivateCopy> copy_; // declared first: outlives the connection
    std::shared_ptr<Budget> budget_;    // outlives the connections whose handler reads it
    std::string uri_;
    Database db_;
};

class JournalReader {
  public:
    static Result<JournalReader> open(const std::string &path);

    // Calls `each` per matching row in time order; stop early by returning false.
    Result<void> sessions(const Filter &f, const std::function<bool(const Session &)> &each);
    Result<void> events(const Filter &f, const std::function<bool(const EventRecord &)> &each);
    Result<std::optional<Session>> session(const std::string &id);
    // Counts events in [since, until): a session is counted by its grant, its bytes by its end,
    // a revocation for the session's owner. Honours uid, netdev and gpu of `f` (a session's
    // owner and device; a refusal's caller and requested device). Refusals the daemon only
    // counted (refusals-coalesced) carry no device: they count per user and per hour only.
    Result<Report> report(const Filter &f);
    // The journal's id and writing host (empty fields in a journal older than schema 4).
    Result<JournalIdentity> identity() { return read_identity(j_.db()); }

  private:
    explicit JournalReader(ReadOnlyJournal j) : j_(std::move(j)) {}
    ReadOnlyJournal j_;
};

} // namespace knod::journal
