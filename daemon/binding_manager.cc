#include "daemon/binding_manager.h"

#include "daemon/request_limits.h"
#include "knod/hex.h"
#include "knod/untrusted.h"

#include "knod/json.h"
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <openssl/rand.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

namespace knod::daemon {
namespace {

constexpr std::size_t max_pending_records = 100000;

std::string new_binding_id() {
    std::array<std::uint8_t, 8> bytes{};
    RAND_bytes(bytes.data(), static_cast<int>(bytes.size()));
    return "b" + to_hex(bytes); // a valid D-Bus object path element
}

journal::Event event_for(const char *kind, const Peer &p) {
    journal::Event e;
    e.kind = kind;
    e.uid = p.uid;
    e.pid = p.pid;
    return e;
}

Error journal_error(const Error &e) {
    return make_error(Errc::journal_unavailable,
                      "the session journal cannot record this, so nothing is granted (" +
                          e.message + ")");
}

// An array of flow specs: exports show it as is (daemons before #16 stored a JSON-encoded string).
nlohmann::json flows_json(const std::vector<policy::FlowSpec> &flows) {
    nlohmann::json j = nlohmann::json::array();
    for (auto &f : flows)
        j.push_back(f.to_string());
    return j;
}

} // namespace

const char *to_string(BindingState s) {
    return s == BindingState::active ? "active" : "granted";
}

BindingManager::BindingManager(ManagerConfig config, driver::Driver &driver,
                               keys::KeyAuthority keys, policy::Policy policy,
                               BindingEvents &events, Post post)
    : config_(std::move(config)), driver_(driver), keys_(std::move(keys)),
      policy_(std::move(policy)), events_(events), post_(std::move(post)),
      limiter_(config_.requests_per_second, config_.request_burst),
      refusals_(
          std::chrono::duration_cast<std::chrono::microseconds>(config_.refusal_window).count()),
      host_(config_.host.sysfs, config_.host.proc) {
    // A policy built without the parser still gets the digest of the text it carries.
    if (policy_.digest.empty()) policy_.digest = policy::policy_digest(policy_.text);
}

// The journal first: its writer may still answer queued work, and those answers post to the
// loop through post_, which must outlive it.
BindingManager::~BindingManager() {
    journal_.reset();
}

void BindingManager::set_sinks(sinks::SinkQueue *sinks) {
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

bool BindingManager::journal_ready() {
    if (journal_) return true;
    auto j = journal::Journal::open(config_.journal_path);
    if (!j) return false;
    journal_ = std::move(*j);
    std::error_code ec;
    auto absolute = std::filesystem::absolute(config_.journal_path, ec);
    std::string path = ec ? config_.journal_path : absolute.lexically_normal().string();
    // A second anchor of the chain head, in the system journal, at most once a second.
    journal_->set_commit_listener([this, last = std::make_shared<std::atomic<std::int64_t>>(0),
                                   journal_id = journal_->identity().journal_id,
                                   path](std::int64_t seq, const journal::Hash &head) {
        std::int64_t now = journal::now_us();
        if (!sinks_ || now - last->load() < 1000000) return;
        last->store(now);
        journal::Event e;
        e.kind = journal::kind::anchor;
        // The journal's id and path: `audit verify` matches each copy to one journal.
        e.detail = knod::dump_json(nlohmann::json{{"journal_id", journal_id},
                                                  {"path", path},
                                                  {"seq", seq},
                                                  {"hash", journal::to_hex(head)}});
        e.reason = "chain head " + std::to_string(seq) + " " + journal::to_hex(head);
        sinks_->offer({e, {}, {}});
    });
    return true;
}

Result<void> BindingManager::apply_settings(const policy::Settings &settings) {
    bool drop = settings.unmatched_traffic == policy::UnmatchedTraffic::drop;
    if (auto r = driver_.set_unmatched_drop(drop); !r)
        return make_error(Errc::invalid_policy, "settings.unmatched_traffic: " + r.error().message);
    return {};
}

void BindingManager::start() {
    std::map<std::string, std::string> handoffs;
    if (journal_ready())
        if (auto taken = journal_->take_handoffs()) handoffs = std::move(*taken);
    // The daemon loads the policy it starts with: its own uid and pid are the actor's.
    Peer self;
    self.uid = ::getuid();
    self.pid = ::getpid();
    journal::Event e = event_for(journal::kind::daemon_start, self);
    nlohmann::json detail{{"driver", driver_.name()},
                          {"rules", policy_.rules.size()},
                          {"handed_over", handoffs.size()},
                          {"policy", policy_.digest}};
    if (journal_) { // where this journal lives, inside the chain (meta may be edited)
        auto &id = journal_->identity();
        detail["journal_id"] = id.journal_id;
        detail["machine_id"] = id.machine_id;
        detail["hostname"] = escape_untrusted(id.hostname);
    }
    e.detail = knod::dump_json(detail);
    record_load(std::move(e));
    if (!journal_) return;
    // Bindings the previous daemon handed over come back if their handles did and their
    // holders live; every other open session (a crash, a stop that discarded the fd store, a
    // holder gone meanwhile) ends now: its binding did not survive.
    std::set<std::string> kept;
    for (auto &[id, text] : handoffs) {
        auto adopted = adopt(id, text);
        if (adopted) {
            kept.insert(id);
            continue;
        }
        try { // what the driver left behind besides the handles (devmem: ntuple rules)
            auto j = nlohmann::json::parse(text);
            driver_.abandon(j.at("netdev").get<std::string>(), j.at("driver").get<std::string>());
        } catch (const std::exception &) {
        }
        journal::Event no = event_for(journal::kind::not_adopted, {});
        no.uid.reset();
        no.pid.reset();
        no.session_id = id;
        no.reason = adopted.error().message;
        record(std::move(no));
    }
    (void)journal_->close_open_sessions(reason::daemon_restart, kept);
    // A restart may bring a new policy: what it no longer grants ends as on a reload.
    for (auto &id : kept)
        if (auto it = bindings_.find(id);
            it != bindings_.end() && !decide_again(it->second).granted())
            end_binding(id, reason::policy_reload);
}

void BindingManager::store_handles(Binding &b) {
    if (!store_) return;
    auto keep = [&](const std::string &name, int fd) {
        if (std::find(b.stored.begin(), b.stored.end(), name) != b.stored.end()) return;
        if (store_->store(name, fd)) b.stored.push_back(name);
    };
    if (b.region) keep(b.id + ".region", b.region->get());
    for (auto &[role, fd] : driver_.handles(b.id))
        keep(b.id + "." + role, fd);
}

std::string BindingManager::handoff_of(const Binding &b, const std::string &driver_state) const {
    auto carried = keys_.carry(b.key_id);
    if (!carried) return {};
    auto hex = [](const std::string &s) {
        return to_hex({reinterpret_cast<const std::uint8_t *>(s.data()), s.size()});
    };
    nlohmann::json flows = nlohmann::json::array();
    for (auto &f : b.flows)
        flows.push_back(f.to_string());
    nlohmann::json roles = nlohmann::json::array();
    for (auto &name : b.stored)
        if (name != b.id + ".region") roles.push_back(name.substr(b.id.size() + 1));
    // Untrusted strings from /proc travel as hex: the next start gets back the exact bytes.
    nlohmann::json owner{{"uid", b.owner.uid},
                         {"pid", b.owner.pid},
                         {"start_time", b.owner.start_time},
                         {"bus_name", hex(b.owner.bus_name)},
                         {"gids", b.owner.gids},
                         {"gids_from_bus", b.owner.gids_from_bus},
                         {"exe", hex(b.owner.executable)},
                         {"cgroup", hex(b.owner.cgroup)},
                         {"unit", hex(b.owner.unit)},
                         {"user_unit", hex(b.owner.user_unit)}};
    nlohmann::json region{{"device", b.region_id.device},
                          {"inode", b.region_id.inode},
                          {"offset", b.region_id.offset},
                          {"length", b.region_id.length}};
    return knod::dump_json(nlohmann::json{{"version", 1},
                                          {"netdev", b.netdev},
                                          {"gpu", b.gpu},
                                          {"gpu_names", b.gpu_names},
                                          {"mode", policy::to_string(b.mode)},
                                          {"flows", flows},
                                          {"queues", b.queues},
                                          {"owner", owner},
                                          {"region", region},
                                          {"key_id", b.key_id},
                                          {"key_mac", to_hex(carried->mac)},
                                          {"rule", b.rule},
                                          {"created_us", b.created_us},
                                          {"expires_us", b.expires_us},
                                          {"state", to_string(b.state)},
                                          {"handles", roles},
                                          {"driver", driver_state}});
}

Result<void> BindingManager::adopt(const std::string &id, const std::string &text) {
    Binding b;
    b.id = id;
    keys::KeyAuthority::Carried carried{};
    std::string driver_state;
    std::vector<std::string> roles;
    bool active = false;
    try {
        auto unhex = [](const nlohmann::json &v) {
            auto bytes = from_hex(v.get<std::string>());
            if (!bytes) throw std::runtime_error("bad hex text");
            return std::string(bytes->begin(), bytes->end());
        };
        auto j = nlohmann::json::parse(text);
        if (j.at("version").get<int>() != 1) throw std::runtime_error("unknown handoff version");
        b.netdev = j.at("netdev").get<std::string>();
        b.gpu = j.at("gpu").get<std::string>();
        b.gpu_names = j.at("gpu_names").get<std::vector<std::string>>();
        auto mode = policy::parse_mode(j.at("mode").get<std::string>());
        if (!mode) throw std::runtime_error("bad mode");
        b.mode = *mode;
        for (auto &f : j.at("flows")) {
            auto spec = policy::parse_flow_spec(f.get<std::string>());
            if (!spec) throw std::runtime_error("bad flow: " + spec.error().message);
            b.flows.push_back(*spec);
        }
        auto &o = j.at("owner");
        b.owner.uid = o.at("uid").get<uid_t>();
        b.owner.pid = o.at("pid").get<pid_t>();
        b.owner.start_time = o.at("start_time").get<std::uint64_t>();
        b.owner.bus_name = unhex(o.at("bus_name"));
        b.owner.gids = o.at("gids").get<std::vector<gid_t>>();
        b.owner.gids_from_bus = o.at("gids_from_bus").get<bool>();
        b.owner.executable = unhex(o.at("exe"));
        b.owner.cgroup = unhex(o.at("cgroup"));
        b.owner.unit = unhex(o.at("unit"));
        b.owner.user_unit = unhex(o.at("user_unit"));
        auto &r = j.at("region");
        b.region_id = {r.at("device").get<std::uint64_t>(), r.at("inode").get<std::uint64_t>(),
                       r.at("offset").get<std::uint64_t>(), r.at("length").get<std::uint64_t>()};
        b.key_id = j.at("key_id").get<std::string>();
        auto mac = from_hex(j.at("key_mac").get<std::string>());
        if (!mac || mac->size() != carried.mac.size()) throw std::runtime_error("bad key MAC");
        std::copy(mac->begin(), mac->end(), carried.mac.begin());
        b.rule = j.at("rule").get<std::string>();
        b.created_us = j.at("created_us").get<std::int64_t>();
        b.expires_us = j.at("expires_us").get<std::int64_t>();
        active = j.at("state").get<std::string>() == "active";
        roles = j.at("handles").get<std::vector<std::string>>();
        driver_state = j.at("driver").get<std::string>();
    } catch (const std::exception &e) {
        return make_error(Errc::corrupt,
                          std::string("its handoff record is unreadable: ") + e.what());
    }
    if (!store_)
        return make_error(Errc::unavailable, "no file-descriptor store (not under systemd)");
    // A key that ran out while no daemon ran: the binding ends here, before its data path is
    // set up again (taken back, it would take packets until the first tick expired it).
    if (b.expires_us <= journal::now_us())
        return make_error(Errc::expired, "its key expired during the restart");
    auto fd = store_->take(id + ".region");
    if (!fd)
        return make_error(Errc::not_found, "its region fd did not come back (systemd discarded "
                                           "the fd store: a stop, not a restart)");
    auto region = driver::inspect_region(fd->get());
    if (!region || region->device != b.region_id.device || region->inode != b.region_id.inode)
        return make_error(Errc::corrupt, "the region fd that came back is another file");
    if (auto w = driver::check_window(*region, b.region_id.offset, b.region_id.length); !w)
        return w.error();
    auto pidfd = pin_process(b.owner.pid, b.owner.start_time);
    if (!pidfd)
        return make_error(Errc::not_found, "its holder (pid " + std::to_string(b.owner.pid) +
                                               ") exited during the restart");
    std::map<std::string, UniqueFd> handles;
    for (auto &role : roles) {
        auto h = store_->take(id + "." + role);
        if (!h) return make_error(Errc::not_found, "its " + role + " handle did not come back");
        handles.emplace(role, std::move(*h));
    }
    if (driver_.netdev(b.netdev).ok() == false)
        return make_error(Errc::not_found, "its netdev " + b.netdev + " is gone");
    b.region = std::make_shared<UniqueFd>(fd->release());
    carried.grant = {id, b.owner.holder(), b.region_id,
                     keys::Clock::time_point(std::chrono::microseconds(b.expires_us))};
    if (auto r = keys_.restore(b.key_id, carried); !r) return r.error();
    auto queues = driver_.readopt(
        {id, b.netdev, b.gpu, b.flows, b.region->get(), b.region_id.offset, b.region_id.length},
        active, driver_state, std::move(handles));
    if (!queues) {
        keys_.revoke(b.key_id);
        return std::move(queues).error().context("the " + driver_.name() + " driver");
    }
    b.queues = *queues;
    b.state = active ? BindingState::active : BindingState::granted;
    b.owner.pidfd = std::move(*pidfd);
    count_usage(b, +1);
    claims_.claim(b.netdev, id, b.owner.uid, b.flows);
    auto [pos, inserted] = bindings_.emplace(id, std::move(b));
    Binding &kept = pos->second;
    // systemd keeps what it handed back; storing again is harmless (it drops duplicates) and
    // covers a store that was emptied meanwhile.
    store_handles(kept);
    events_.binding_adopted(kept);
    kept.owner.pidfd.reset();
    journal::Event e = event_for(journal::kind::adopted, kept.owner);
    e.session_id = id;
    e.rule = kept.rule;
    e.reason = "taken back after a daemon restart";
    e.detail = knod::dump_json(nlohmann::json{{"state", to_string(kept.state)},
                                              {"queues", kept.queues},
                                              {"expires_us", kept.expires_us}});
    record(std::move(e));
    return {};
}

void BindingManager::forward(const journal::Event &e, const std::string &netdev,
                             const std::string &gpu) {
    if (sinks_) sinks_->offer({e, netdev, gpu});
}

Result<std::int64_t> BindingManager::apply_retention() {
    last_retention_us_ = journal::now_us();
    if (!config_.retain_age && !config_.retain_events) return std::int64_t{0};
    if (!journal_ready()) return make_error(Errc::journal_unavailable, "journal not open");
    std::optional<std::int64_t> before;
    if (config_.retain_age)
        before = last_retention_us_ -
                 std::chrono::duration_cast<std::chrono::microseconds>(*config_.retain_age).count();
    return journal_->prune(before, config_.retain_events);
}

void BindingManager::record(journal::Event e) {
    forward(e);
    // Stopping: everything is written in order, waited for, by the final flush_pending_now();
    // an asynchronous failure could no longer come back through the loop.
    if (pending_.empty() && !stopping_ && journal_ready()) {
        // Not waited for; a failure comes back to be kept for the retry at the next tick.
        journal_->append_async(e, [this, e](Result<std::int64_t> r) {
            if (!r) post_([this, e] { keep(e); });
        });
        return;
    }
    keep(std::move(e));
}

void BindingManager::record_load(journal::Event e) {
    name_policy(e);
    forward(e);
    PendingLoad load{std::move(e), {policy_.digest, policy_.text}};
    if (pending_.empty() && !stopping_ && journal_ready()) {
        journal_->append_policy_load_async(load.event, load.policy,
                                           [this, load](Result<std::int64_t> r) {
                                               if (!r) post_([this, load] { keep(load); });
                                           });
        return;
    }
    keep(std::move(load));
}

void BindingManager::name_policy(journal::Event &e) const {
    nlohmann::json d = nlohmann::json::object();
    if (e.detail) d = nlohmann::json::parse(*e.detail, nullptr, false);
    if (!d.is_object()) return; // never: details are built here, as objects
    d["policy"] = policy_.digest;
    e.detail = knod::dump_json(d);
}

Result<std::int64_t> BindingManager::write_now(const Pending &record) {
    if (auto *e = std::get_if<journal::Event>(&record)) return journal_->append(*e);
    if (auto *l = std::get_if<PendingLoad>(&record))
        return journal_->append_policy_load(l->event, l->policy);
    auto &end = std::get<PendingEnd>(record);
    return journal_->close_session(end.id, end.reason, end.counters, end.event);
}

void BindingManager::write_async(const Pending &record, journal::Journal::Done done) {
    if (auto *e = std::get_if<journal::Event>(&record))
        return journal_->append_async(*e, std::move(done));
    if (auto *l = std::get_if<PendingLoad>(&record))
        return journal_->append_policy_load_async(l->event, l->policy, std::move(done));
    auto &end = std::get<PendingEnd>(record);
    journal_->close_session_async(end.id, end.reason, end.counters, end.event, std::move(done));
}

void BindingManager::keep(Pending record) {
    if (pending_.size() >= max_pending_records) {
        ++dropped_records_; // bounded memory beats an OOM kill that loses everything
        return;
    }
    pending_.push_back(std::move(record));
}

void BindingManager::flush_pending_async() {
    if (flushing_ || pending_.empty() || !journal_ready()) return;
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

Result<void> BindingManager::flush_pending_now() {
    if (flushing_) {
        // The record in flight: wait for its outcome (bounded by SQLite's busy timeout) so it is
        // neither lost nor written twice.
        while (flushing_->load() == flush_running)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (flushing_->load() == flush_written) pending_.pop_front();
        flushing_.reset();
    }
    if (pending_.empty()) return {};
    if (!journal_ready()) return make_error(Errc::journal_unavailable, "journal not open");
    while (!pending_.empty()) {
        auto r = write_now(pending_.front());
        // A kept end whose session row is already gone was written before.
        bool end = std::holds_alternative<PendingEnd>(pending_.front());
        if (!r && !(end && r.error().code == Errc::not_found)) return r.error();
        pending_.pop_front();
    }
    return {};
}

Result<void> BindingManager::throttle(uid_t uid, pid_t pid, const char *method) {
    if (uid == 0 || limiter_.admit(uid, std::chrono::steady_clock::now())) return {};
    journal::Event e;
    e.kind = journal::kind::rate_limited;
    e.uid = uid;
    e.pid = pid;
    e.reason = std::string(method) + " refused: over the per-user rate limit";
    e.detail = knod::dump_json(nlohmann::json{{"method", method}});
    refuse(std::move(e));
    char rate[64];
    std::snprintf(rate, sizeof rate, "%g per second (bursts of %g)", limiter_.per_second(),
                  limiter_.burst());
    return make_error(Errc::quota_exceeded, "too many requests from uid " + std::to_string(uid) +
                                                ": at most " + rate +
                                                " per user, over all its connections; retry later");
}

void BindingManager::refuse(journal::Event e) {
    // Root's refusals are kept one by one: root could write the journal directly anyway.
    bool full = !e.uid || *e.uid == 0 ||
                refusals_.admit(static_cast<std::uint32_t>(*e.uid), e.kind, journal::now_us());
    if (full) record(std::move(e)); // otherwise counted; the window's record says how many
}

void BindingManager::record_coalesced(std::int64_t now_us, bool all) {
    for (auto &s : all ? refusals_.close_all(now_us) : refusals_.close(now_us)) {
        journal::Event e;
        e.kind = journal::kind::coalesced;
        if (s.uid) e.uid = *s.uid;
        e.decision = s.kind;
        e.reason = std::to_string(s.count) + " more " + s.kind + " refusals of " +
                   (s.uid ? "uid " + std::to_string(*s.uid) : std::string("many uids")) +
                   ", journaled as this count only";
        e.detail = knod::dump_json(nlohmann::json{{"kind", s.kind},
                                                  {"count", s.count},
                                                  {"since_us", s.since_us},
                                                  {"until_us", s.until_us}});
        record(std::move(e));
    }
}

policy::Usage BindingManager::usage_of(uid_t uid, const std::string &except_id) const {
    auto it = usage_.find(uid);
    policy::Usage u = it == usage_.end() ? policy::Usage{} : it->second;
    if (auto b = bindings_.find(except_id); b != bindings_.end() && b->second.owner.uid == uid) {
        u.bindings -= 1;
        u.bytes -= b->second.region_id.length;
    }
    return u;
}

void BindingManager::count_usage(const Binding &b, int sign) {
    policy::Usage &u = usage_[b.owner.uid];
    u.bindings += static_cast<std::uint32_t>(sign);
    u.bytes += static_cast<std::uint64_t>(sign) * b.region_id.length;
    if (u.bindings == 0) usage_.erase(b.owner.uid);
}

void BindingManager::request(const Peer &caller, const RequestArgs &args, GrantDone done) {
    auto started = start_grant(caller, args, done);
    if (!started) done(started.error());
}

Result<void> BindingManager::start_grant(const Peer &caller, const RequestArgs &args,
                                         GrantDone &done) {
    if (auto r = throttle(caller.uid, caller.pid, "RequestBinding"); !r) return r.error();

    // Sizes first: nothing below copies, parses or quotes more than these.
    for (auto check : {limits::check_length("netdev", args.netdev, limits::netdev),
                       limits::check_length("gpu", args.gpu, limits::gpu),
                       limits::check_length("mode", args.mode, limits::mode)})
        if (!check) return check.error();
    if (args.flows.size() > config_.max_flows)
        return make_error(Errc::invalid_argument,
                          "flows: at most " + std::to_string(config_.max_flows) + " per binding");
    for (std::size_t i = 0; i < args.flows.size(); ++i)
        if (auto c = limits::check_length("flows[" + std::to_string(i) + "]", args.flows[i],
                                          limits::flow);
            !c)
            return c.error();

    policy::Request req;
    req.caller = caller.caller();
    auto mode = policy::parse_mode(args.mode);
    if (!mode) return make_error(Errc::invalid_argument, "mode: must be rx-only, tx or rx-tx");
    req.mode = *mode;
    if (args.flows.empty())
        return make_error(Errc::invalid_argument, "flows: at least one flow spec is needed");
    for (std::size_t i = 0; i < args.flows.size(); ++i) {
        auto f = policy::parse_flow_spec(args.flows[i]);
        if (!f)
            return make_error(Errc::invalid_argument,
                              "flows[" + std::to_string(i) + "]: " + f.error().message);
        req.flows.push_back(*f);
    }
    // A host with nothing to drive: refused as a driver failure, journaled like any refusal.
    if (auto why = driver_.unavailable()) {
        journal::Event e = event_for(journal::kind::denied, caller);
        e.decision = "driver-failure";
        e.reason = *why;
        e.detail = knod::dump_json(nlohmann::json{{"netdev", escape_untrusted(args.netdev)},
                                                  {"gpu", escape_untrusted(args.gpu)},
                                                  {"mode", args.mode},
                                                  {"flows", flows_json(req.flows)},
                                                  {"exe", escape_untrusted(caller.executable)},
                                                  {"policy", policy_.digest}});
        refuse(std::move(e));
        return make_error(Errc::driver_failure, *why);
    }
    auto netdev = driver_.netdev(args.netdev);
    if (!netdev) return netdev.error();
    auto gpu = driver_.gpu(args.gpu);
    if (!gpu) return gpu.error();
    req.netdev = netdev->name;
    req.gpu_names = gpu->names;

    auto region = driver::inspect_region(args.region_fd);
    if (!region) return region.error();
    if (region->kind != driver_.region_kind())
        return make_error(Errc::invalid_argument, std::string("region: the ") + driver_.name() +
                                                      " driver needs a " +
                                                      driver::to_string(driver_.region_kind()) +
                                                      ", not a " + driver::to_string(region->kind));
    if (auto w = driver::check_window(*region, args.offset, args.length); !w) return w.error();
    req.region_bytes = args.length;

    policy::Decision d = policy::decide(policy_, req, usage_of(caller.uid));
    journal::Event decision =
        event_for(d.granted() ? journal::kind::granted : journal::kind::denied, caller);
    decision.rule = d.rule.empty() ? std::nullopt : std::optional(d.rule);
    decision.decision = d.would_deny ? "would-deny" : policy::to_string(d.verdict);
    decision.reason = d.reason;
    nlohmann::json detail{{"netdev", req.netdev},
                          {"gpu", gpu->name},
                          {"mode", args.mode},
                          {"region_bytes", args.length},
                          {"flows", flows_json(req.flows)},
                          {"exe", escape_untrusted(caller.executable)},
                          {"unit", escape_untrusted(caller.unit)},
                          {"user_unit", escape_untrusted(caller.user_unit)},
                          {"gids", caller.gids},
                          {"policy", policy_.digest}};
    decision.detail = knod::dump_json(detail);
    if (!d.granted()) {
        refuse(std::move(decision));
        // Say why each rule missed, so the caller can act without an admin's help.
        std::string why = d.reason;
        for (std::size_t i = 0; i < d.misses.size() && i < 5; ++i)
            why += "; rule '" + d.misses[i].rule + "': " + d.misses[i].why_not;
        return make_error(d.verdict == policy::Verdict::quota_exceeded ? Errc::quota_exceeded
                                                                       : Errc::denied,
                          why);
    }
    // The rule's isolation requirement must hold on this host, whatever permissive mode says.
    host::Verdict iso = host::check(d.iommu, host_.device(netdev->pci), host_.device(gpu->pci));
    if (!iso.ok) {
        decision.kind = journal::kind::denied;
        decision.decision = "isolation-violation";
        decision.reason = iso.reason;
        refuse(std::move(decision));
        return make_error(Errc::isolation_violation,
                          iso.reason + " (rule '" + d.rule + "' requires iommu = \"" +
                              policy::to_string(d.iommu) + "\"); fix: " + iso.fix);
    }
    // Flows are exclusive on a device: the first claimant (live, or granted and waiting for
    // the journal) keeps its traffic, whoever asks, so no binding silently takes another's.
    if (auto c = claims_.conflict(req.netdev, req.flows)) {
        std::string mine = "flows[" + std::to_string(c->requested) + "] '" +
                           req.flows[c->requested].to_string() + "'";
        decision.kind = journal::kind::denied;
        decision.decision = "flow-conflict";
        decision.reason = mine + " overlaps flow '" + c->held.to_string() + "' of binding " +
                          c->binding + " (uid " + std::to_string(c->owner) + ")";
        detail["conflicts_with"] = c->binding;
        decision.detail = knod::dump_json(detail);
        refuse(std::move(decision));
        // Another user's binding is not named: the caller may not see it.
        std::string theirs = c->owner == caller.uid
                                 ? "flow '" + c->held.to_string() + "' of your binding " +
                                       c->binding + " on " + req.netdev +
                                       " (release it first, or ask for flows that do not overlap)"
                                 : "a flow of another user's binding on " + req.netdev;
        return make_error(Errc::flow_conflict, mine + " overlaps " + theirs +
                                                   "; flows on a device are exclusive and the "
                                                   "first binding keeps its traffic");
    }
    // Fail closed: without a journal that can take the grant, nothing is granted. Records still
    // waiting for the disk mean it is not taking writes now: refuse at once, never wait here.
    if (!journal_ready())
        return journal_error(make_error(Errc::journal_unavailable, "the journal cannot be opened"));
    if (!pending_.empty()) {
        flush_pending_async();
        return journal_error(
            make_error(Errc::journal_unavailable,
                       std::to_string(pending_.size()) +
                           " earlier record(s) are still waiting for the disk; retry in a second"));
    }

    Binding b;
    b.id = new_binding_id();
    b.netdev = req.netdev;
    b.gpu = gpu->name;
    b.gpu_names = gpu->names;
    b.mode = req.mode;
    b.flows = req.flows;
    b.owner = caller;
    // A memfd is reopened, not duplicated: the daemon's own open file description, so flags the
    // caller sets later on its own (O_APPEND would make every write land at the end and grow
    // the file) never reach the daemon's writes. A dma-buf cannot be reopened; it is duplicated.
    int dup = region->kind == driver::RegionKind::memfd
                  ? ::open(("/proc/self/fd/" + std::to_string(args.region_fd)).c_str(),
                           O_RDWR | O_CLOEXEC)
                  : fcntl(args.region_fd, F_DUPFD_CLOEXEC, 3);
    if (dup < 0) return make_error(Errc::invalid_argument, "region: cannot take a reference to it");
    b.region = std::make_shared<UniqueFd>(dup);
    b.region_id = {region->device, region->inode, args.offset, args.length};
    b.rule = d.rule;
    b.created_us = journal::now_us();
    b.expires_us = b.created_us +
                   std::chrono::duration_cast<std::chrono::microseconds>(d.key_lifetime).count();

    auto key = keys_.issue({b.id, caller.holder(), b.region_id,
                            keys::Clock::time_point(std::chrono::microseconds(b.expires_us))});
    if (!key) return key.error();
    b.key_id = key->key_id;

    auto queues =
        driver_.attach({b.id, b.netdev, b.gpu, b.flows, b.region->get(), args.offset, args.length});
    if (!queues) {
        keys_.revoke(b.key_id);
        decision.kind = journal::kind::denied;
        decision.decision = "driver-failure";
        decision.reason = queues.error().message;
        refuse(std::move(decision));
        return make_error(Errc::driver_failure, queues.error().message);
    }
    b.queues = *queues;

    journal::Session s;
    s.id = b.id;
    s.uid = caller.uid;
    s.pid = caller.pid;
    s.exe = escape_untrusted(caller.executable); // bytes from /proc: kept readable, never raw
    s.unit = escape_untrusted(caller.unit);
    s.netdev = b.netdev;
    s.gpu = b.gpu;
    s.mode = args.mode;
    s.region_bytes = args.length;
    for (auto &f : b.flows)
        s.flows.push_back(f.to_string());
    s.key_id = b.key_id;
    s.rule = b.rule;
    s.started_us = b.created_us;
    forward(decision, s.netdev, s.gpu);
    Granted g{b.id, b.key_id, key->key, b.rule};
    std::string id = b.id;
    count_usage(b, +1); // in flight counts: concurrent requests cannot slip past a quota
    claims_.claim(b.netdev, id, b.owner.uid, b.flows);
    inflight_.emplace(id, std::move(b));
    journal_->open_session_async(
        s, decision, [this, id, g = std::move(g), done = std::move(done)](Result<std::int64_t> r) {
            post_([this, id, g, done, r = std::move(r)]() mutable {
                finish_grant(id, g, std::move(r), done);
            });
        });
    return {};
}

void BindingManager::finish_grant(const std::string &id, Granted g, Result<std::int64_t> written,
                                  const GrantDone &done) {
    if (auto gone = abandoned_.find(id); gone != abandoned_.end()) {
        // The caller left while its grant was in flight: the data path, key, quota and flows
        // went at once (abandon_grant); here the session, if it reached the disk, is closed.
        Abandoned a = std::move(gone->second);
        abandoned_.erase(gone);
        if (written) close_session(a.binding, a.why, {}, {});
        return done(make_error(Errc::denied, "the caller went away (" + a.why +
                                                 ") before its grant was durable"));
    }
    auto it = inflight_.find(id);
    if (it == inflight_.end()) return done(make_error(Errc::unavailable, "the daemon is stopping"));
    Binding b = std::move(it->second);
    inflight_.erase(it);
    // The caller's process may have exited meanwhile, its connection kept by another process
    // (a child): the key is not handed out, the session ends at once.
    bool exited = written && b.owner.pidfd && !still_running(b.owner.pidfd->get());
    if (!written || exited) {
        count_usage(b, -1);
        claims_.release(b.id);
        driver_.detach(b.id);
        keys_.revoke(b.key_id);
    }
    if (exited) {
        close_session(b, reason::process_exit, {}, {});
        return done(make_error(Errc::denied, "the calling process exited before its grant was "
                                             "durable; nothing is granted"));
    }
    if (!written) {
        // Kept for the retry at the next tick: while it waits, every new request is refused at
        // once, so later callers do not each wait out the busy timeout.
        journal::Event e = event_for(journal::kind::denied, b.owner);
        e.decision = "journal-unavailable";
        e.reason = "granted by rule '" + b.rule + "' but not recorded: " + written.error().message;
        e.detail = knod::dump_json(
            nlohmann::json{{"netdev", b.netdev}, {"gpu", b.gpu}, {"policy", policy_.digest}});
        forward(e, b.netdev, b.gpu);
        keep(std::move(e));
        return done(journal_error(written.error()));
    }
    auto [pos, inserted] = bindings_.emplace(b.id, std::move(b));
    store_handles(pos->second);
    events_.binding_created(pos->second);
    // The start time names the holder from now on; the watch keeps a pidfd per process.
    pos->second.owner.pidfd.reset();
    done(std::move(g));
}

Result<void> BindingManager::activate(const std::string &id, const Peer &presenter,
                                      std::span<const std::uint8_t> key) {
    if (auto r = throttle(presenter.uid, presenter.pid, "Activate"); !r) return r.error();
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return make_error(Errc::not_found, "no binding " + quote_untrusted(id));
    Binding &b = it->second;
    auto ok = keys_.verify(b.key_id, key, presenter.holder(), b.region_id);
    if (!ok) {
        journal::Event e = event_for(journal::kind::activate_refused, presenter);
        e.session_id = id;
        e.decision = "key-refused";
        e.reason = ok.error().message;
        name_policy(e);
        refuse(std::move(e));
        return make_error(Errc::denied, "key refused: " + ok.error().message);
    }
    if (b.state == BindingState::active) return {};
    if (auto r = driver_.activate(id); !r) {
        // A refusal like a wrong key (same kind, coalesced per uid), told apart by decision.
        journal::Event e = event_for(journal::kind::activate_refused, presenter);
        e.session_id = id;
        e.decision = "driver-failure";
        e.reason = escape_untrusted(r.error().message, Escape::message);
        name_policy(e);
        refuse(std::move(e));
        return make_error(Errc::driver_failure, r.error().message);
    }
    b.state = BindingState::active;
    store_handles(b); // a driver may hold a kernel handle of its own from now on
    journal::Event e = event_for("activated", presenter);
    e.session_id = id;
    record(std::move(e));
    return {};
}

Result<BindingManager::RxNotifier> BindingManager::rx_notifier(const std::string &id,
                                                               const Peer &presenter,
                                                               std::span<const std::uint8_t> key) {
    if (auto r = throttle(presenter.uid, presenter.pid, "RxNotifier"); !r) return r.error();
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return make_error(Errc::not_found, "no binding " + quote_untrusted(id));
    // Only the holder may learn when data lands: the same key check as Activate, not journaled
    // (it grants nothing), but rate-limited like every call.
    if (auto ok = keys_.verify(it->second.key_id, key, presenter.holder(), it->second.region_id);
        !ok)
        return make_error(Errc::denied, "key refused: " + ok.error().message);
    auto fd = driver_.rx_notifier(id);
    if (!fd) return fd.error();
    // One loop thread: no payload lands between these two lines, so RxBytes plus what the
    // eventfd counts from here is exact.
    return RxNotifier{std::move(*fd), driver_.counters(id).rx_bytes};
}

policy::Decision BindingManager::decide_again(const Binding &b) const {
    policy::Request req;
    req.caller = b.owner.caller();
    req.netdev = b.netdev;
    req.gpu_names = b.gpu_names;
    req.mode = b.mode;
    req.region_bytes = b.region_id.length;
    req.flows = b.flows;
    return policy::decide(policy_, req, usage_of(b.owner.uid, b.id));
}

Result<std::int64_t> BindingManager::renew(const std::string &id, const Peer &presenter,
                                           std::span<const std::uint8_t> key) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return make_error(Errc::not_found, "no binding " + id);
    Binding &b = it->second;
    // Refusals are coalesced per uid like every other kind: a holder (or an auditor, who sees
    // every binding) looping on Renew grows the journal no faster than any refused caller.
    auto refused = [&](Errc code, const std::string &why) -> Error {
        journal::Event e = event_for("renew-refused", presenter);
        e.session_id = id;
        e.reason = why;
        name_policy(e);
        refuse(std::move(e));
        return make_error(code, why);
    };
    if (auto ok = keys_.verify(b.key_id, key, presenter.holder(), b.region_id); !ok)
        return refused(Errc::denied, "key refused: " + ok.error().message);
    policy::Decision d = decide_again(b);
    if (!d.granted())
        return refused(Errc::denied,
                       "the current policy no longer grants this binding: " + d.reason);
    std::int64_t until =
        journal::now_us() +
        std::chrono::duration_cast<std::chrono::microseconds>(d.key_lifetime).count();
    until = std::max(until, b.expires_us); // renewing never shortens
    if (auto r = keys_.extend(b.key_id, keys::Clock::time_point(std::chrono::microseconds(until)));
        !r)
        return refused(r.error().code, r.error().message);
    b.expires_us = until;
    journal::Event e = event_for("renewed", presenter);
    e.session_id = id;
    e.rule = d.rule;
    e.detail = knod::dump_json(nlohmann::json{{"expires_us", until}, {"policy", policy_.digest}});
    record(std::move(e));
    return until;
}

void BindingManager::close_session(const Binding &b, const std::string &why,
                                   const journal::Counters &c, Done durable,
                                   const std::string &seen) {
    journal::Event e = event_for(journal::kind::ended, b.owner);
    e.reason = why;
    nlohmann::json detail{{"rx_bytes", c.rx_bytes},
                          {"rx_packets", c.rx_packets},
                          {"dropped_packets", c.dropped_packets}};
    // What the driver saw (steering drift): the daemon's own words, bounded like a reason.
    if (!seen.empty()) detail["seen"] = seen.substr(0, limits::reason);
    e.detail = knod::dump_json(detail);
    if (why == reason::policy_reload) name_policy(e); // the policy that ended it
    forward(e, b.netdev, b.gpu);
    if (pending_.empty() && !stopping_ && journal_ready()) {
        PendingEnd end{b.id, why, c, e};
        journal_->close_session_async(b.id, why, c, std::move(e),
                                      [this, end, durable](Result<std::int64_t> r) {
                                          post_([this, end, durable, ok = r.ok()] {
                                              if (!ok) keep(end);
                                              if (durable) durable({});
                                          });
                                      });
    } else {
        keep(PendingEnd{b.id, why, c, std::move(e)});
        if (durable) durable({});
    }
}

void BindingManager::end_binding(const std::string &id, const std::string &why, Done durable,
                                 const std::string &note) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    // Stop the data path and kill the key first: security does not wait for the disk.
    journal::Counters c = driver_.counters(id);
    driver_.detach(id);
    keys_.revoke(it->second.key_id);
    close_session(it->second, why, c, std::move(durable),
                  why == reason::steering_drift ? note : std::string());
    count_usage(it->second, -1);
    claims_.release(id);
    if (store_)
        for (auto &name : it->second.stored)
            store_->remove(name);
    Binding ended = std::move(it->second);
    bindings_.erase(it);
    events_.binding_ended(ended, why, note);
}

void BindingManager::release(const std::string &id, const Peer &by, bool privileged, Done done) {
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return done(make_error(Errc::not_found, "no binding " + quote_untrusted(id)));
    if (!privileged && it->second.owner.uid != by.uid)
        return done(make_error(Errc::denied, "binding " + id + " belongs to uid " +
                                                 std::to_string(it->second.owner.uid) +
                                                 "; only its owner or an admin may release it"));
    end_binding(id, reason::release, std::move(done));
}

void BindingManager::revoke(const std::string &id, const std::string &why, const Peer &by,
                            Done done) {
    if (!bindings_.count(id))
        return done(make_error(Errc::not_found, "no binding " + quote_untrusted(id)));
    journal::Event e = event_for(journal::kind::revoked, by);
    e.session_id = id;
    e.reason = escape_untrusted(why.substr(0, limits::reason), Escape::message);
    record(std::move(e));
    end_binding(id, reason::revoke, std::move(done), why);
}

void BindingManager::refuse_action(const char *kind, const Peer &by, const std::string &decision,
                                   const std::string &why,
                                   const std::optional<std::string> &binding) {
    journal::Event e = event_for(kind, by);
    e.decision = decision;
    e.reason = escape_untrusted(why.substr(0, limits::reason), Escape::message);
    // The caller's text, not necessarily a binding that exists: detail only, escaped.
    if (binding)
        e.detail = knod::dump_json(nlohmann::json{{"binding", escape_untrusted(*binding)}});
    name_policy(e); // the policy in force: it names who may administer (admin_group)
    refuse(std::move(e));
}

Result<std::size_t> BindingManager::reload(policy::Policy next, const Peer &by,
                                           const std::string &via) {
    // Every setting takes effect now, or the reload is refused and the old policy stays.
    if (auto r = apply_settings(next.settings); !r) {
        auto err = make_error(r.error().code, r.error().message + "; the old policy stays");
        refuse_action(journal::kind::reload_refused, by, "invalid-policy",
                      via + ": " + err.message);
        return err;
    }
    policy_ = std::move(next);
    if (policy_.digest.empty()) policy_.digest = policy::policy_digest(policy_.text);
    std::vector<std::string> doomed;
    for (auto &[id, b] : bindings_) {
        if (!decide_again(b).granted()) doomed.push_back(id);
    }
    journal::Event e = event_for(journal::kind::reload, by);
    e.reason = "reloaded by " + via; // as before: "uid N" (D-Bus) or "SIGHUP"
    e.detail =
        knod::dump_json(nlohmann::json{{"rules", policy_.rules.size()}, {"revoked", doomed}});
    record_load(std::move(e));
    for (auto &id : doomed)
        end_binding(id, reason::policy_reload);
    events_.policy_reloaded(policy_.rules.size(), doomed.size());
    return doomed.size();
}

void BindingManager::holder_gone(const std::string &id, const std::string &why) {
    end_binding(id, why);
}

void BindingManager::abandon_grant(const std::string &id, const std::string &why) {
    auto it = inflight_.find(id);
    if (it == inflight_.end()) return;
    driver_.detach(id);
    keys_.revoke(it->second.key_id);
    count_usage(it->second, -1);
    claims_.release(id);
    abandoned_.emplace(id, Abandoned{std::move(it->second), why});
    inflight_.erase(it);
}

void BindingManager::connection_gone(const std::string &bus_name) {
    std::vector<std::string> gone;
    for (auto &[id, b] : inflight_)
        if (b.owner.bus_name == bus_name) gone.push_back(id);
    for (auto &id : gone)
        abandon_grant(id, reason::disconnect);
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        if (b.owner.bus_name == bus_name) ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, reason::disconnect);
}

void BindingManager::netdev_gone(const std::string &netdev, const std::string &why) {
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        if (b.netdev == netdev) ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, why);
}

void BindingManager::tick(std::int64_t now_us) {
    std::vector<std::string> expired;
    for (auto &[id, b] : bindings_)
        if (b.expires_us <= now_us) expired.push_back(id);
    for (auto &id : expired)
        end_binding(id, reason::expire);
    for (auto &[id, seen] : driver_.drifted())
        if (bindings_.count(id)) end_binding(id, reason::steering_drift, {}, seen);
    keys_.expire(keys::Clock::time_point(std::chrono::microseconds(now_us)));
    if (now_us - last_retention_us_ >= 3600ll * 1000000) (void)apply_retention();
    record_coalesced(now_us, false);
    flush_pending_async();
}

void BindingManager::shutdown() {
    stopping_ = true;
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, reason::daemon_stop);
    record_coalesced(journal::now_us(), true);
    journal::Event e;
    e.kind = journal::kind::daemon_stop;
    record(std::move(e));
    report_unwritten(flush_pending_now());
}

void BindingManager::report_unwritten(const Result<void> &flushed) const {
    if (flushed && pending_.empty()) return;
    std::cerr << "knod-policyd: " << pending_.size()
              << " journal record(s) could not be written at stop"
              << (flushed ? std::string() : ": " + flushed.error().message)
              << "; sessions left open are closed as daemon-restart at the next start" << std::endl;
}

std::size_t BindingManager::hand_off() {
    stopping_ = true;
    std::map<std::string, std::string> rows;
    std::vector<std::string> ending;
    for (auto &[id, b] : bindings_) {
        auto state = driver_.handoff(id);
        bool stored = std::find(b.stored.begin(), b.stored.end(), id + ".region") != b.stored.end();
        std::string row = state && stored ? handoff_of(b, *state) : std::string();
        if (row.empty())
            ending.push_back(id);
        else
            rows.emplace(id, std::move(row));
    }
    (void)flush_pending_now();
    if (!rows.empty() && !(journal_ready() && journal_->hand_off(rows))) {
        // Not on disk: the next start could not take them back, so they end now as before.
        for (auto &[id, row] : rows)
            ending.push_back(id);
        rows.clear();
    }
    for (auto &id : ending)
        end_binding(id, reason::daemon_stop);
    record_coalesced(journal::now_us(), true);
    journal::Event e;
    e.kind = journal::kind::daemon_stop;
    e.reason = std::to_string(rows.size()) +
               " binding(s) handed to systemd's file-descriptor store for the next start";
    e.detail =
        knod::dump_json(nlohmann::json{{"handed_over", rows.size()}, {"ended", ending.size()}});
    record(std::move(e));
    report_unwritten(flush_pending_now());
    // The handed-over bindings stay as they are: no detach, no revoke, their sessions open.
    // The process exit closes the daemon's copies of their fds; systemd holds its own.
    return rows.size();
}

const Binding *BindingManager::find(const std::string &id) const {
    auto it = bindings_.find(id);
    return it == bindings_.end() ? nullptr : &it->second;
}

std::vector<const Binding *> BindingManager::bindings() const {
    std::vector<const Binding *> out;
    for (auto &[id, b] : bindings_)
        out.push_back(&b);
    return out;
}

ManagerStatus BindingManager::status() const {
    return {bindings_.size(),
            journal_ != nullptr && pending_.empty(),
            pending_.size(),
            dropped_records_,
            sinks_ ? sinks_->dropped() : 0,
            sinks_ ? sinks_->names() : std::vector<std::string>{},
            sinks_ ? sinks_->stats() : std::vector<sinks::SinkStats>{}};
}

} // namespace knod::daemon
