// The core of knod-policyd: every binding's life, from request to end. It decides by policy,
// issues keys, programs the driver and journals each step; it knows nothing about D-Bus. The
// bus adaptor unpacks arguments and credentials and calls in here.
#pragma once

#include "daemon/audit_trail.h"
#include "daemon/driver/driver.h"
#include "daemon/end_reason.h"
#include "daemon/flow_claims.h"
#include "daemon/handle_store.h"
#include "daemon/holder_watch.h"
#include "daemon/keys/key_authority.h"
#include "daemon/metrics.h"
#include "daemon/peer.h"
#include "daemon/pod_registry.h"
#include "daemon/rate_limiter.h"
#include "host/isolation.h"
#include "host/paths.h"
#include "knod/boot_clock.h"
#include "policy/engine.h"

#include <nlohmann/json_fwd.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace knod::daemon {

enum class BindingState { granted, active };
const char *to_string(BindingState s);

// The job a binding's holder says it serves (Binding.SetJob; issue #53): a torch.distributed
// job's name (its store's address or a name), the process group and the rank. A claim of the
// caller's, never an identity: nothing the daemon decides (policy, quotas, flows, keys) reads
// it; it only groups a job's ranks where people look (the journal, `knod-policy bindings`, the
// metrics). Set at most once per binding; the strings are bounded and of a fixed alphabet.
struct JobTag {
    static constexpr std::size_t max_name = 64; // bytes, for the job and for the group
    static constexpr std::uint32_t max_rank = 65535;
    std::string job;   // 1..64 bytes of [A-Za-z0-9._:@/-]
    std::string group; // 0..64 bytes of the same
    std::uint32_t rank = 0;
};
// InvalidArgument naming what is wrong (the bad bytes escaped) unless `tag` is well formed.
Result<void> check_job_tag(const JobTag &tag);

struct Binding {
    std::string id;
    std::string netdev;
    std::string gpu;
    std::vector<std::string> gpu_names;
    policy::Mode mode = policy::Mode::rx_only;
    std::vector<policy::FlowSpec> flows;
    std::vector<std::uint32_t> queues;
    Peer owner;
    std::shared_ptr<UniqueFd> region; // the daemon's own dup of the caller's region fd
    keys::Region region_id;
    std::string key_id;
    std::string rule;
    std::int64_t created_us = 0;
    // When its key expires, on the wall clock, as computed when it was issued or renewed: what
    // the journal and the API show. The decision runs on `deadline` (CLOCK_BOOTTIME), which a
    // step of the wall clock does not move.
    std::int64_t expires_us = 0;
    BootClock::time_point deadline{};
    BindingState state = BindingState::granted;
    std::vector<std::string> stored;     // names of its handles in the fd store (HandleStore)
    std::uint64_t policy_generation = 0; // BindingManager's, when it was decided
    std::optional<JobTag> job;           // what its holder said with SetJob; never decided on
};

// How the manager tells the outside world; the bus adaptor implements it.
class BindingEvents {
  public:
    virtual ~BindingEvents() = default;
    virtual void binding_created(const Binding &b) = 0;
    // `note` is what the ender said (an admin's revoke reason) or saw (steering drift).
    virtual void binding_ended(const Binding &b, EndReason why, const std::string &note) = 0;
    virtual void policy_reloaded(std::size_t rules, std::size_t revoked) = 0;
    // A binding the previous daemon handed over (a restart): its holder already knows it, so
    // nothing is announced; the holder's exit is watched again.
    virtual void binding_adopted(const Binding &) {}
};

struct RequestArgs {
    std::string netdev;
    std::string gpu;
    std::string mode;
    int region_fd = -1;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    std::vector<std::string> flows;
};

struct Granted {
    std::string id;
    std::string key_id;
    keys::KeyBytes key;
    std::string rule;
    std::string decision = "allow"; // or would-deny (permissive mode)
};

struct ManagerConfig {
    std::string journal_path;
    // Calls per second per uid, over every method (uid 0 is not limited), with bursts.
    double requests_per_second = 50;
    double request_burst = 100;
    // Repeated refusals of one uid and kind are journaled once per window, with a count.
    std::chrono::seconds refusal_window{10};
    std::size_t max_flows = 64;
    // Bounds in all, whoever asks (root too: they protect the daemon's fds and memory, not users
    // from each other; the policy's per-uid quotas do that). Live and in-flight bindings:
    std::size_t max_bindings = 16384;
    // Grants waiting for the journal's commit (each a pending reply, a region fd and a pidfd);
    // the group commit keeps this short for honest callers.
    std::size_t max_grants_in_flight = 1024;
    // Bindings with a notifier pipe (RxNotifier; one per binding, a new one replaces the old).
    std::size_t max_notifiers = 16384;
    // The fds callers can make the daemon hold: a region per binding, a pidfd per holder
    // process (and per grant in flight), a notifier pipe per binding that asked. main() sets it
    // to the fd limit less what the daemon needs for itself; 0: not checked.
    std::size_t max_caller_fds = 0;
    // Retention, applied at start and hourly: events older than this, beyond this many.
    std::optional<std::chrono::seconds> retain_age;
    std::optional<std::int64_t> retain_events;
    // The auditors' snapshot of the journal (AuditConfig): how often, and its files' mode.
    std::chrono::milliseconds snapshot_interval{0};
    mode_t snapshot_mode = 0600;
    // Where isolation checks and the host report read the host (fixture trees in tests).
    host::HostPaths host;
};

struct ManagerStatus {
    std::size_t bindings = 0;
    bool journal_available = false;
    std::size_t pending_records = 0; // journal records waiting for the disk to come back
    std::uint64_t journal_dropped = 0;
    std::uint64_t sink_dropped = 0; // journald / Linux audit copies that did not fit the queue
    std::vector<std::string> sinks;
    std::vector<sinks::SinkStats> sink_stats; // per sink: written, failed, dropped, failing
};

using GrantDone = std::function<void(Result<Granted>)>;
// Reads the policy afresh for a reload (the files the daemon started with); an invalid policy
// comes back as an error.
using PolicyLoader = std::function<Result<policy::Policy>()>;

class BindingManager {
  public:
    BindingManager(ManagerConfig config, driver::Driver &driver, keys::KeyAuthority keys,
                   policy::Policy policy, BindingEvents &events, Post post);
    ~BindingManager();

    // Opens the journal, takes back the bindings a previous daemon handed over (hand_off) whose
    // handles came back and whose holders live, closes every other open session as
    // daemon-restart, records the start. A journal that cannot be opened is not fatal:
    // requests are refused until it can be.
    void start();
    // Where live bindings' kernel handles are kept across a restart (systemd's fd store);
    // optional. Set before start().
    void set_handle_store(HandleStore *store) { store_ = store; }
    // Where holders' pidfds are watched (the daemon's loop): a binding ends when its holder's
    // process exits. Optional (tests without a loop); set before start().
    void set_event_loop(driver::EventLoop *loop);
    // Hands the policy's settings to the driver (unmatched traffic); fails if it cannot honour
    // them. Called before start(); reload() does the same for the next policy.
    Result<void> apply_settings() { return apply_settings(policy_.settings); }

    // Decides and prepares at once; `done` gets the key only once the session row and grant
    // event are durable (or the error). Concurrent requests share one commit. Immediate
    // refusals call `done` before returning.
    void request(const Peer &caller, const RequestArgs &args, GrantDone done);
    Result<void> activate(const std::string &id, const Peer &presenter,
                          std::span<const std::uint8_t> key);
    // The holder extends its key (and binding) by the current policy's key lifetime, counted
    // from now, if the current policy still grants the binding. Returns the new expiry (us
    // since the epoch). Journaled; refused like Activate for a wrong key.
    Result<std::int64_t> renew(const std::string &id, const Peer &presenter,
                               std::span<const std::uint8_t> key);
    // The holder (its key, checked like Activate's) tags its binding with the job it serves:
    // once (a second call is InvalidArgument, naming the tag it has), with a tag check_job_tag
    // accepts. Nothing changes on a refusal. Journaled (job-tagged, detail {job, group, rank});
    // refusals too (job-tag-refused, coalesced per uid like every refusal). The tag is never an
    // input to a decision.
    Result<void> set_job(const std::string &id, const Peer &presenter,
                         std::span<const std::uint8_t> key, const JobTag &tag);
    // The holder (its key, checked like Activate's) gets the read end of a pipe on which the
    // driver writes RxBytes after each batch of delivered payloads from now on, and the RxBytes
    // it starts from: its wait_for_data sleeps on it. Unsupported where the driver places no
    // data itself.
    struct RxNotifier {
        UniqueFd fd;
        std::uint64_t rx_bytes = 0;
    };
    Result<RxNotifier> rx_notifier(const std::string &id, const Peer &presenter,
                                   std::span<const std::uint8_t> key);
    // The per-user rate limit (a uid in its domain: a pod's users are not the host's), for every
    // method (the bus adaptor calls it for those that do not come in here): QuotaExceeded when
    // `uid` has no token left; refusals are journaled, coalesced. Root is not limited: it can stop
    // the daemon or edit the journal anyway. `exempt`: Peer::root_in_host() of the caller (a
    // container's root is limited).
    Result<void> throttle(const PrincipalKey &who, pid_t pid, bool exempt, const char *method);
    // A call refused because its caller reached a bound on what the daemon keeps for it (`what`:
    // which bound, and its value): journaled and coalesced as the rate limit's refusals are
    // (kind rate-limited, detail {"method", "limit"}); the error is LimitsExceeded.
    Error refuse_limit(uid_t uid, pid_t pid, bool exempt, const char *method,
                       const std::string &what);
    // The owner, or anyone `privileged` (an admin), may release. The data path stops at once;
    // `done` runs once the end is on disk (or kept to write when the disk is back).
    void release(const std::string &id, const Peer &by, bool privileged, Done done);
    void revoke(const std::string &id, const std::string &why, const Peer &by, Done done);
    // Replaces the policy; revokes bindings it no longer allows. Returns how many. `by` is the
    // actor (its uid and pid go in the event), `via` how it asked, in the event's text ("uid N"
    // over D-Bus, "SIGHUP").
    Result<std::size_t> reload(policy::Policy next, const Peer &by, const std::string &via);
    // The same with the policy the loader reads now (ReloadPolicy, SIGHUP); a policy that does
    // not load is journaled as refused and the old one stays.
    Result<std::size_t> reload(const Peer &by, const std::string &via);
    void set_policy_loader(PolicyLoader loader) { loader_ = std::move(loader); }
    // Journals a privileged action refused to `by` (`kind`: journal::kind::reload_refused or
    // revoke_refused), coalesced like every refusal. `decision`: not-authorized or
    // invalid-policy; `binding`: a revoke's argument.
    void refuse_action(const char *kind, const Peer &by, const std::string &decision,
                       const std::string &why, const std::optional<std::string> &binding = {});
    // Journals a call on binding `id` refused to its presenter (Activate, Renew, SetJob: `kind`
    // names which), coalesced per uid like every refusal; `decision` tells causes apart.
    void refuse_on_binding(const char *kind, const Peer &presenter, const std::string &id,
                           std::optional<std::string> decision, std::string reason);
    // Journals a RequestBinding refused before the policy was asked (`why`: bad arguments, an
    // unknown netdev or GPU, no driver; decision invalid-request or driver-failure), with the
    // arguments escaped and cut, coalesced like every refusal. `caller`: as far as it could be
    // identified (a caller whose process is gone has only the bus's uid and pid).
    void refuse_request(const Peer &caller, const RequestArgs &args, const Error &why);
    // The holder's process exited (HolderWatch) or its bus connection went away.
    void holder_gone(const std::string &id, EndReason why);
    // Ends every binding of a bus connection (it disconnected).
    void connection_gone(const std::string &bus_name);
    // Binding `id` is held on connection `bus_name` from now on: its holder process came back
    // on a new connection after a restart (the caller checked that it is that process).
    // Journaled holder-returned.
    void hold_on(const std::string &id, const std::string &bus_name);
    // Ends every binding on a network device that went down or away.
    void netdev_gone(const std::string &netdev, EndReason why);
    // The pod sandboxes the node's CNI plugin registered (the bus adaptor registers them and
    // looks callers up in it; daemon/pod_registry.h).
    PodRegistry &pods() { return pods_; }
    const PodRegistry &pods() const { return pods_; }
    // What a pod declares it will ask for (its knod.io/netdev, gpu, flows and region
    // annotations), checked against the policy when its sandbox is registered, before any of
    // its processes runs (policy::Caller::uid_known false). A denial is journaled
    // (pod-refused) and comes back as Denied naming the deciding rule; InvalidArgument for
    // annotations that do not parse. The caller then does not register the pod.
    struct PodOffload {
        std::string netdev, gpu;
        std::vector<std::string> flows;
        std::uint64_t region_bytes = 0;
    };
    Result<void> check_pod(const PodSandbox &sandbox, const PodOffload &wants);
    // A pod sandbox was deleted: ends every binding held by a process of it (end reason
    // pod-deleted) and forgets it. Returns how many bindings ended.
    std::size_t pod_deleted(const std::string &container_id, const std::string &ifname);
    // CNI GC for `network`: as pod_deleted for every sandbox it registered that is not in
    // `valid` (container id, ifname). Returns how many registrations went; `ended` gets how
    // many bindings ended.
    std::size_t pods_collected(const std::string &network,
                               const std::set<std::pair<std::string, std::string>> &valid,
                               std::size_t &ended);
    // Periodic work: expiry, steering drift (Driver::drifted), and retrying journal records
    // that could not be written.
    void tick(std::int64_t now_us, BootClock::time_point boot_now = BootClock::now());
    // Ends every binding (SIGTERM) and records the stop.
    void shutdown();
    // A stop that keeps bindings (SIGTERM under systemd with a handle store): every binding
    // the driver can hand over stays open in the journal with what the next start needs, its
    // handles stay in the store; the others end as daemon-stop. Records the stop. Returns how
    // many were handed over.
    std::size_t hand_off();

    const Binding *find(const std::string &id) const;
    std::vector<const Binding *> bindings() const;
    const policy::Policy &policy() const { return policy_; }
    ManagerStatus status() const;
    std::size_t binding_count() const { return bindings_.size(); }
    // The journal's and the sinks' state, for the figures status() sums up.
    const AuditTrail &audit() const { return audit_; }
    // The counters fleet monitoring reads (GetMetrics).
    const Metrics &metrics() const { return metrics_; }
    driver::Counters counters(const std::string &id) const { return driver_.counters(id); }
    const driver::Driver &driver() const { return driver_; }
    const host::HostPaths &host_paths() const { return config_.host; }
    const std::string &journal_path() const { return config_.journal_path; }
    std::size_t max_flows() const { return config_.max_flows; }
    // Copies of every event go here too (journald, Linux audit); optional. A sink that starts
    // or stops failing becomes a sink-failing / sink-recovered event.
    void set_sinks(sinks::SinkQueue *sinks) { audit_.set_sinks(sinks); }
    // Applies the retention settings now; returns how many events went.
    Result<std::int64_t> apply_retention() { return audit_.apply_retention(); }

  private:
    // Ends the bindings of the pods whose registrations these were, where no other
    // registration of the same container id is left; returns how many ended.
    std::size_t end_pods_gone(std::vector<PodSandbox> gone);
    Result<void> apply_settings(const policy::Settings &settings);
    // Reads one handoff record and checks its MAC (the whole record, under the key secret),
    // its format, and that it was written for this binding of this journal. Nothing in a
    // record that fails is acted on.
    Result<nlohmann::json> open_handoff(const std::string &id, const std::string &text);
    // Takes back one handed-over binding from its opened record; the error says why not (its
    // session is then closed).
    Result<void> adopt(const std::string &id, const nlohmann::json &record);
    // The holder of an authentic handoff record not taken back, to be told why (#52).
    std::optional<Binding> holder_to_tell(const std::string &id, const nlohmann::json &record);
    // Non-const: the journal (whose id the record names) opens on first use.
    std::string handoff_of(const Binding &b, const std::string &driver_state);
    // Pod registrations across a restart (issue #51): at hand_off each sandbox's network
    // namespace goes to the handle store ("pod-N.netns"), and beside it a record of who they
    // are ("pods.handoff", a memfd), sealed under the key secret and bound to this journal;
    // restore_pods at start takes back those whose record is authentic and whose fd is still
    // that namespace, before any binding is taken back. Returns how many were kept / restored.
    // The record carries a token of its stop, written in that stop's daemon-stop event too:
    // only the record of the journal's last stop, with no start since, is taken back (an older
    // record, replayed through the fd store, is not).
    std::size_t keep_pods();
    std::size_t restore_pods();
    std::string pods_token_; // keep_pods's, for the daemon-stop event
    // Keeps the binding's region fd and the driver's handles in the store, by binding id.
    void store_handles(Binding &b);
    void end_binding(const std::string &id, EndReason why, Done durable = {},
                     const std::string &note = {});
    // Journals a session's end (now, or kept for when the journal is back).
    void close_session(const Binding &b, EndReason why, const driver::Counters &c, Done durable,
                       const std::string &seen = {});
    // A grant in flight that will not be handed out (its caller left, or what ends bindings
    // reached it first: a pod's DEL or GC, a reload, a revoke, its netdev going; issue #51):
    // everything it held goes now; finish_grant closes its session, with `why`, instead of
    // handing out the key, and tells the caller.
    void abandon_grant(const std::string &id, EndReason why, const std::string &note = {});
    // The in-flight grants matching `which`, withdrawn as abandon_grant; returns how many.
    template <typename Pred> std::size_t withdraw_grants(Pred which, EndReason why);
    // Whether a grant in flight may still be handed out now that its session is durable:
    // decided again against the policy and the pods in force; nullopt when it may, else why not.
    struct Withdrawal {
        EndReason why;
        std::string note;
    };
    std::optional<Withdrawal> still_granted(const Binding &b) const;
    // RequestBinding's steps (start_grant runs them in order; each may refuse).
    struct ParsedRequest {
        policy::Request request;
        driver::NetdevInfo netdev;
        driver::GpuInfo gpu;
        driver::RegionInfo region;
    };
    struct Decided {
        policy::Decision decision;
        journal::Event event; // the grant event, or the refusal's
    };
    struct Prepared {
        Binding binding;
        keys::KeyBytes key;
    };
    Result<void> start_grant(const Peer &caller, const RequestArgs &args, GrantDone &done);
    Result<ParsedRequest> parse_request(const Peer &caller, const RequestArgs &args);
    // The netdev and GPU the driver knows by these names, into `parsed` (and its request's
    // netdev and GPU names); DriverFailure when the host has nothing to drive. Shared by
    // RequestBinding and a pod's start-time check.
    Result<void> resolve_devices(const std::string &netdev, const std::string &gpu,
                                 ParsedRequest &parsed);
    Result<Decided> decide_request(const Peer &caller, const RequestArgs &args,
                                   const ParsedRequest &parsed);
    Result<Prepared> prepare_grant(const Peer &caller, const RequestArgs &args,
                                   const ParsedRequest &parsed, Decided &decided);
    void commit_grant(const RequestArgs &args, const Decided &decided, Prepared prepared,
                      GrantDone &done);
    void finish_grant(const std::string &id, Granted g, Result<std::int64_t> written,
                      const GrantDone &done);
    policy::Usage usage_of(const PrincipalKey &who, const std::string &except_id = {}) const;
    // The current policy's decision on a live binding, as if it were asked for now (its own
    // usage not counted against it): reload and Renew.
    policy::Decision decide_again(const Binding &b) const;
    void count_usage(const Binding &b, int sign); // +1 when granted (in flight), -1 when gone
    // The fds held for callers now (ManagerConfig::max_caller_fds).
    std::size_t caller_fds() const;

    ManagerConfig config_;
    driver::Driver &driver_;
    keys::KeyAuthority keys_;
    policy::Policy policy_;
    BindingEvents &events_;
    Post post_;
    Metrics metrics_;  // before audit_: the journal's writer observes commit latencies into it
    AuditTrail audit_; // closed first (the destructor): its writer's answers post to the loop
    std::map<std::string, Binding> bindings_;
    std::map<std::string, Binding> inflight_; // granted, waiting for the journal to commit
    struct Abandoned {
        Binding binding;
        EndReason why;
        std::string note; // what withdrew it, for the caller's error
    };
    std::map<std::string, Abandoned> abandoned_; // in flight, caller gone: nothing to hand out
    // Live and in-flight bindings per principal (a uid in its domain), for quotas.
    std::map<PrincipalKey, policy::Usage> usage_;
    std::set<std::string> notified_; // bindings whose holder has a notifier pipe
    RateLimiter limiter_;
    // Per domain other than the host's (a pod, the unplaced): a pod's root can take any number
    // of uids, each a principal with a bucket of its own, so the pod as a whole has one too
    // (four times a uid's rate and burst).
    RateLimiter domain_limiter_;
    FlowClaims claims_; // flows of live and in-flight bindings, per netdev
    PodRegistry pods_;
    HandleStore *store_ = nullptr;
    std::unique_ptr<HolderWatch> holders_;
    PolicyLoader loader_;
    host::SysfsHost host_;
    std::uint64_t policy_generation_ = 0; // one more at each reload
};

} // namespace knod::daemon
