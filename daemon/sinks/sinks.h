// Copies of journal events for the host's own audit trails: the system journal (structured
// entries, one MESSAGE_ID per event type) and Linux audit (grants, denials, revocations). The
// SQLite journal stays the record of truth; a sink never blocks a decision: records go through
// a bounded queue to a thread of their own, and what does not fit is counted and dropped.
// What a sink refuses is counted too (per sink: written, failed, dropped), and a sink that starts
// or stops failing is reported once per change, so the missing copies are never silent.
#pragma once

#include "journal/records.h"
#include "knod/result.h"

#include <chrono>
#include <functional>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace knod::sinks {

struct SinkRecord {
    journal::Event event;
    std::string netdev;
    std::string gpu;
};

class Sink {
  public:
    virtual ~Sink() = default;
    virtual const char *name() const = 0;
    // An error says why the record did not reach the sink (with the system's reason).
    virtual Result<void> write(const SinkRecord &r) = 0;
    // Whether it keeps chain heads (journal-anchor records); the others skip them.
    virtual bool keeps_heads() const { return false; }
};

// sd_journal_send; fields KNOD_EVENT, KNOD_UID, KNOD_BINDING, KNOD_NETDEV, KNOD_GPU, KNOD_RULE,
// KNOD_DECISION, KNOD_REASON, and MESSAGE_ID per kind (message_id()). Anchor records (the chain
// head) also carry KNOD_JOURNAL_ID, KNOD_JOURNAL_PATH, KNOD_SEQ and KNOD_HASH, from the
// record's detail, so `audit verify` can match each to one journal, and KNOD_HEAD_RUN and
// KNOD_HEAD_N (the daemon run's id and the head's number in it: 1, 2, ...), so it can name the
// heads journald did not keep. Heads go at LOG_WARNING: journald's rate limit keeps one pool per
// priority level (notice and info share one), and the per-event lines (info, notice) must never
// use up the heads' share.
class JournaldSink : public Sink {
  public:
    const char *name() const override { return "journald"; }
    bool keeps_heads() const override { return true; }
    Result<void> write(const SinkRecord &r) override;
    // Where sd_journal_send sends (fixed in libsystemd).
    static constexpr const char *socket_path = "/run/systemd/journal/socket";
    // The MESSAGE_ID for an event kind (128-bit, fixed: tools filter on it).
    static const char *message_id(const std::string &kind);
};

// libaudit AUDIT_TRUSTED_APP records for grants, denials and revocations. Only made where
// the kernel's audit interface opens.
class LinuxAuditSink : public Sink {
  public:
    static std::unique_ptr<LinuxAuditSink> open();
    ~LinuxAuditSink() override;
    const char *name() const override { return "linux-audit"; }
    Result<void> write(const SinkRecord &r) override;

  private:
    explicit LinuxAuditSink(int fd) : fd_(fd) {}
    int fd_;
};

// One sink's counts, as status shows them.
struct SinkStats {
    std::string name;
    std::uint64_t written = 0;       // records the sink took
    std::uint64_t failed = 0;        // records the sink refused (write returned an error)
    std::uint64_t dropped = 0;       // records that did not fit the queue (never offered to it)
    bool failing = false;            // its last write failed
    std::string last_error;          // why the last failed write failed; kept after a recovery
    std::uint64_t heads_written = 0; // chain heads (journal-anchor records) the sink took
    std::int64_t last_head_seq = 0;  // the event the newest of them names
};

// A sink started failing (`failing`, with the error) or works again. Called on the queue's
// thread, at most once per change and, per sink, at most once per hold-off interval.
using SinkTransition =
    std::function<void(const std::string &sink, bool failing, const std::string &error)>;

class SinkQueue {
  public:
    // `hold_off`: after a reported change, the next one of that sink waits at least this long
    // (a sink that fails every other record reports two changes per interval, not two per
    // record; the reports are records too, and go through the sinks).
    explicit SinkQueue(std::vector<std::unique_ptr<Sink>> sinks, std::size_t capacity = 4096,
                       std::chrono::milliseconds hold_off = std::chrono::seconds(10));
    ~SinkQueue(); // drains what is queued, then stops
    // Set before the first offer().
    void on_transition(SinkTransition listener) { listener_ = std::move(listener); }
    // Never blocks: a full queue drops the record and counts it. A chain head is never the one
    // dropped: it takes the place of the oldest queued record that is not one.
    void offer(SinkRecord r);
    std::uint64_t dropped() const { return dropped_.load(); }
    std::uint64_t written() const { return written_.load(); }
    std::vector<std::string> names() const;
    std::vector<SinkStats> stats() const;
    // Waits until everything offered so far was handed to the sinks (tests).
    void drain();

  private:
    struct State {
        std::uint64_t written = 0, failed = 0, heads_written = 0;
        std::int64_t last_head_seq = 0;
        bool failing = false; // the state last reported (or not yet reported) as a change
        bool last_failed = false;
        std::string last_error;
        std::chrono::steady_clock::time_point reported{};
        bool ever_reported = false;
    };
    void run();
    void account(std::size_t i, const Result<void> &r, std::int64_t head_seq);
    std::vector<std::unique_ptr<Sink>> sinks_;
    std::size_t capacity_;
    std::chrono::milliseconds hold_off_;
    SinkTransition listener_;
    mutable std::mutex mu_;
    std::condition_variable wake_, idle_;
    std::deque<SinkRecord> queue_;
    std::vector<State> state_; // guarded by mu_
    bool stopping_ = false, busy_ = false;
    std::atomic<std::uint64_t> dropped_{0}, written_{0};
    std::thread thread_;
};

} // namespace knod::sinks
