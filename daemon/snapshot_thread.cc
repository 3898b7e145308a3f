#include "daemon/snapshot_thread.h"

#include "journal/records.h"

#include <algorithm>
#include <iostream>
#include <pthread.h>

namespace knod::daemon {

SnapshotThread::SnapshotThread(journal::SnapshotPublisher publisher,
                               std::chrono::milliseconds interval)
    : publisher_(std::move(publisher)), interval_(interval), thread_([this] { run(); }) {}

SnapshotThread::~SnapshotThread() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void SnapshotThread::note_commit() {
    {
        std::lock_guard lock(mu_);
        if (dirty_) return;
        dirty_ = true;
    }
    wake_.notify_all();
}

void SnapshotThread::publish_now() {
    std::unique_lock lock(mu_);
    wake_.wait(lock, [this] { return !publishing_; });
    if (dirty_) publish_locked(lock);
}

SnapshotStatus SnapshotThread::status() const {
    std::lock_guard lock(mu_);
    return status_;
}

// Called with the lock held; drops it for the copy, so note_commit() and status() never wait
// for one.
void SnapshotThread::publish_locked(std::unique_lock<std::mutex> &lock) {
    publishing_ = true;
    dirty_ = false;
    lock.unlock();
    auto started = std::chrono::steady_clock::now();
    auto published = publisher_.publish();
    auto ended = std::chrono::steady_clock::now();
    lock.lock();
    publishing_ = false;
    // A failed attempt counts too: a reader who holds the copy must not make the daemon copy
    // the journal into the work file more often than a successful publication would.
    next_ =
        ended + std::max<std::chrono::steady_clock::duration>(interval_, (ended - started) * 10);
    if (published) {
        status_.seq = published->seq;
        status_.failing.clear();
        status_.failing_since_us = 0;
    } else {
        // Tried again at the next interval whether or not the head moves.
        dirty_ = true;
        if (status_.failing.empty()) {
            status_.failing_since_us = journal::now_us();
            std::cerr << "knod-policyd: the auditors' snapshot could not be published: "
                      << published.error().message << std::endl;
        }
        status_.failing = published.error().message;
    }
    wake_.notify_all();
}

void SnapshotThread::run() {
    // A name `top -H`, /proc/PID/task/*/comm and the control bench know it by.
    pthread_setname_np(pthread_self(), "knod-snapshot");
    std::unique_lock lock(mu_);
    for (;;) {
        wake_.wait(lock, [this] { return stopping_ || (dirty_ && !publishing_); });
        if (stopping_) return;
        if (wake_.wait_until(lock, next_, [this] { return stopping_; })) return;
        if (dirty_ && !publishing_) publish_locked(lock);
    }
}

} // namespace knod::daemon
