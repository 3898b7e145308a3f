#include "daemon/sinks/sinks.h"

#include "knod/untrusted.h"

#include <libaudit.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

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
    };
    for (auto &[k, id] : ids)
        if (kind == k) return id;
    return "6e9a1b6c1f5e4d0a9a0e3f2b7c4d5e00"; // any other event
}

void JournaldSink::write(const SinkRecord &r) {
    const journal::Event &e = r.event;
    std::string message = "knod-policy " + e.kind;
    if (e.session_id) message += " binding " + *e.session_id;
    if (e.uid) message += " uid " + std::to_string(*e.uid);
    if (e.rule) message += " rule " + *e.rule;
    if (e.reason) message += ": " + *e.reason;
    int priority =
        e.kind == journal::kind::denied || e.kind == journal::kind::revoked ? LOG_NOTICE : LOG_INFO;
    sd_journal_send(
        "MESSAGE=%s", message.c_str(), "MESSAGE_ID=%s", message_id(e.kind), "PRIORITY=%d", priority,
        "SYSLOG_IDENTIFIER=knod-policyd", "KNOD_EVENT=%s", e.kind.c_str(), "KNOD_UID=%s",
        e.uid ? std::to_string(*e.uid).c_str() : "", "KNOD_BINDING=%s",
        e.session_id.value_or("").c_str(), "KNOD_NETDEV=%s", r.netdev.c_str(), "KNOD_GPU=%s",
        r.gpu.c_str(), "KNOD_RULE=%s", e.rule.value_or("").c_str(), "KNOD_DECISION=%s",
        e.decision.value_or("").c_str(), "KNOD_REASON=%s", e.reason.value_or("").c_str(), nullptr);
}

std::unique_ptr<LinuxAuditSink> LinuxAuditSink::open() {
    int fd = audit_open();
    if (fd < 0) return nullptr;
    return std::unique_ptr<LinuxAuditSink>(new LinuxAuditSink(fd));
}

LinuxAuditSink::~LinuxAuditSink() {
    audit_close(fd_);
}

void LinuxAuditSink::write(const SinkRecord &r) {
    const journal::Event &e = r.event;
    bool granted = e.kind == journal::kind::granted;
    if (!granted && e.kind != journal::kind::denied && e.kind != journal::kind::revoked) return;
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
    audit_log_user_message(fd_, AUDIT_TRUSTED_APP, msg.c_str(), nullptr, nullptr, nullptr,
                           granted ? 1 : 0);
}

SinkQueue::SinkQueue(std::vector<std::unique_ptr<Sink>> sinks, std::size_t capacity)
    : sinks_(std::move(sinks)), capacity_(capacity), thread_([this] { run(); }) {}

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
            return;
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

void SinkQueue::run() {
    for (;;) {
        std::deque<SinkRecord> batch;
        {
            std::unique_lock lock(mu_);
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            batch.swap(queue_);
        }
        for (auto &r : batch) {
            for (auto &s : sinks_)
                s->write(r);
            ++written_;
        }
    }
}

} // namespace knod::sinks
