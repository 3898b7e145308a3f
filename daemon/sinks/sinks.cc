#include "daemon/sinks/sinks.h"

#include "knod/untrusted.h"

#include <libaudit.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace knod::sinks {

const char *JournaldSink::message_id(const std::string &kind) {
    static const std::pair<const char *, const char *> ids[] = {
        {journal::kind::granted, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e01"},
        {journal::kind::denied, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e02"},
        {journal::kind::ended, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e03"},
        {journal::kind::revoked, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e04"},
        {journal::kind::reload, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e05"},
        {journal::kind::daemon_start, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e06"},
        {journal::kind::daemon_stop, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e07"},
        {journal::kind::prune, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e08"},
        {journal::kind::anchor, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e09"},
        {journal::kind::sink_failing, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e0a"},
        {journal::kind::sink_recovered, "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e0b"},
    };
    for (auto &[k, id] : ids)
        if (kind == k) return id;
    return "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e00"; // any other event
}

namespace {

// The anchor's fields from its detail ({"journal_id", "path", "seq", "hash"}); empty where
// absent, so every record has the same fields.
struct AnchorFields {
    std::string journal_id, path, seq, hash, run, n;
};

AnchorFields anchor_fields(const journal::Event &e) {
    AnchorFields a;
    if (e.kind != journal::kind::anchor || !e.detail) return a;
    auto j = nlohmann::json::parse(*e.detail, nullptr, false);
    if (!j.is_object()) return a;
    auto text = [&](const char *key) {
        auto it = j.find(key);
        if (it == j.end()) return std::string();
        return it->is_string() ? it->get<std::string>() : it->dump();
    };
    return {text("journal_id"), text("path"), text("seq"), text("hash"), text("run"), text("n")};
}

// The event a chain head names; 0 for any other record.
std::int64_t head_seq(const journal::Event &e) {
    if (e.kind != journal::kind::anchor || !e.detail) return 0;
    auto j = nlohmann::json::parse(*e.detail, nullptr, false);
    if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_integer()) return 0;
    return j["seq"].get<std::int64_t>();
}

} // namespace

Result<void> JournaldSink::write(const SinkRecord &r) {
    // sd_journal_send returns success when journald's socket does not exist ("fail silently if
    // the journal is not available"): look first, so a host without journald counts failures.
    struct stat st {};
    if (::stat(socket_path, &st) != 0)
        return make_error(Errc::unavailable,
                          std::string("no journald: ") + socket_path + ": " + std::strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return make_error(Errc::unavailable,
                          std::string("no journald: ") + socket_path + " is not a socket");
    const journal::Event &e = r.event;
    std::string message = "knod-policy " + e.kind;
    if (e.session_id) message += " binding " + *e.session_id;
    if (e.uid) message += " uid " + std::to_string(*e.uid);
    if (e.rule) message += " rule " + *e.rule;
    if (e.reason) message += ": " + *e.reason;
    // A head has the warning pool of journald's rate limit to itself (sinks.h).
    int priority = e.kind == journal::kind::anchor ? LOG_WARNING
                   : e.kind == journal::kind::denied || e.kind == journal::kind::revoked ||
                           e.kind == journal::kind::sink_failing
                       ? LOG_NOTICE
                       : LOG_INFO;
    AnchorFields a = anchor_fields(e);
    int rc = sd_journal_send(
        "MESSAGE=%s", message.c_str(), "MESSAGE_ID=%s", message_id(e.kind), "PRIORITY=%d", priority,
        "SYSLOG_IDENTIFIER=knod-policyd", "KNOD_EVENT=%s", e.kind.c_str(), "KNOD_UID=%s",
        e.uid ? std::to_string(*e.uid).c_str() : "", "KNOD_BINDING=%s",
        e.session_id.value_or("").c_str(), "KNOD_NETDEV=%s", r.netdev.c_str(), "KNOD_GPU=%s",
        r.gpu.c_str(), "KNOD_RULE=%s", e.rule.value_or("").c_str(), "KNOD_DECISION=%s",
        e.decision.value_or("").c_str(), "KNOD_REASON=%s", e.reason.value_or("").c_str(),
        "KNOD_JOURNAL_ID=%s", a.journal_id.c_str(), "KNOD_JOURNAL_PATH=%s", a.path.c_str(),
        "KNOD_SEQ=%s", a.seq.c_str(), "KNOD_HASH=%s", a.hash.c_str(), "KNOD_HEAD_RUN=%s",
        a.run.c_str(), "KNOD_HEAD_N=%s", a.n.c_str(), nullptr);
    if (rc < 0) return make_error(Errc::io, std::string("sd_journal_send: ") + std::strerror(-rc));
    return {};
}

std::unique_ptr<LinuxAuditSink> LinuxAuditSink::open() {
    int fd = audit_open();
    if (fd < 0) return nullptr;
    return std::unique_ptr<LinuxAuditSink>(new LinuxAuditSink(fd));
}

LinuxAuditSink::~LinuxAuditSink() {
    audit_close(fd_);
}

Result<void> LinuxAuditSink::write(const SinkRecord &r) {
    const journal::Event &e = r.event;
    bool granted = e.kind == journal::kind::granted;
    if (!granted && e.kind != journal::kind::denied && e.kind != journal::kind::revoked) return {};
    // Values are quoted the way auditd expects free text: spaces become underscores, and control
    // characters and bytes that are not UTF-8 are escaped (a newline would start a forged field).
    auto clean = [](const std::string &raw) {
        std::string v = escape_untrusted(raw);
        for (char &c : v)
            if (c == ' ' || c == '"' || c == '=') c = '_';
        return v;
    };
    std::string msg = "op=knod-" + e.kind + " binding=" + clean(e.session_id.value_or("-")) +
                      " owner_uid=" + (e.uid ? std::to_string(*e.uid) : "-") +
                      " netdev=" + clean(r.netdev.empty() ? "-" : r.netdev) +
                      " gpu=" + clean(r.gpu.empty() ? "-" : r.gpu) +
                      " rule=" + clean(e.rule.value_or("-"));
    // Above 0: the kernel took it. 0: libaudit's "auditing is off" (the kernel has no audit, or
    // refused us the right) -- the record went nowhere, which is what a failure count is for.
    int rc = audit_log_user_message(fd_, AUDIT_TRUSTED_APP, msg.c_str(), nullptr, nullptr, nullptr,
                                    granted ? 1 : 0);
    if (rc < 0)
        return make_error(Errc::io, std::string("audit_log_user_message: ") + std::strerror(-rc));
    if (rc == 0)
        return make_error(Errc::unavailable, "audit_log_user_message: the kernel's audit is off "
                                             "or refused the record");
    return {};
}

SinkQueue::SinkQueue(std::vector<std::unique_ptr<Sink>> sinks, std::size_t capacity,
                     std::chrono::milliseconds hold_off)
    : sinks_(std::move(sinks)), capacity_(capacity), hold_off_(hold_off), state_(sinks_.size()),
      thread_([this] { run(); }) {}

SinkQueue::~SinkQueue() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void SinkQueue::offer(SinkRecord r) {
    if (sinks_.empty()) return;
    {
        std::lock_guard lock(mu_);
        if (queue_.size() >= capacity_) {
            ++dropped_;
            // A head replaces the oldest record that is not one: a lost head is a gap an
            // auditor cannot tell from a cut, a lost event line is not (the database has it).
            auto other = std::find_if(queue_.begin(), queue_.end(), [](const SinkRecord &q) {
                return q.event.kind != journal::kind::anchor;
            });
            if (r.event.kind != journal::kind::anchor || other == queue_.end()) return;
            queue_.erase(other);
        }
        queue_.push_back(std::move(r));
    }
    wake_.notify_one();
}

std::vector<std::string> SinkQueue::names() const {
    std::vector<std::string> out;
    for (auto &s : sinks_)
        out.emplace_back(s->name());
    return out;
}

std::vector<SinkStats> SinkQueue::stats() const {
    std::lock_guard lock(mu_);
    std::vector<SinkStats> out;
    for (std::size_t i = 0; i < sinks_.size(); ++i) {
        const State &s = state_[i];
        out.push_back({sinks_[i]->name(), s.written, s.failed, dropped_.load(), s.last_failed,
                       s.last_error, s.heads_written, s.last_head_seq});
    }
    return out;
}

void SinkQueue::drain() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

// Counts the result and decides whether it is a change to report: the first failure after
// success (or at the start), the first success after a reported failure; a change within the
// hold-off of the last report waits for a later record.
void SinkQueue::account(std::size_t i, const Result<void> &r, std::int64_t head) {
    bool report = false, failing = !r;
    std::string error;
    {
        std::lock_guard lock(mu_);
        State &s = state_[i];
        s.last_failed = failing;
        if (failing) {
            ++s.failed;
            s.last_error = r.error().message;
        } else {
            ++s.written;
            if (head > 0) {
                ++s.heads_written;
                s.last_head_seq = std::max(s.last_head_seq, head);
            }
        }
        auto now = std::chrono::steady_clock::now();
        bool held = s.ever_reported && now - s.reported < hold_off_;
        // A sink that works from the start has nothing to report; one that fails from the
        // start does.
        if (failing != s.failing && !held) {
            s.failing = failing;
            s.reported = now;
            s.ever_reported = true;
            report = true;
            error = s.last_error;
        }
    }
    if (report && listener_) listener_(sinks_[i]->name(), failing, error);
}

void SinkQueue::run() {
    // A name `top -H`, /proc/PID/task/*/comm and the control bench know it by.
    pthread_setname_np(pthread_self(), "knod-sinks");
    for (;;) {
        std::deque<SinkRecord> batch;
        {
            std::unique_lock lock(mu_);
            busy_ = false;
            if (queue_.empty()) idle_.notify_all();
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            batch.swap(queue_);
            busy_ = true;
        }
        for (auto &r : batch) {
            std::int64_t head = head_seq(r.event);
            for (std::size_t i = 0; i < sinks_.size(); ++i)
                account(i, sinks_[i]->write(r), sinks_[i]->keeps_heads() ? head : 0);
            ++written_;
        }
    }
}

} // namespace knod::sinks
