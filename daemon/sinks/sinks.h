// Copies of journal events for the host's own audit trails: the system journal (structured
// entries, one MESSAGE_ID per event type) and Linux audit (grants, denials, revocations). The
// SQLite journal stays the record of truth; a sink never blocks a decision: records go through
// a bounded queue to a thread of their own, and what does not fit is counted and dropped.
#pragma once

#include "daemon/journal/records.h"

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
    virtual void write(const SinkRecord &r) = 0;
};

// sd_journal_send; fields KNOD_EVENT, KNOD_UID, KNOD_BINDING, KNOD_NETDEV, KNOD_GPU, KNOD_RULE,
// KNOD_DECISION, KNOD_REASON, and MESSAGE_ID per kind (message_id()).
class JournaldSink : public Sink {
  public:
    const char *name() const override { return "journald"; }
    void write(const SinkRecord &r) override;
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
    void write(const SinkRecord &r) override;

  private:
    explicit LinuxAuditSink(int fd) : fd_(fd) {}
    int fd_;
};

class SinkQueue {
  public:
    explicit SinkQueue(std::vector<std::unique_ptr<Sink>> sinks, std::size_t capacity = 4096);
    ~SinkQueue(); // drains what is queued, then stops
    // Never blocks: a full queue drops the record and counts it.
    void offer(SinkRecord r);
    std::uint64_t dropped() const { return dropped_.load(); }
    std::uint64_t written() const { return written_.load(); }
    std::vector<std::string> names() const;

  private:
    void run();
    std::vector<std::unique_ptr<Sink>> sinks_;
    std::size_t capacity_;
    std::mutex mu_;
    std::condition_variable wake_;
    std::deque<SinkRecord> queue_;
    bool stopping_ = false;
    std::atomic<std::uint64_t> dropped_{0}, written_{0};
    std::thread thread_;
};

} // namespace knod::sinks
