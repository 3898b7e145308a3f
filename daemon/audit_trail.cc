#include "daemon/audit_trail.h"

#include "daemon/metrics.h"

#include "journal/journal.h"
#include "knod/hex.h"
#include "knod/json.h"

#include <nlohmann/json.hpp>

#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

namespace knod::daemon {
namespace {

constexpr std::size_t max_pending_records = 100000;

// Wraps a session write's answer so the time from handing it to the writer to its commit (group
// commit's linger included: what a caller waits for) lands in the histogram, on the writer's
// thread.
Written timed(Metrics *metrics, Written done) {
    if (!metrics) return done;
    return [metrics, done = std::move(done),
            start = std::chrono::steady_clock::now()](Result<std::int64_t> r) mutable {
        metrics->commit_latency().observe(std::chrono::steady_clock::now() - start);
        done(std::move(r));
    };
}

// 128 random bits, as hex: tells this run's heads from another's (uniqueness, not secrecy, so
// the clock and pid stand in if getrandom fails).
std::string head_run_id() {
    std::array<std::uint8_t, 16> b{};
    if (getrandom(b.data(), b.size(), 0) != static_cast<ssize_t>(b.size())) {
        auto t = static_cast<std::uint64_t>(journal::now_us());
        auto p = static_cast<std::uint64_t>(getpid());
        std::memcpy(b.data(), &t, sizeof t);
        std::memcpy(b.data() + 8, &p, sizeof p);
    }
    return knod::to_hex(b);
}

} // namespace

AuditTrail::AuditTrail(AuditConfig config, const policy::Policy &policy, Post post)
    : config_(std::move(config)), policy_(policy), post_(std::move(post)),
      refusals_(
          std::chrono::duration_cast<std::chrono::microseconds>(config_.refusal_window).count()) {}

// The journal first: its writer may still answer queued work, and those answers post to the
// loop through post_, which must outlive it.
AuditTrail::~AuditTrail() {
    close();
}

void AuditTrail::close() {
    // The journal first: its writer's last commits still tell the snapshot thread.
    journal_.reset();
    snapshots_.reset();
}

void AuditTrail::set_sinks(sinks::SinkQueue *sinks) {
    sinks_ = sinks;
    if (!sinks_) return;
    std::weak_ptr<bool> alive = alive_;
    sinks_->on_transition([this, alive](const std::string &sink, bool failing,
                                        const std::string &error) {
        post_([this, alive, sink, failing, error] {
            if (alive.expired()) return;
            journal::Event e;
            e.kind = failing ? journal::kind::sink_failing : journal::kind::sink_recovered;
            e.reason = failing ? sink + ": " + error : sink + " takes records again";
            e.detail = knod::dump_json(failing ? nlohmann::json{{"sink", sink}, {"error", error}}
                                               : nlohmann::json{{"sink", sink}});
            record(std::move(e));
        });
    });
}

journal::Journal *AuditTrail::journal() {
    if (journal_) return journal_.get();
    auto j = journal::Journal::open(config_.journal_path);
    if (!j) return nullptr;
    journal_ = std::move(*j);
    if (config_.snapshot_interval.count() > 0 && !snapshots_) {
        auto publisher =
            journal::SnapshotPublisher::open(config_.journal_path, config_.snapshot_mode);
        if (publisher)
            snapshots_ =
                std::make_unique<SnapshotThread>(std::move(*publisher), config_.snapshot_interval);
        else
            std::cerr << "knod-policyd: no snapshot for the auditors: " << publisher.error().message
                      << std::endl;
    }
    std::error_code ec;
    auto absolute = std::filesystem::absolute(config_.journal_path, ec);
    std::string path = ec ? config_.journal_path : absolute.lexically_normal().string();
    if (heads_->run.empty()) heads_->run = head_run_id();
    // A second anchor of the chain head, in the system journal, at most once a second.
    journal_->set_commit_listener([this, heads = heads_,
                                   journal_id = journal_->identity().journal_id,
                                   path](std::int64_t seq, const journal::Hash &head) {
        if (snapshots_) snapshots_->note_commit();
        std::int64_t now = journal::now_us();
        if (!sinks_ || now - heads->last_us.load() < 1000000) return;
        heads->last_us.store(now);
        journal::Event e;
        e.kind = journal::kind::anchor;
        // The journal's id and path: `audit verify` matches each copy to one journal; the run
        // and the head's number in it: it names the heads that did not arrive.
        e.detail = knod::dump_json(nlohmann::json{{"journal_id", journal_id},
                                                  {"path", path},
                                                  {"seq", seq},
                                                  {"hash", journal::to_hex(head)},
                                                  {"run", heads->run},
                                                  {"n", ++heads->sent}});
        e.reason = "chain head " + std::to_string(seq) + " " + journal::to_hex(head);
        sinks_->offer({e, {}, {}});
    });
    return journal_.get();
}

void AuditTrail::forward(const journal::Event &e, const std::string &netdev,
                         const std::string &gpu) {
    if (sinks_) sinks_->offer({e, netdev, gpu});
}

Result<std::int64_t> AuditTrail::apply_retention() {
    last_retention_us_ = journal::now_us();
    if (!config_.retain_age && !config_.retain_events) return std::int64_t{0};
    if (!journal()) return make_error(Errc::journal_unavailable, "journal not open");
    // The journal takes the cut from the age at its own clock reading and records the setting.
    std::optional<std::int64_t> age;
    if (config_.retain_age)
        age = std::chrono::duration_cast<std::chrono::microseconds>(*config_.retain_age).count();
    return journal_->prune(std::nullopt, config_.retain_events, age);
}

journal::JournalStats AuditTrail::journal_stats() const {
    return journal_ ? journal_->stats() : journal::JournalStats{};
}

// Frames a reader may hold back before `status` says so: 4,096 pages (16 MiB at SQLite's 4 KiB
// pages), far more than a reader that copies the journal (sqlite3 .backup) holds for.
constexpr std::uint64_t held_frames_reported = 4096;

std::string AuditTrail::journal_problem() const {
    if (!journal_) return "the journal is not open (requests are refused)";
    auto st = journal_->stats();
    std::string problem;
    auto add = [&](const std::string &what) { problem += (problem.empty() ? "" : "; ") + what; };
    if (!st.last_error.empty()) add("the last write failed: " + st.last_error);
    if (!st.anchor_failing.empty())
        add("anchor not advancing: " + st.anchor_failing + " (" +
            std::to_string(st.anchor_failures) + " failed write(s))");
    // The WAL is cut back to 16 MiB whenever it restarts (journal_size_limit); larger, it has not
    // restarted, whatever the checkpoint said: a reader's lock (on the checkpoint lock, or on a
    // read-mark of -shm) or an open transaction holds it.
    if (st.wal_bytes > held_frames_reported * 4096)
        add((st.checkpoint_blocked ? "another process holds the journal's checkpoint lock: "
                                   : "the WAL cannot restart: a reader's lock or transaction "
                                     "holds it: ") +
            std::string("the WAL is ") + std::to_string(st.wal_bytes >> 20) +
            " MiB (see docs/audit.md, \"Reading a live journal\")");
    if (st.wal_frames_held > held_frames_reported)
        add("a reader's open transaction keeps " + std::to_string(st.wal_frames_held) +
            " WAL frame(s) from the database (the WAL grows until it ends; see docs/audit.md, "
            "\"Reading a live journal\")");
    if (!pending_.empty()) add(std::to_string(pending_.size()) + " record(s) waiting for the disk");
    if (snapshots_)
        if (auto snap = snapshots_->status(); !snap.failing.empty())
            add("the auditors' snapshot is not being published (since " +
                std::to_string((journal::now_us() - snap.failing_since_us) / 1000000) +
                " s; it ends at event " + std::to_string(snap.seq) + "): " + snap.failing);
    return problem;
}

void AuditTrail::record(journal::Event e) {
    forward(e);
    // Stopping: everything is written in order, waited for, by the final flush_pending_now();
    // an asynchronous failure could no longer come back through the loop.
    if (writing_async()) {
        // Not waited for, so it joins the next commit (within Journal::linger) rather than
        // costing one of its own; a failure comes back to be kept for the retry at the next tick.
        journal_->append_soon(e, [this, e](Result<std::int64_t> r) {
            if (!r) post_([this, e] { keep_record(e); });
        });
        return;
    }
    keep_record(std::move(e));
}

void AuditTrail::record_load(journal::Event e) {
    name_policy(e);
    forward(e);
    PendingLoad load{std::move(e), {policy_.digest, policy_.text}};
    if (writing_async()) {
        journal_->append_policy_load_async(load.event, load.policy,
                                           [this, load](Result<std::int64_t> r) {
                                               if (!r) post_([this, load] { keep_record(load); });
                                           });
        return;
    }
    keep_record(std::move(load));
}

void AuditTrail::keep(journal::Event e) {
    keep_record(std::move(e));
}

void AuditTrail::close_session(const std::string &id, const std::string &reason,
                               const journal::Counters &counters, journal::Event closing,
                               const std::string &netdev, const std::string &gpu, Done durable) {
    forward(closing, netdev, gpu);
    if (writing_async()) {
        PendingEnd end{id, reason, counters, closing};
        journal_->close_session_async(
            id, reason, counters, std::move(closing),
            // `durable` moves to the loop: see open_session's.
            timed(metrics_, [this, end, durable](Result<std::int64_t> r) mutable {
                post_([this, end, durable = std::move(durable), ok = r.ok()] {
                    if (!ok) keep_record(end);
                    if (durable) durable({});
                });
            }));
    } else {
        keep_record(PendingEnd{id, reason, counters, std::move(closing)});
        if (durable) durable({});
    }
}

void AuditTrail::open_session(const journal::Session &s, journal::Event grant, Written done) {
    forward(grant, s.netdev, s.gpu);
    journal_->open_session_async(s, std::move(grant), timed(metrics_, std::move(done)));
}

void AuditTrail::name_policy(journal::Event &e) const {
    nlohmann::json d = nlohmann::json::object();
    if (e.detail) d = nlohmann::json::parse(*e.detail, nullptr, false);
    if (!d.is_object()) return; // never: details are built here, as objects
    d["policy"] = policy_.digest;
    e.detail = knod::dump_json(d);
}

Result<std::int64_t> AuditTrail::write_now(const Pending &record) {
    if (auto *e = std::get_if<journal::Event>(&record)) return journal_->append(*e);
    if (auto *l = std::get_if<PendingLoad>(&record))
        return journal_->append_policy_load(l->event, l->policy);
    auto &end = std::get<PendingEnd>(record);
    return journal_->close_session(end.id, end.reason, end.counters, end.event);
}

void AuditTrail::write_async(const Pending &record, Written done) {
    if (auto *e = std::get_if<journal::Event>(&record))
        return journal_->append_async(*e, std::move(done));
    if (auto *l = std::get_if<PendingLoad>(&record))
        return journal_->append_policy_load_async(l->event, l->policy, std::move(done));
    auto &end = std::get<PendingEnd>(record);
    journal_->close_session_async(end.id, end.reason, end.counters, end.event, std::move(done));
}

void AuditTrail::keep_record(Pending record) {
    if (pending_.size() >= max_pending_records) {
        ++dropped_records_; // bounded memory beats an OOM kill that loses everything
        return;
    }
    pending_.push_back(std::move(record));
}

void AuditTrail::flush_pending_async() {
    if (flushing_ || pending_.empty() || !journal()) return;
    // One record in flight at a time, in order, on the writer thread: a locked or slow journal
    // costs the writer its busy timeout, never the event loop.
    auto outcome = std::make_shared<std::atomic<int>>(flush_running);
    flushing_ = outcome;
    auto done = [this, outcome](Result<std::int64_t> r) {
        bool ok = r || r.error().code == Errc::not_found; // a session row already gone
        outcome->store(ok ? flush_written : flush_failed);
        post_([this, outcome] {
            if (flushing_ != outcome) return; // shutdown took this one over
            flushing_.reset();
            if (outcome->load() != flush_written) return; // the next tick tries again
            pending_.pop_front();
            flush_pending_async();
        });
    };
    write_async(pending_.front(), done);
}

Result<void> AuditTrail::flush_pending_now() {
    if (flushing_) {
        // The record in flight: wait for its outcome (bounded by SQLite's busy timeout) so it is
        // neither lost nor written twice.
        while (flushing_->load() == flush_running)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (flushing_->load() == flush_written) pending_.pop_front();
        flushing_.reset();
    }
    if (pending_.empty()) return {};
    if (!journal()) return make_error(Errc::journal_unavailable, "journal not open");
    while (!pending_.empty()) {
        auto r = write_now(pending_.front());
        // A kept end whose session row is already gone was written before.
        bool end = std::holds_alternative<PendingEnd>(pending_.front());
        if (!r && !(end && r.error().code == Errc::not_found)) return r.error();
        pending_.pop_front();
    }
    return {};
}

void AuditTrail::stop() {
    stopping_ = true;
}

void AuditTrail::finish(journal::Event last) {
    record_coalesced(journal::now_us(), true);
    // How many heads this run sent, in the chain: `audit verify` then names heads journald lost
    // after the newest one it kept, which no later head of this run can show as a gap.
    if (std::int64_t sent = heads_->sent.load(); sent > 0) {
        auto d = last.detail ? nlohmann::json::parse(*last.detail, nullptr, false)
                             : nlohmann::json::object();
        if (!d.is_object()) d = nlohmann::json::object();
        d["heads"] = {{"run", heads_->run}, {"sent", sent}};
        last.detail = knod::dump_json(d);
    }
    record(std::move(last));
    report_unwritten(flush_pending_now());
    // The auditors read the stopped daemon's journal through the snapshot: it ends where the
    // journal ends.
    if (snapshots_) snapshots_->publish_now();
}

void AuditTrail::report_unwritten(const Result<void> &flushed) const {
    if (flushed && pending_.empty()) return;
    std::cerr << "knod-policyd: " << pending_.size()
              << " journal record(s) could not be written at stop"
              << (flushed ? std::string() : ": " + flushed.error().message)
              << "; sessions left open are closed as daemon-restart at the next start" << std::endl;
}

void AuditTrail::tick(std::int64_t now_us) {
    if (now_us - last_retention_us_ >= 3600ll * 1000000) (void)apply_retention();
    record_coalesced(now_us, false);
    flush_pending_async();
}

void AuditTrail::refuse(journal::Event e, bool one_by_one) {
    if (metrics_) metrics_->refused(e.kind, e.decision.value_or(""));
    // The host's root's refusals are kept one by one: it could write the journal directly
    // anyway. A container's root (uid 0 too) is coalesced like everyone.
    // Counted per pod too: one pod's refusals never stand for another namespace's.
    bool full =
        !e.uid || one_by_one ||
        refusals_.admit(static_cast<std::uint32_t>(*e.uid), e.kind, journal::now_us(), pod_of(e));
    if (full) record(std::move(e)); // otherwise counted; the window's record says how many
}

std::string AuditTrail::pod_of(const journal::Event &e) {
    if (!e.detail || e.detail->find("\"pod\"") == std::string::npos) return {};
    auto detail = knod::parse_json(*e.detail); // the daemon's own JSON
    if (detail.is_discarded() || !detail.is_object() || !detail.contains("pod")) return {};
    return knod::dump_json(detail["pod"]);
}

void AuditTrail::record_coalesced(std::int64_t now_us, bool all) {
    for (auto &s : all ? refusals_.close_all(now_us) : refusals_.close(now_us)) {
        journal::Event e;
        e.kind = journal::kind::coalesced;
        if (s.uid) e.uid = *s.uid;
        e.decision = s.kind;
        nlohmann::json pod = s.scope.empty() ? nlohmann::json() : knod::parse_json(s.scope);
        e.reason = std::to_string(s.count) + " more " + s.kind + " refusals of " +
                   (s.uid ? "uid " + std::to_string(*s.uid) : std::string("many uids")) +
                   (pod.is_object() ? " in pod " + pod.value("namespace", std::string()) + "/" +
                                          pod.value("name", std::string())
                                    : std::string()) +
                   ", journaled as this count only";
        nlohmann::json detail{{"kind", s.kind},
                              {"count", s.count},
                              {"since_us", s.since_us},
                              {"until_us", s.until_us}};
        if (pod.is_object()) detail["pod"] = pod;
        e.detail = knod::dump_json(detail);
        record(std::move(e));
    }
}

} // namespace knod::daemon
