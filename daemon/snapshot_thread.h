// Publishes the auditors' snapshot of the journal (journal/snapshot.h) from a thread of its
// own, so that a copy (whole-file, once per publication) and a reader who holds the published
// copy's lock never delay a commit or the event loop. It publishes after the chain head moved,
// at most once per `interval`, and never sooner than ten times the last publication's duration
// after it (a large journal costs at most a tenth of one core and of the disk's time).
#pragma once

#include "journal/snapshot.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace knod::daemon {

// What `status` says of the snapshot (AuditTrail::journal_problem).
struct SnapshotStatus {
    std::int64_t seq = 0; // the last published copy's last event
    std::string failing;  // why the last publication failed; "" once one succeeds
    std::int64_t failing_since_us = 0;
};

class SnapshotThread {
  public:
    SnapshotThread(journal::SnapshotPublisher publisher, std::chrono::milliseconds interval);
    ~SnapshotThread(); // stops without a last publication (see publish_now)
    SnapshotThread(const SnapshotThread &) = delete;
    SnapshotThread &operator=(const SnapshotThread &) = delete;

    // The chain head moved (any thread; never blocks).
    void note_commit();
    // Publishes now and waits for it (a stop: after the last record is written), unless the
    // head has not moved since the last publication.
    void publish_now();
    SnapshotStatus status() const;

  private:
    void run();
    void publish_locked(std::unique_lock<std::mutex> &lock);

    journal::SnapshotPublisher publisher_;
    std::chrono::milliseconds interval_;
    mutable std::mutex mu_;
    std::condition_variable wake_;
    bool dirty_ = false; // the first commit (daemon-start) brings the first publication
    bool stopping_ = false;
    bool publishing_ = false;
    std::chrono::steady_clock::time_point next_{};
    SnapshotStatus status_;
    std::thread thread_;
};

} // namespace knod::daemon
