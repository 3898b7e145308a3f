// The session journal's writer. Every call returns only once its change is durable on disk
// (WAL, synchronous=FULL). Calls from several threads at once share one transaction and one
// fsync: a single writer thread takes everything queued, commits it together, and answers all.
#pragma once

#include "journal/identity.h"
#include "journal/records.h"
#include "journal/sqlite.h"
#include "knod/result.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace knod::journal {

// Opens (creating if needed) and migrates a journal database. Fails with Errc::too_new when the
// file's schema is newer than this build knows.
Result<Database> open_and_migrate(const std::string &path);
int latest_schema_version();

// The last event's sequence number and hash: the chain head. Nullopt for a journal with no
// event; Errc::corrupt when its hash is not a hash.
struct ChainHead {
    std::int64_t seq = 0;
    Hash hash{};
};
Result<std::optional<ChainHead>> read_head(Database &db);

class Journal {
  public:
    static Result<std::unique_ptr<Journal>> open(const std::string &path);
    // After an asynchronous commit the anchor (journal.db.anchor, the newest chain head beside
    // the database) is rewritten at most once per `interval`: a rename beside the database
    // costs the writer more CPU than a pair's own SQLite work on a VM's ext4 (#54). It follows
    // at the latest `interval` after the newest commit, at once for a synchronous call (which
    // may read it next) and at close. verify accepts an anchor behind the database.
    static constexpr std::chrono::milliseconds default_anchor_interval{100};
    static Result<std::unique_ptr<Journal>> open(const std::string &path,
                                                 std::chrono::milliseconds anchor_interval);
    ~Journal();
    Journal(const Journal &) = delete;
    Journal &operator=(const Journal &) = delete;

    // Appends one event; returns its sequence number once durable.
    Result<std::int64_t> append(Event event);
    // A policy load (daemon-start, policy-reload): stores the policy's text under its digest
    // (once per digest) and appends the event, whose detail gets "policy": DIGEST, in one
    // transaction.
    Result<std::int64_t> append_policy_load(Event load, PolicyText policy);
    // Writes a new session row and its grant event in one transaction. The event's detail (a
    // JSON object) gets "session": every value of the row as written, so verify can check the
    // row against the chain.
    Result<std::int64_t> open_session(Session session, Event grant);
    // Ends a session (reason, final counters) and appends its closing event in one transaction;
    // the event's detail gets "end": the values the row gets (ended_us, end_reason, rx_bytes,
    // rx_packets, dropped_packets).
    Result<std::int64_t> close_session(const std::string &id, const std::string &reason,
                                       const Counters &counters, Event closing);
    // Closes every session still open (after a crash), one closing event each, except those in
    // `keep` (taken back after a restart). Returns their ids.
    Result<std::vector<std::string>> close_open_sessions(const std::string &reason,
                                                         const std::set<std::string> &keep = {});
    // A stop that keeps its bindings (systemd's fd store): what the next start needs to take
    // each open session back, by session id, written in one transaction.
    Result<void> hand_off(const std::map<std::string, std::string> &handoffs);
    // The next start: the handoffs of open sessions, cleared in the same transaction, so a
    // later crash never takes back stale state.
    Result<std::map<std::string, std::string>> take_handoffs();
    // The detail of the newest daemon-stop, if no daemon-start came after it (nullopt else):
    // what a start checks a record kept outside the journal against, so that only the last
    // stop's record is taken back, and only once.
    Result<std::optional<std::string>> last_stop_detail();
    // Retention: deletes the oldest events (those before `before_us`, and beyond the newest
    // `keep_events`) and every session row whose grant event goes with them or is gone (rows
    // an older build's prune left behind), leaving a checkpoint and a
    // retention-prune event so the rest still verifies. Open sessions and their events are
    // kept. Returns how many events went. `retain_age_us`: the age setting `before_us` comes
    // from; the prune event records it with `keep_events` and the newest pruned event's time,
    // so verify can tell a prune younger than the retention in force (#31).
    Result<std::int64_t> prune(std::optional<std::int64_t> before_us,
                               std::optional<std::int64_t> keep_events,
                               std::optional<std::int64_t> retain_age_us = std::nullopt);

    // The same, without waiting: `done` runs on the writer thread once the change is durable
    // (or failed). Lets a single-threaded caller keep serving while concurrent calls share
    // one commit.
    using Done = std::function<void(Result<std::int64_t>)>;
    void append_async(Event event, Done done);
    // For a record nobody waits for (an activation, a refusal): it joins the next commit, made
    // at the latest `linger` after it was queued, instead of taking a commit (a sync to disk) of
    // its own; a record that trails a call then shares the commit of the call after it.
    static constexpr std::chrono::milliseconds linger{2};
    void append_soon(Event event, Done done);
    void append_policy_load_async(Event load, PolicyText policy, Done done);
    void open_session_async(Session session, Event grant, Done done);
    void close_session_async(const std::string &id, const std::string &reason,
                             const Counters &counters, Event closing, Done done);

    JournalStats stats() const;
    // Called on the writer thread after each commit that moved the chain head, with the new
    // head; must not block (the daemon copies it to the system journal as a second anchor).
    void set_commit_listener(std::function<void(std::int64_t seq, const Hash &head)> listener);
    const std::string &path() const { return path_; }
    // This journal's id and this host, as recorded in the journal when it was opened.
    const JournalIdentity &identity() const { return identity_; }

  private:
    class Writer;
    using Work = std::function<Result<std::int64_t>(Writer &)>;
    struct Pending {
        Work work;
        Done done;
        bool lingers = false;  // append_soon: may wait up to `linger` for company
        bool blocking = false; // submit(): a thread waits for it
        std::chrono::steady_clock::time_point queued{};
    };

    Journal(std::string path, JournalIdentity identity, std::unique_ptr<Writer> writer,
            std::chrono::milliseconds anchor_interval);
    Result<std::int64_t> submit(Work work);
    void submit_async(Work work, Done done, bool lingers = false, bool blocking = false);
    static Work policy_load_work(Event load, PolicyText policy);
    void note_anchor(Result<void> written); // counts a failed anchor write for stats()
    void write_anchor_now();                // the writer thread's: anchor, then not pending
    int commits_since_checkpoint_ = 0;      // the writer thread's only
    // The writer thread's only: a commit moved the head since the anchor was last written.
    bool anchor_pending_ = false;
    std::optional<std::chrono::steady_clock::time_point> anchor_written_; // never yet: none
    std::chrono::milliseconds anchor_interval_ = default_anchor_interval;
    static Work open_session_work(Session s, Event grant);
    static Work close_session_work(const std::string &id, const std::string &reason,
                                   const Counters &counters, Event closing);
    void run();

    std::string path_;
    JournalIdentity identity_;
    std::unique_ptr<Writer> writer_;
    mutable std::mutex mu_;
    std::condition_variable wake_;
    std::deque<Pending> queue_;
    bool stopping_ = false;
    JournalStats stats_;
    std::function<void(std::int64_t, const Hash &)> on_commit_;
    std::thread thread_;
};

} // namespace knod::journal
