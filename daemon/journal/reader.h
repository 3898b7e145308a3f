// Read-only access to a journal for the audit tools: filtered, streaming queries over sessions
// and events, one session with its events, and a per-user / per-netdev report. Works on the
// live file without blocking the daemon (WAL readers never block the writer) and on a copy
// without writing anything beside it: a file with no -wal beside it is opened immutable, so
// SQLite creates no -wal or -shm files; a file with a -wal but no -shm (a copy: a live journal
// always has both) is read from a private temporary copy, because SQLite would otherwise have
// to create the -shm beside it (impossible on read-only media). Paths are passed to SQLite
// percent-encoded, so no character in them is URI syntax.
#pragma once

#include "daemon/journal/identity.h"
#include "daemon/journal/records.h"
#include "daemon/journal/sqlite.h"
#include "knod/result.h"

#include <functional>
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
    std::optional<std::int64_t> limit;
};

// An event as the audit tools read it: the chained row plus what its session row says, for
// events whose own detail does not name the netdev, GPU or flows (a session-ended event).
struct EventRecord : StoredEvent {
    std::optional<std::string> session_netdev, session_gpu;
    std::optional<std::string> session_flows; // the sessions.flows column: a JSON array
};

struct Tally {
    std::string key; // a uid, a netdev or a rule
    std::int64_t sessions = 0;
    std::int64_t rx_bytes = 0;
    std::int64_t denials = 0;
    std::int64_t revocations = 0;
};

struct Report {
    std::vector<Tally> by_user;
    std::vector<Tally> by_netdev;
    std::vector<std::pair<std::string, std::int64_t>> top_denied_rules;
};

// A journal opened read-only as described above; removes its private copy, if any, on close.
class ReadOnlyJournal {
  public:
    static Result<ReadOnlyJournal> open(const std::string &path);
    Database &db() { return db_; }

  private:
    struct PrivateCopy; // a temporary directory, removed with everything in it
    ReadOnlyJournal(std::shared_ptr<PrivateCopy> copy, Database db)
        : copy_(std::move(copy)), db_(std::move(db)) {}
    std::shared_ptr<PrivateCopy> copy_; // declared first: outlives the connection
    Database db_;
};

class JournalReader {
  public:
    static Result<JournalReader> open(const std::string &path);

    // Calls `each` per matching row in time order; stop early by returning false.
    Result<void> sessions(const Filter &f, const std::function<bool(const Session &)> &each);
    Result<void> events(const Filter &f, const std::function<bool(const EventRecord &)> &each);
    Result<std::optional<Session>> session(const std::string &id);
    Result<Report> report(const Filter &f);
    // The journal's id and writing host (empty fields in a journal older than schema 4).
    Result<JournalIdentity> identity() { return read_identity(j_.db()); }

  private:
    explicit JournalReader(ReadOnlyJournal j) : j_(std::move(j)) {}
    ReadOnlyJournal j_;
};

} // namespace knod::journal
