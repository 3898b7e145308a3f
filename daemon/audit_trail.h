// The daemon's side of the session journal: opens it (again, after it was unavailable), writes
// events without blocking the loop, keeps what could not be written and retries it in order,
// coalesces repeated refusals, applies retention, and copies every event to the sinks
// (journald, Linux audit). The binding manager says what happened; this says it durably.
#pragma once

#include "daemon/refusal_coalescer.h"
#include "daemon/sinks/sinks.h"
#include "daemon/snapshot_thread.h"
#include "journal/records.h"
#include "knod/result.h"
#include "policy/policy.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

namespace knod::journal {
class Journal; // journal/journal.h: SQLite stays out of the daemon's headers
} // namespace knod::journal

namespace knod::daemon {

class Metrics; // daemon/metrics.h

// Runs a function on the daemon's event-loop thread (journal completions arrive on the
// journal's writer thread and come back through this).
using Post = std::function<void(std::function<void()>)>;
using Done = std::function<void(Result<void>)>;
// A journal write's answer (the event's sequence number), on the journal's writer thread.
using Written = std::function<void(Result<std::int64_t>)>;

struct AuditConfig {
    std::string journal_path;
    // Repeated refusals of one uid and kind are journaled once per window, with a count.
    std::chrono::seconds refusal_window{10};
    // Retention, applied at start and hourly: events older than this, beyond this many.
    std::optional<std::chrono::seconds> retain_age;
    std::optional<std::int64_t> retain_events;
    // The auditors' snapshot (journal/snapshot.h), published at most this often after the
    // head moved; none when zero. Its files get `snapshot_mode` (0640 where the state dir's
    // group reads it); the snapshot dir must exist (daemon/state_dir.h).
    std::chrono::milliseconds snapshot_interval{0};
    mode_t snapshot_mode = 0600;
};

class AuditTrail {
  public:
    // `policy`: the policy in force, read (never kept) for the digest every decision names and
    // the text a policy load stores. It must outlive the trail.
    AuditTrail(AuditConfig config, const policy::Policy &policy, Post post);
    ~AuditTrail();

    // The journal, opened now if it was not yet (or could not be before); null while it cannot
    // be opened.
    journal::Journal *journal();
    // Closes the journal, waiting for its writer (its completions post to the loop).
    void close();

    // Writes an event now (asynchronously), or keeps it to write once the journal is back.
    void record(journal::Event e);
    // A policy load (daemon-start, policy-reload): the event, and the policy's text stored
    // under its digest, in one transaction (now, or kept for when the journal is back).
    void record_load(journal::Event e);
    // Journals a refusal unless its (uid, kind) already has a record in the current window;
    // `one_by_one` (the host's root: daemon/peer.h, Peer::host_root) journals each.
    void refuse(journal::Event e, bool one_by_one = false);
    // Keeps an event to write with the next retry (it already went to the sinks).
    void keep(journal::Event e);
    // Journals a session's end (now, or kept); `durable` runs once it is on disk or kept.
    void close_session(const std::string &id, const std::string &reason,
                       const journal::Counters &counters, journal::Event closing,
                       const std::string &netdev, const std::string &gpu, Done durable);
    // A grant's session row and event in one commit; `done` runs on the writer thread.
    void open_session(const journal::Session &s, journal::Event grant, Written done);
    // Puts "policy": the digest in force into the event's detail.
    void name_policy(journal::Event &e) const;
    // Copies an event to the sinks only (the journal gets it another way).
    void forward(const journal::Event &e, const std::string &netdev = {},
                 const std::string &gpu = {});

    // Periodic work: the refusal windows that closed, hourly retention, retrying kept records.
    void tick(std::int64_t now_us);
    // Retries kept records on the journal's writer thread, one at a time, in order.
    void flush_pending_async();
    // Writes the kept records now, in order, waiting (shutdown and hand-off only).
    Result<void> flush_pending_now();
    // From now on everything is written synchronously, in order (shutdown, hand-off).
    void stop();
    // The last records: every refusal window closed now, then `last` (daemon-stop), then all
    // kept records written, waiting. Says on stderr what could not be written.
    void finish(journal::Event last);
    // Applies the retention settings now; returns how many events went.
    Result<std::int64_t> apply_retention();

    // Copies of every event go here too; optional. A sink that starts or stops failing
    // becomes a sink-failing / sink-recovered event.
    void set_sinks(sinks::SinkQueue *sinks);
    const sinks::SinkQueue *sinks() const { return sinks_; }
    // Where refusals (before coalescing) and session commit latencies are counted; optional.
    // It must outlive the trail's journal (its writer observes the latencies).
    void set_metrics(Metrics *metrics) { metrics_ = metrics; }
    bool open() const { return journal_ != nullptr; }
    std::size_t pending() const { return pending_.size(); }
    std::uint64_t dropped() const { return dropped_records_; }
    // The journal's write figures (all zero while it is not open).
    journal::JournalStats journal_stats() const;
    // What is wrong with the journal now, for `status`: "" when it opens, commits and its
    // anchor advances; otherwise why not ("anchor not advancing: ...: no space left on the
    // device (ENOSPC); 3 failed write(s)").
    std::string journal_problem() const;

  private:
    struct PendingEnd {
        std::string id;
        std::string reason;
        journal::Counters counters;
        journal::Event event;
    };
    struct PendingLoad {
        journal::Event event;
        journal::PolicyText policy;
    };
    using Pending = std::variant<journal::Event, PendingEnd, PendingLoad>;
    void keep_record(Pending record);
    void record_coalesced(std::int64_t now_us, bool all);
    // The pod a refusal's detail names (its JSON), the coalescer's scope; empty for none.
    static std::string pod_of(const journal::Event &e);
    // Writes one kept record, waiting, or on the writer thread.
    Result<std::int64_t> write_now(const Pending &record);
    void write_async(const Pending &record, Written done);
    void report_unwritten(const Result<void> &flushed) const;
    bool writing_async() { return pending_.empty() && !stopping_ && journal(); }

    AuditConfig config_;
    const policy::Policy &policy_;
    Post post_;
    // Declared before the journal, so it outlives the journal's writer thread, whose commit
    // listener tells it (close() keeps the same order).
    std::unique_ptr<SnapshotThread> snapshots_;
    std::unique_ptr<journal::Journal> journal_;
    RefusalCoalescer refusals_;
    std::deque<Pending> pending_;
    // The outcome of the kept record being retried now (pending_.front()); null when none is.
    enum { flush_running, flush_written, flush_failed };
    std::shared_ptr<std::atomic<int>> flushing_;
    bool stopping_ = false; // shutdown or hand-off: records are written synchronously, in order
    std::uint64_t dropped_records_ = 0;
    sinks::SinkQueue *sinks_ = nullptr;
    Metrics *metrics_ = nullptr;
    // Sink reports are posted from the sink thread; one that runs after the trail is gone
    // finds this expired.
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    std::int64_t last_retention_us_ = 0;
    // The chain heads this run sent to the sinks: numbered 1, 2, ... under a random run id, so
    // `audit verify` can name those journald did not keep. Shared with the commit listener, which
    // runs on the journal's writer thread and is set again when the journal reopens.
    struct Heads {
        std::string run;
        std::atomic<std::int64_t> sent{0};
        std::atomic<std::int64_t> last_us{0};
    };
    std::shared_ptr<Heads> heads_ = std::make_shared<Heads>();
};

} // namespace knod::daemon
