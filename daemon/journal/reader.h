// Read-only access to a journal for the audit tools: filtered, streaming queries over sessions
// and events, one session with its events, and a per-user / per-netdev report. Works on the
// live file without blocking the daemon (WAL readers never block the writer) and on a copy
// without writing anything: a file with no -wal beside it is opened immutable, so SQLite
// creates no -wal or -shm files.
#pragma once

#include "daemon/journal/records.h"
#include "daemon/journal/sqlite.h"
#include "knod/result.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace knod::journal {

struct Filter {
    std::optional<std::int64_t> since_us, until_us;
    std::optional<std::int64_t> uid;
    std::optional<std::string> netdev, gpu, rule, reason;
    std::optional<std::string> decision; // events only: allow, deny, quota-exceeded, would-deny
    std::optional<std::string> kind;     // events only
    std::optional<std::int64_t> limit;
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

class JournalReader {
  public:
    static Result<JournalReader> open(const std::string &path);

    // Calls `each` per matching row in time order; stop early by returning false.
    Result<void> sessions(const Filter &f, const std::function<bool(const Session &)> &each);
    Result<void> events(const Filter &f, const std::function<bool(const StoredEvent &)> &each);
    Result<std::optional<Session>> session(const std::string &id);
    Result<Report> report(const Filter &f);

  private:
    explicit JournalReader(Database db) : db_(std::move(db)) {}
    Database db_;
};

// Opens read-only as described above; shared with chain verification.
Result<Database> open_read_only(const std::string &path);

} // namespace knod::journal
