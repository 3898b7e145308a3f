#include "daemon/bus/bus_service.h"
#include "daemon/resource_failures.h"
#include "policy/parser.h"

#include "daemon/bus/guard.h"
#include "daemon/host_report.h"
#include "daemon/metrics.h"
#include "daemon/process_attestation.h"
#include "daemon/request_limits.h"
#include "protocol/names.h"

#include "knod/system_error.h"
#include "knod/untrusted.h"
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <string_view>
#include <thread>

namespace knod::bus {
namespace limits = daemon::limits;
namespace {

constexpr const char *daemon_version = KNOD_VERSION;

// What a caller reads: valid UTF-8 without control characters (sd-bus refuses to send anything
// else, and the caller might print it), and short, whatever the error quoted.
std::string reply_text(const Error &e) {
    return escape_untrusted(e.message, Escape::message, limits::error_message);
}

const char *dbus_name(const Error &e) {
    return error_name(e.code);
}

int fail(sd_bus_error *err, const Error &e) {
    daemon::ResourceFailures::instance().note(e);
    return sd_bus_error_set(err, dbus_name(e), reply_text(e).c_str());
}

BusService *service(void *self) {
    return static_cast<BusService *>(self);
}

// Replies to `call` with the error's D-Bus name and message, later than the handler returned.
void reply_error(sd_bus_message *call, const Error &e) {
    daemon::ResourceFailures::instance().note(e);
    sd_bus_reply_method_errorf(call, dbus_name(e), "%s", reply_text(e).c_str());
}

// The call being handled, kept for a reply sent later (a completion). sd-bus counts its
// references without atomics, and each reference to a message is one to the bus: dropped on
// another thread (the journal's writer), it can leave the bus's count short, and the bus is
// freed under live slots (bus_free(): "Assertion 's->floating' failed"). The core hands every
// completion back to the loop; should one still be dropped elsewhere, it is leaked and logged,
// never unreferenced there.
std::shared_ptr<sd_bus_message> hold_call(sd_bus_message *m) {
    return {sd_bus_message_ref(m), [loop = std::this_thread::get_id()](sd_bus_message *p) {
                if (std::this_thread::get_id() == loop) {
                    sd_bus_message_unref(p);
                    return;
                }
                std::cerr << "knod-policyd: internal error: a call was released off the event "
                             "loop's thread; leaked instead"
                          << std::endl;
            }};
}

// A binding is its owner's: the same uid in the same domain (Peer::domain: a pod, the host, or
// a container's namespaces): a container's root is not the host's, nor one pod's uid 1000
// another's. A caller that could not be identified owns nothing.
bool owns(const Credentials &c, const daemon::Binding &b) {
    return !c.domain.empty() && c.uid == b.owner.uid && c.domain == b.owner.domain();
}

// A completion that answers `m` with an empty reply or the error, whenever it runs.
daemon::Done reply_when_done(sd_bus_message *m) {
    std::shared_ptr<sd_bus_message> call = hold_call(m);
    return [call](Result<void> r) {
        if (r)
            sd_bus_reply_method_return(call.get(), "");
        else
            reply_error(call.get(), r.error());
    };
}

// The properties' getters, one per property.
namespace get {
using daemon::Binding;
using daemon::BindingManager;

int version(sd_bus_message *m, const BindingManager &) {
    return sd_bus_message_append(m, "s", daemon_version);
}
int driver(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "s", mgr.driver().name().c_str());
}
int binding_count(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "u", static_cast<std::uint32_t>(mgr.binding_count()));
}
int rules(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "u", static_cast<std::uint32_t>(mgr.policy().rules.size()));
}
int policy_digest(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "s", mgr.policy().digest.c_str());
}
int journal_path(sd_bus_message *m, const BindingManager &mgr) {
    std::error_code ec;
    auto absolute = std::filesystem::absolute(mgr.journal_path(), ec).lexically_normal();
    return sd_bus_message_append(m, "s", ec ? mgr.journal_path().c_str() : absolute.c_str());
}
int permissive(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "b", mgr.policy().settings.permissive);
}
int journal_available(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "b", mgr.audit().open() && mgr.audit().pending() == 0);
}
int pending_journal_records(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", static_cast<std::uint64_t>(mgr.audit().pending()));
}
int journal_problem(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "s", mgr.audit().journal_problem().c_str());
}
int journal_write_failures(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", mgr.audit().journal_stats().commit_failures);
}
int anchor_write_failures(sd_bus_message *m, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", mgr.audit().journal_stats().anchor_failures);
}
int resource_failures(sd_bus_message *m, const BindingManager &) {
    return sd_bus_message_append(m, "t", daemon::ResourceFailures::instance().count());
}
int last_resource_failure(sd_bus_message *m, const BindingManager &) {
    return sd_bus_message_append(m, "s", daemon::ResourceFailures::instance().last().c_str());
}
int sink_dropped_records(sd_bus_message *m, const BindingManager &mgr) {
    const sinks::SinkQueue *q = mgr.audit().sinks();
    return sd_bus_message_append(m, "t", q ? q->dropped() : std::uint64_t{0});
}
int sink_failed_records(sd_bus_message *m, const BindingManager &mgr) {
    std::uint64_t failed = 0;
    if (const sinks::SinkQueue *q = mgr.audit().sinks())
        for (auto &k : q->stats())
            failed += k.failed;
    return sd_bus_message_append(m, "t", failed);
}

int id(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.id.c_str());
}
int netdev(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.netdev.c_str());
}
int gpu(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.gpu.c_str());
}
int mode(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", policy::to_string(b.mode));
}
int owner_uid(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "u", b.owner.uid);
}
int owner_pid(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "u", static_cast<std::uint32_t>(b.owner.pid));
}
int region_size(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "t", b.region_id.length);
}
int flows(sd_bus_message *m, const Binding &b, const BindingManager &) {
    int r = sd_bus_message_open_container(m, 'a', "s");
    for (auto &f : b.flows)
        if (r >= 0) r = sd_bus_message_append(m, "s", f.to_string().c_str());
    return r < 0 ? r : sd_bus_message_close_container(m);
}
int queues(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append_array(m, 'u', b.queues.data(),
                                       b.queues.size() * sizeof(std::uint32_t));
}
int key_id(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.key_id.c_str());
}
int owner_unit(sd_bus_message *m, const Binding &b, const BindingManager &) {
    // Read off the holder's cgroup (names a user can choose in its own subtree): escaped.
    // The user manager's unit is the narrower (the system unit is then user@UID.service).
    const std::string &unit = b.owner.user_unit.empty() ? b.owner.unit : b.owner.user_unit;
    return sd_bus_message_append(m, "s", escape_untrusted(unit, Escape::value, 256).c_str());
}
int pod(sd_bus_message *m, const Binding &b, const BindingManager &) {
    // The holder's pod as knod-cni registered it (strings the registry checked); {} for none.
    int r = sd_bus_message_open_container(m, 'a', "{ss}");
    if (b.owner.pod)
        for (auto [k, v] :
             {std::pair{"namespace", &b.owner.pod->k8s_namespace},
              std::pair{"name", &b.owner.pod->name}, std::pair{"uid", &b.owner.pod->uid}})
            if (r >= 0) r = sd_bus_message_append(m, "{ss}", k, v->c_str());
    return r < 0 ? r : sd_bus_message_close_container(m);
}
int rule(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.rule.c_str());
}
int created(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "t", static_cast<std::uint64_t>(b.created_us));
}
int expires(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "t", static_cast<std::uint64_t>(b.expires_us));
}
int state(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", daemon::to_string(b.state));
}
int rx_bytes(sd_bus_message *m, const Binding &b, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", mgr.counters(b.id).rx_bytes);
}
int rx_packets(sd_bus_message *m, const Binding &b, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", mgr.counters(b.id).rx_packets);
}
int dropped_packets(sd_bus_message *m, const Binding &b, const BindingManager &mgr) {
    return sd_bus_message_append(m, "t", mgr.counters(b.id).dropped_packets);
}
// The job tag its holder set (SetJob): strings check_job_tag accepted, "" and 0 untagged.
int job(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.job ? b.job->job.c_str() : "");
}
int job_group(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "s", b.job ? b.job->group.c_str() : "");
}
int job_rank(sd_bus_message *m, const Binding &b, const BindingManager &) {
    return sd_bus_message_append(m, "u", b.job ? b.job->rank : 0u);
}
// The kernel's id of the binding's dma-buf (bind-rx's answer, the dmabuf_id of every devmem
// fragment of it), 0 for none: not a devmem binding, or not active yet.
int dmabuf_id(sd_bus_message *m, const Binding &b, const BindingManager &mgr) {
    return sd_bus_message_append(m, "u", mgr.driver().dmabuf_id(b.id).value_or(0u));
}

} // namespace get

} // namespace

template <BusService::ManagerGet get>
int BusService::manager_property(sd_bus *, const char *, const char *, const char *,
                                 sd_bus_message *reply, void *self, sd_bus_error *err) {
    return guarded("manager property", err,
                   [&]() -> int { return get(reply, *service(self)->manager_); });
}

template <BusService::BindingGet get>
int BusService::binding_property(sd_bus *bus, const char *path, const char *, const char *,
                                 sd_bus_message *reply, void *self, sd_bus_error *err) {
    return guarded("binding property", err, [&]() -> int {
        auto *s = service(self);
        const daemon::Binding *b = s->emitting_ ? s->emitting_ : s->binding_at(bus, path);
        if (!b) return fail(err, make_error(Errc::not_found, "no such binding"));
        return get(reply, *b, *s->manager_);
    });
}

namespace {

// Every method below is callable by any local user at the sd-bus level
// (SD_BUS_VTABLE_UNPRIVILEGED); each says how it checks its caller. Members without the flag
// would be root-only, and that is the default for anything added later.
const sd_bus_vtable manager_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_PROPERTY("Version", "s", BusService::manager_property<get::version>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Driver", "s", BusService::manager_property<get::driver>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("BindingCount", "u", BusService::manager_property<get::binding_count>, 0, 0),
    SD_BUS_PROPERTY("Rules", "u", BusService::manager_property<get::rules>, 0, 0),
    SD_BUS_PROPERTY("Permissive", "b", BusService::manager_property<get::permissive>, 0, 0),
    // The digest of the policy in force, as every decision in the journal names it (a hash
    // of its text: says which policy, not what it says). Re-read on PolicyReloaded.
    SD_BUS_PROPERTY("PolicyDigest", "s", BusService::manager_property<get::policy_digest>, 0, 0),
    // Where the live journal is (absolute): for `knod-policy audit --db` (it reads the
    // published snapshot beside it when the live file is the daemon's alone).
    SD_BUS_PROPERTY("JournalPath", "s", BusService::manager_property<get::journal_path>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("JournalAvailable", "b", BusService::manager_property<get::journal_available>,
                    0, 0),
    SD_BUS_PROPERTY("PendingJournalRecords", "t",
                    BusService::manager_property<get::pending_journal_records>, 0, 0),
    SD_BUS_PROPERTY("JournalProblem", "s", BusService::manager_property<get::journal_problem>, 0,
                    0),
    SD_BUS_PROPERTY("JournalWriteFailures", "t",
                    BusService::manager_property<get::journal_write_failures>, 0, 0),
    SD_BUS_PROPERTY("AnchorWriteFailures", "t",
                    BusService::manager_property<get::anchor_write_failures>, 0, 0),
    SD_BUS_PROPERTY("ResourceFailures", "t", BusService::manager_property<get::resource_failures>,
                    0, 0),
    SD_BUS_PROPERTY("LastResourceFailure", "s",
                    BusService::manager_property<get::last_resource_failure>, 0, 0),
    SD_BUS_PROPERTY("SinkDroppedRecords", "t",
                    BusService::manager_property<get::sink_dropped_records>, 0, 0),
    SD_BUS_PROPERTY("SinkFailedRecords", "t",
                    BusService::manager_property<get::sink_failed_records>, 0, 0),
    // Anyone: the policy decides, as the caller's own uid.
    SD_BUS_METHOD_WITH_NAMES("RequestBinding", "ssshttas",
                             SD_BUS_PARAM(netdev) SD_BUS_PARAM(gpu) SD_BUS_PARAM(mode)
                                 SD_BUS_PARAM(region) SD_BUS_PARAM(offset) SD_BUS_PARAM(length)
                                     SD_BUS_PARAM(flows),
                             "osay", SD_BUS_PARAM(binding) SD_BUS_PARAM(key_id) SD_BUS_PARAM(key),
                             BusService::request_binding, SD_BUS_VTABLE_UNPRIVILEGED),
    // Anyone: callers see their own bindings; auditors and admins see all.
    SD_BUS_METHOD_WITH_NAMES("ListBindings", "", "", "a(osssssuut)", SD_BUS_PARAM(bindings),
                             BusService::list_bindings, SD_BUS_VTABLE_UNPRIVILEGED),
    // Admins only: checked in the handler (root, admin group, or polkit).
    SD_BUS_METHOD_WITH_NAMES("RevokeBinding", "ss", SD_BUS_PARAM(id) SD_BUS_PARAM(reason), "", "",
                             BusService::revoke_binding, SD_BUS_VTABLE_UNPRIVILEGED),
    // Admins only: checked in the handler.
    SD_BUS_METHOD_WITH_NAMES("ReloadPolicy", "", "", "uu",
                             SD_BUS_PARAM(rules) SD_BUS_PARAM(revoked), BusService::reload_policy,
                             SD_BUS_VTABLE_UNPRIVILEGED),
    // Anyone: whether RevokeBinding and ReloadPolicy would be allowed to the caller now (the
    // same check, polkit asked without interaction), and why not. Changes nothing.
    SD_BUS_METHOD_WITH_NAMES("CanManage", "", "", "bs", SD_BUS_PARAM(allowed) SD_BUS_PARAM(reason),
                             BusService::can_manage, SD_BUS_VTABLE_UNPRIVILEGED),
    // The node's CNI plugin (knod-cni), as the host's root only (checked in the handler; the
    // bus policy lets no one else send them): a pod sandbox's network namespace (an fd) and
    // identity; its deletion, which ends its processes' bindings; and CNI GC, the same for
    // every sandbox a network registered that the runtime no longer lists.
    SD_BUS_METHOD_WITH_NAMES("RegisterPod", "ssha{ss}a{ss}",
                             SD_BUS_PARAM(container_id) SD_BUS_PARAM(ifname) SD_BUS_PARAM(netns)
                                 SD_BUS_PARAM(pod) SD_BUS_PARAM(annotations),
                             "", "", BusService::register_pod, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD_WITH_NAMES("UnregisterPod", "ss", SD_BUS_PARAM(container_id) SD_BUS_PARAM(ifname),
                             "u", SD_BUS_PARAM(ended), BusService::unregister_pod,
                             SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD_WITH_NAMES("CollectPods", "sa(ss)", SD_BUS_PARAM(network) SD_BUS_PARAM(valid),
                             "uu", SD_BUS_PARAM(collected) SD_BUS_PARAM(ended),
                             BusService::collect_pods, SD_BUS_VTABLE_UNPRIVILEGED),
    // Anyone: the host's inventory is not secret from its own users.
    SD_BUS_METHOD_WITH_NAMES("GetHostReport", "", "", "s", SD_BUS_PARAM(report_json),
                             BusService::host_report, SD_BUS_VTABLE_UNPRIVILEGED),
    // Auditors and admins: the figures sum every user's bindings (checked in the handler).
    SD_BUS_METHOD_WITH_NAMES("GetMetrics", "", "", "s", SD_BUS_PARAM(metrics_json),
                             BusService::metrics, SD_BUS_VTABLE_UNPRIVILEGED),
    // Anyone: binding signals are unicast; this asks for those about the bindings the caller
    // may list (its own uid's; all for auditors and admins) until its connection closes.
    SD_BUS_METHOD("Subscribe", "", "", BusService::subscribe, SD_BUS_VTABLE_UNPRIVILEGED),
    // Anyone: one end of a socketpair the caller just made proves that the process at the bus's
    // pid is the one that connected (daemon/process_attestation.h); once per connection.
    SD_BUS_METHOD_WITH_NAMES("AttestProcess", "h", SD_BUS_PARAM(socket), "s", SD_BUS_PARAM(proof),
                             BusService::attest_process, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_SIGNAL_WITH_NAMES("BindingCreated", "os", SD_BUS_PARAM(binding) SD_BUS_PARAM(id), 0),
    SD_BUS_SIGNAL_WITH_NAMES("BindingReleased", "oss",
                             SD_BUS_PARAM(binding) SD_BUS_PARAM(id) SD_BUS_PARAM(reason), 0),
    SD_BUS_SIGNAL_WITH_NAMES("BindingRevoked", "oss",
                             SD_BUS_PARAM(binding) SD_BUS_PARAM(id) SD_BUS_PARAM(reason), 0),
    SD_BUS_SIGNAL_WITH_NAMES("PolicyReloaded", "uu", SD_BUS_PARAM(rules) SD_BUS_PARAM(revoked), 0),
    SD_BUS_VTABLE_END};

const sd_bus_vtable binding_vtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_PROPERTY("Id", "s", BusService::binding_property<get::id>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Netdev", "s", BusService::binding_property<get::netdev>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Gpu", "s", BusService::binding_property<get::gpu>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Mode", "s", BusService::binding_property<get::mode>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("OwnerUid", "u", BusService::binding_property<get::owner_uid>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("OwnerPid", "u", BusService::binding_property<get::owner_pid>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    // The holder's systemd unit (the user manager's if any, else the system manager's), "".
    SD_BUS_PROPERTY("OwnerUnit", "s", BusService::binding_property<get::owner_unit>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    // The holder's Kubernetes pod (namespace, name, uid), {} outside any (docs/kubernetes.md).
    SD_BUS_PROPERTY("Pod", "a{ss}", BusService::binding_property<get::pod>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("RegionSize", "t", BusService::binding_property<get::region_size>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Flows", "as", BusService::binding_property<get::flows>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Queues", "au", BusService::binding_property<get::queues>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("KeyId", "s", BusService::binding_property<get::key_id>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Rule", "s", BusService::binding_property<get::rule>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    SD_BUS_PROPERTY("Created", "t", BusService::binding_property<get::created>, 0,
                    SD_BUS_VTABLE_PROPERTY_CONST),
    // Moves when the holder renews.
    SD_BUS_PROPERTY("Expires", "t", BusService::binding_property<get::expires>, 0, 0),
    SD_BUS_PROPERTY("State", "s", BusService::binding_property<get::state>, 0,
                    SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
    SD_BUS_PROPERTY("RxBytes", "t", BusService::binding_property<get::rx_bytes>, 0, 0),
    SD_BUS_PROPERTY("RxPackets", "t", BusService::binding_property<get::rx_packets>, 0, 0),
    SD_BUS_PROPERTY("DroppedPackets", "t", BusService::binding_property<get::dropped_packets>, 0,
                    0),
    // The job its holder says it serves (SetJob): a claim, never decided on; "", "", 0 untagged.
    SD_BUS_PROPERTY("Job", "s", BusService::binding_property<get::job>, 0, 0),
    SD_BUS_PROPERTY("JobGroup", "s", BusService::binding_property<get::job_group>, 0, 0),
    SD_BUS_PROPERTY("JobRank", "u", BusService::binding_property<get::job_rank>, 0, 0),
    // The kernel's id of its dma-buf (devmem, once active), for the holder to check every
    // fragment against; 0 none. Set at activation, so not const.
    SD_BUS_PROPERTY("DmabufId", "u", BusService::binding_property<get::dmabuf_id>, 0, 0),
    // Anyone who can see the object; the key is checked against the caller's own process.
    // The holder only (the key is checked against the caller's own process): extends the key.
    SD_BUS_METHOD_WITH_NAMES("Renew", "ay", SD_BUS_PARAM(key), "t", SD_BUS_PARAM(expires_us),
                             BusService::renew, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD_WITH_NAMES("RxNotifier", "ay", SD_BUS_PARAM(key), "ht",
                             SD_BUS_PARAM(notifier) SD_BUS_PARAM(rx_bytes), BusService::rx_notifier,
                             SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD_WITH_NAMES("Activate", "ay", SD_BUS_PARAM(key), "", "", BusService::activate,
                             SD_BUS_VTABLE_UNPRIVILEGED),
    // The holder only (its key, as Activate): tags the binding with its job, once.
    SD_BUS_METHOD_WITH_NAMES("SetJob", "ayssu",
                             SD_BUS_PARAM(key) SD_BUS_PARAM(job) SD_BUS_PARAM(group)
                                 SD_BUS_PARAM(rank),
                             "", "", BusService::set_job, SD_BUS_VTABLE_UNPRIVILEGED),
    // The owner, or an admin: checked in the handler.
    SD_BUS_METHOD("Release", "", "", BusService::release, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_VTABLE_END};

// What an object at a binding's path implements, as sd-bus lists it in GetManagedObjects.
constexpr const char *standard_interfaces[] = {"org.freedesktop.DBus.Peer",
                                               "org.freedesktop.DBus.Introspectable",
                                               "org.freedesktop.DBus.Properties"};

std::string id_of(const char *path) {
    std::string p = path ? path : "";
    std::string prefix = std::string(bindings_prefix) + "/";
    return p.rfind(prefix, 0) == 0 ? p.substr(prefix.size()) : std::string();
}

} // namespace

std::string binding_path(const std::string &id) {
    return std::string(bindings_prefix) + "/" + id;
}

BusService::BusService(sd_bus *bus, CallerLimits limits)
    : bus_(bus), authorizer_(bus, limits.polkit_per_uid, limits.polkit), limits_(limits) {}

BusService::~BusService() = default;

Result<std::vector<SlotPtr>> BusService::add_objects(sd_bus *bus) {
    std::vector<SlotPtr> slots;
    sd_bus_slot *slot = nullptr;
    auto add = [&](int r, const char *what) -> Result<void> {
        if (r < 0) return make_error(Errc::io, std::string(what) + ": " + std::strerror(-r));
        slots.emplace_back(slot);
        slot = nullptr;
        return {};
    };
    Result<void> r;
    if (!(r = add(sd_bus_add_object_vtable(bus, &slot, manager_path, manager_interface,
                                           manager_vtable, this),
                  "manager vtable")))
        return r.error();
    if (!(r = add(sd_bus_add_fallback_vtable(bus, &slot, bindings_prefix, binding_interface,
                                             binding_vtable, find_binding, this),
                  "binding vtable")))
        return r.error();
    if (!(r = add(sd_bus_add_node_enumerator(bus, &slot, bindings_prefix, enumerate_bindings, this),
                  "node enumerator")))
        return r.error();
    if (!(r = add(sd_bus_add_object_manager(bus, &slot, manager_path), "object manager")))
        return r.error();
    return slots;
}

Result<void> BusService::start(daemon::BindingManager &manager, const std::string &pod_spool) {
    manager_ = &manager;
    admission_ = std::make_unique<daemon::PodAdmission>(manager, pod_spool);
    auto objects = add_objects(bus_);
    if (!objects) return objects.error();
    for (auto &o : *objects)
        slots_.push_back(std::move(o));
    // One match rule for every connection that leaves, waited for here (a failure stops the
    // start, and no call is served before the bus applies it). Nothing later adds a match:
    // sd-bus closes the connection when an AddMatch it sent without an install callback fails.
    sd_bus_slot *slot = nullptr;
    if (int r = sd_bus_match_signal(bus_, &slot, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                    "org.freedesktop.DBus", "NameOwnerChanged", name_owner_changed,
                                    this);
        r < 0)
        return make_error(Errc::io, std::string("NameOwnerChanged match: ") + std::strerror(-r));
    slots_.emplace_back(slot);
    // main() takes the name before it touches the network; EALREADY means it did.
    int rc = sd_bus_request_name(bus_, service_name, 0);
    if (rc < 0 && rc != -EALREADY)
        return make_error(Errc::denied, std::string("cannot own ") + service_name + ": " +
                                            std::strerror(-rc) +
                                            " (is another knod-policyd running, and does the bus "
                                            "policy let this user own the name?)");
    return {};
}

namespace {

Error daemon_side(int err, const std::string &what) {
    return system_error(Errc::io, err, what);
}

// What the bus vouches for about a connection: GetConnectionCredentials, read here rather than
// through sd_bus_query_sender_creds because Debian 12's sd-bus (252) does not know ProcessFD
// (SD_BUS_CREDS_PIDFD is systemd v256). One synchronous round trip per connection, as sd-bus's
// own query was. Keys this build does not use are skipped.
Result<Credentials> ask_bus(sd_bus *bus, const char *sender) {
    MessagePtr reply;
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *raw = nullptr;
    int r = sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                               "org.freedesktop.DBus", "GetConnectionCredentials", &e, &raw, "s",
                               sender);
    sd_bus_error_free(&e);
    reply.reset(raw);
    if (r < 0) return make_error(Errc::denied, "the bus did not vouch for the caller");
    Credentials c;
    bool have_uid = false, have_pid = false;
    int pidfd = -1, dup_errno = 0;
    bool sent_pidfd = false;
    std::uint32_t u = 0;
    if (sd_bus_message_enter_container(raw, 'a', "{sv}") < 0)
        return make_error(Errc::denied, "the bus's credentials are unreadable");
    while ((r = sd_bus_message_enter_container(raw, 'e', "sv")) > 0) {
        const char *key = nullptr;
        if ((r = sd_bus_message_read(raw, "s", &key)) < 0) break;
        std::string_view k(key);
        if (k == "UnixUserID" && sd_bus_message_read(raw, "v", "u", &u) >= 0) {
            c.uid = u;
            have_uid = true;
        } else if (k == "ProcessID" && sd_bus_message_read(raw, "v", "u", &u) >= 0) {
            c.pid = static_cast<pid_t>(u);
            have_pid = u > 0 && u <= static_cast<std::uint32_t>(INT32_MAX);
        } else if (k == "ProcessFD" && sd_bus_message_read(raw, "v", "h", &pidfd) >= 0) {
            // The message owns it; ours is a copy.
            if (sent_pidfd) { // a second one: not a bus we understand
                r = -EBADMSG;
                break;
            }
            sent_pidfd = true;
            pidfd = ::fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
            if (pidfd < 0) dup_errno = errno;
        } else if (k == "UnixGroupIDs" && sd_bus_message_enter_container(raw, 'v', "au") > 0) {
            const void *gids = nullptr;
            std::size_t size = 0;
            if (sd_bus_message_read_array(raw, 'u', &gids, &size) >= 0)
                c.bus_gids =
                    std::vector<gid_t>(static_cast<const gid_t *>(gids),
                                       static_cast<const gid_t *>(gids) + size / sizeof(gid_t));
            sd_bus_message_exit_container(raw);
        } else if ((r = sd_bus_message_skip(raw, "v")) < 0) {
            break;
        }
        if ((r = sd_bus_message_exit_container(raw)) < 0) break;
    }
    UniqueFd process(pidfd);
    // Half a dict is no answer: a missing UnixGroupIDs would silently change whose groups count.
    if (r < 0) return make_error(Errc::denied, "the bus's credentials are unreadable");
    if (!have_uid) return make_error(Errc::denied, "the bus did not give the caller's uid");
    if (!have_pid) c.pid = 0;
    if (sent_pidfd && !process.valid())
        return daemon_side(dup_errno, "cannot keep the bus's pidfd of the caller");
    // The bus's pidfd proves the process only while that process still holds the bus's pid.
    // Otherwise the bus has said that the process that connected is gone: nothing the
    // connection presents later (AttestProcess) may stand in for it.
    if (process.valid() && have_pid) {
        auto at = daemon::pidfd_pid(process.get());
        if (!at && at.error().code == Errc::out_of_resources) return at.error();
        if (at && *at == c.pid && daemon::still_running(process.get()))
            c.process = {std::make_shared<UniqueFd>(std::move(process)),
                         daemon::ProcessProof::bus_pidfd, c.pid};
        else
            c.connector_gone = true;
    }
    c.sender = sender;
    return c;
}

} // namespace

namespace {

// What a call's credentials keep of the process the daemon identified behind them.
void take_identity(Credentials &c, daemon::Peer p) {
    c.gids = std::move(p.gids);
    c.host_root = p.host_root();
    c.root_in_host = p.root_in_host();
    c.contained = p.contained();
    c.domain = p.domain();
    c.principal = p.principal();
    c.start_time = p.start_time;
    c.executable = std::move(p.executable);
    c.cgroup = std::move(p.cgroup);
    c.pod = std::move(p.pod);
    c.pod_sandbox = std::move(p.pod_sandbox);
    c.netns = p.netns;
}

// The caller of a refused call as the journal names it, from what its credentials say. Never
// root's exemptions (journaled one by one, unthrottled) unless its identification gave them:
// a container's root, or a caller not identified yet, is uid 0 too (the attack review of #51:
// a root pod's bad AttestProcess calls were journaled one by one as the host's root).
daemon::Peer refused_caller(const Credentials &c) {
    daemon::Peer who;
    who.uid = c.uid;
    who.pid = c.pid;
    who.bus_name = c.sender;
    who.host_namespaces = c.root_in_host || (c.uid != 0 && !c.contained);
    who.pod = c.pod;
    who.pod_sandbox = c.pod_sandbox;
    return who;
}

} // namespace

Result<void> BusService::maker_gone(const Credentials &c) const {
    // Proven: the pidfd says whether the very process still runs. Known by its pid only: a
    // process started at another time holds that pid now (the maker exited, its pid was
    // recycled). Identity read on the first call stays with the connection; a connection whose
    // first call came after the pid changed hands is why pod rules need a proven process.
    if (c.process.pidfd) {
        if (daemon::still_running(c.process.pidfd->get())) return {};
        return refuse_maker_gone(c, "its pidfd says it exited");
    }
    if (c.start_time == 0) return {}; // never identified: owns nothing, matches nothing
    auto now = daemon::process_start_time(c.pid);
    if (now && *now == c.start_time) return {};
    if (!now && now.error().code == Errc::out_of_resources) return now.error();
    return refuse_maker_gone(c, now ? "another process holds its pid now" : "its pid is gone");
}

Error BusService::refuse_maker_gone(const Credentials &c, const char *how) const {
    auto denied = make_error(
        Errc::denied, std::string("the process that made this connection has exited (") + how +
                          "); a connection speaks only for its maker: connect again "
                          "from the calling process");
    daemon::Peer who = refused_caller(c);
    manager_->refuse_action(journal::kind::attest_refused, who, "connector-gone", denied.message);
    return denied;
}

Result<Credentials> BusService::credentials(sd_bus_message *m) const {
    if (sd_bus *on = sd_bus_message_get_bus(m); on != bus_) return pod_credentials(on);
    const char *sender_name = sd_bus_message_get_sender(m);
    if (!sender_name || sender_name[0] != ':')
        return make_error(Errc::denied, "the bus did not name the caller's connection");
    auto hit = connections_.find(sender_name);
    if (hit != connections_.end() && hit->second.creds) {
        if (auto gone = maker_gone(*hit->second.creds); !gone) return gone.error();
        return *hit->second.creds;
    }
    auto asked = ask_bus(bus_, sender_name);
    if (!asked) return asked.error();
    Credentials c = std::move(*asked);
    // A connection speaks only for the process that made it (issue #51): once the bus says
    // that process exited, nothing said on it is anyone's.
    if (c.connector_gone) return refuse_maker_gone(c, "the bus says so: ProcessFD");
    // The groups for visibility and admin checks: the process's, read once per connection (as
    // the bus's own are a snapshot taken when it connected). Grants read them afresh (peer()).
    // A process that cannot be identified holds no group for us (and is not remembered).
    auto process = daemon::identify_peer(c.uid, c.pid, c.bus_gids, c.sender, c.process);
    if (!process) return c;
    place(*process);
    take_identity(c, std::move(*process));
    // Remembered only once there is room for it: a refused caller leaves nothing behind.
    const char *method = sd_bus_message_get_member(m);
    auto entry = remember(c.sender, c.principal, c.pid, method ? method : "call", c.root_in_host);
    if (!entry) return entry.error();
    (*entry)->creds = c;
    return c;
}

Result<Credentials> BusService::pod_credentials(sd_bus *conn) const {
    auto pod = pod_connections_.find(conn);
    auto hit =
        pod == pod_connections_.end() ? connections_.end() : connections_.find(pod->second.name);
    if (hit == connections_.end() || !hit->second.creds)
        return make_error(Errc::denied, "the caller's connection is not one the daemon serves");
    const Credentials &c = *hit->second.creds;
    if (auto gone = maker_gone(c); !gone) return gone.error();
    // Its pod must still be registered, by the same sandbox: after a DEL nothing said on the
    // connection is that pod's, and no other pod may inherit it.
    const daemon::PodSandbox *sb = manager_->pods().by_netns(pod->second.netns);
    if (!sb || sb->container_id != c.pod_sandbox) {
        auto denied = make_error(Errc::denied, "the pod this connection was made in is no longer "
                                               "registered (deleted); the pod socket serves "
                                               "registered pods only");
        daemon::Peer who = refused_caller(c);
        manager_->refuse_action(journal::kind::pod_refused, who, "not-a-pod", denied.message);
        return denied;
    }
    return c;
}

Result<Credentials> BusService::admit_pod_caller(uid_t uid, pid_t pid,
                                                 std::shared_ptr<UniqueFd> pidfd,
                                                 const std::string &name) const {
    // SO_PEERPIDFD is the kernel's pidfd of the process that connected: as good a proof as a
    // bus's ProcessFD. Without it (Linux < 6.5) the caller is known by its pid only, and its
    // pod's rules do not grant it (daemon/peer.h).
    daemon::ProvenProcess proven;
    if (pidfd && pidfd->valid()) proven = {std::move(pidfd), daemon::ProcessProof::bus_pidfd, pid};
    daemon::Peer who;
    who.uid = uid;
    who.pid = pid;
    who.bus_name = name;
    who.host_namespaces = false; // not identified yet: no root's exemptions
    auto refuse = [&](const char *decision, const std::string &why) {
        manager_->refuse_action(journal::kind::pod_refused, who, decision, why);
        return make_error(Errc::denied, why);
    };
    auto p = daemon::identify_peer(uid, pid, std::nullopt, name, proven);
    if (!p)
        return p.error().code == Errc::out_of_resources ? p.error()
                                                        : refuse("not-proven", p.error().message);
    place(*p);
    who = *p;
    if (p->pod_sandbox.empty())
        return refuse("not-a-pod",
                      "the pod socket serves the processes of registered pods only, and this "
                      "caller's network namespace is no registered pod sandbox's; host processes "
                      "use the system bus");
    Credentials c;
    c.uid = uid;
    c.pid = pid;
    c.sender = name;
    c.process = proven;
    c.pod_socket = true;
    take_identity(c, std::move(*p));
    return c;
}

Result<std::vector<SlotPtr>> BusService::serve_pod_connection(sd_bus *conn,
                                                              const Credentials &caller) {
    auto entry = remember(caller.sender, caller.principal, caller.pid, "connect", false);
    if (!entry) return entry.error();
    (*entry)->creds = caller;
    auto objects = add_objects(conn);
    if (!objects) {
        forget(caller.sender);
        return objects.error();
    }
    pod_connections_[conn] = {caller.sender, caller.netns};
    pod_buses_[caller.sender] = conn;
    return objects;
}

void BusService::pod_connection_closed(const std::string &name) {
    if (auto b = pod_buses_.find(name); b != pod_buses_.end()) {
        pod_connections_.erase(b->second);
        pod_buses_.erase(b);
    }
    forget(name);
    manager_->connection_gone(name);
}

void BusService::pod_connection_detached(const std::string &name) {
    if (auto b = pod_buses_.find(name); b != pod_buses_.end()) {
        pod_connections_.erase(b->second);
        pod_buses_.erase(b);
    }
}

Error BusService::refuse_pod_limit(const Credentials &c, const std::string &what) const {
    return manager_->refuse_limit(c.uid, c.pid, false, "connect", what);
}

Result<void> BusService::host_only(const Credentials &c, const char *method,
                                   const char *kind) const {
    if (!c.pod_socket) return {};
    auto denied = make_error(Errc::denied, std::string(method) +
                                               " is not served on the pod socket: a pod reaches "
                                               "its own bindings only (the node's administrators "
                                               "and its CNI plugin use the system bus)");
    if (kind) {
        daemon::Peer by = refused_caller(c);
        manager_->refuse_action(kind, by, "not-authorized", denied.message);
    }
    return denied;
}

namespace {
constexpr std::string_view pod_name_prefix = "pod-socket:";
}

std::string pod_connection_name(std::uint64_t serial) {
    // The daemon's start (its pid and the time) makes names unique across restarts.
    static const std::string run = [] {
        timespec t{};
        ::clock_gettime(CLOCK_REALTIME, &t);
        return std::to_string(::getpid()) + "." + std::to_string(t.tv_sec) + "." +
               std::to_string(t.tv_nsec);
    }();
    return std::string(pod_name_prefix) + run + "." + std::to_string(serial);
}

bool is_pod_connection_name(const std::string &name) {
    return name.starts_with(pod_name_prefix);
}

int BusService::refuse_limit(sd_bus_message *m, const Credentials &c, const Error &why,
                             sd_bus_error *err) const {
    const char *method = sd_bus_message_get_member(m);
    return fail(err, manager_->refuse_limit(c.uid, c.pid, c.root_in_host, method ? method : "call",
                                            why.message));
}

Result<BusService::Connection *> BusService::remember(const std::string &name,
                                                      const daemon::PrincipalKey &who, pid_t pid,
                                                      const char *method, bool exempt) const {
    if (name.empty() || (name[0] != ':' && !is_pod_connection_name(name)))
        return make_error(Errc::denied, "the bus did not name the caller's connection");
    if (auto it = connections_.find(name); it != connections_.end()) return &it->second;
    if (!exempt && method) {
        std::size_t &mine = connections_of_[who];
        std::string what;
        if (mine >= limits_.connections_per_uid)
            what = "at most " + std::to_string(limits_.connections_per_uid) +
                   " connections per user are remembered (credentials, subscription, bindings); "
                   "close connections you no longer use";
        else if (unprivileged_connections_ >= limits_.connections)
            what = "at most " + std::to_string(limits_.connections) +
                   " connections are remembered in all; retry later";
        if (mine == 0) connections_of_.erase(who);
        if (!what.empty()) return manager_->refuse_limit(who.uid, pid, false, method, what);
    }
    auto [it, added] = connections_.emplace(name, Connection{});
    it->second.principal = who;
    it->second.exempt = exempt;
    connections_of_[who] += 1;
    if (!exempt) unprivileged_connections_ += 1;
    return &it->second;
}

void BusService::forget(const std::string &name) {
    auto it = connections_.find(name);
    if (it == connections_.end()) return;
    const daemon::PrincipalKey &who = it->second.principal;
    if (auto n = connections_of_.find(who); n != connections_of_.end() && --n->second == 0)
        connections_of_.erase(n);
    if (!it->second.exempt) unprivileged_connections_ -= 1;
    if (subscribers_.erase(name)) {
        if (auto n = subscriptions_of_.find(who); n != subscriptions_of_.end() && --n->second == 0)
            subscriptions_of_.erase(n);
        if (!it->second.exempt_subscription) unprivileged_subscriptions_ -= 1;
    }
    connections_.erase(it);
}

void BusService::journal_refused_request(sd_bus_message *m, const daemon::RequestArgs &args,
                                         const Error &why) const {
    // The caller as far as it can be named: the process, or only what the bus said of it (its
    // process is gone), or nothing at all (uid unknown: (uid_t)-1, as the kernel's overflow uid).
    if (why.code == Errc::limits_exceeded) return; // journaled (coalesced) where it was refused
    daemon::Peer who;
    who.uid = static_cast<uid_t>(-1);
    who.host_namespaces = false; // until identified: no root's exemptions
    if (auto c = credentials(m)) {
        who.uid = c->uid;
        who.pid = c->pid;
        who.bus_name = c->sender;
        if (auto p = daemon::identify_peer(c->uid, c->pid, c->bus_gids, c->sender, c->process)) {
            who = *p;
            place(who);
        }
    }
    manager_->refuse_request(who, args, why);
}

Result<daemon::Peer> BusService::peer(sd_bus_message *m) const {
    auto c = credentials(m);
    if (!c) return c.error();
    auto p = daemon::identify_peer(c->uid, c->pid, c->bus_gids, c->sender, c->process);
    if (p) place(*p);
    // A pod socket's caller is the pod it was admitted from, or no one (never the host's).
    if (p && c->pod_socket && p->pod_sandbox != c->pod_sandbox)
        return make_error(Errc::denied, "the caller has left the pod it connected from; the pod "
                                        "socket serves a pod's own processes only");
    return p;
}

void BusService::place(daemon::Peer &p) const {
    p.pod.reset();
    p.pod_sandbox.clear();
    if (const daemon::PodSandbox *sb = manager_->pods().by_netns(p.netns)) {
        // A pod's identity only for a proven process: an unproven pid may since name a
        // process of this pod that is not the caller (issue #51: a recycled pid lent a pod's
        // identity). Its bounds are the pod's either way.
        p.pod_sandbox = sb->container_id;
        if (p.process_proof != daemon::ProcessProof::pid_only) p.pod = sb->pod;
    }
}

Result<void> BusService::throttle(sd_bus_message *m, const char *method) const {
    auto c = credentials(m);
    if (!c) return c.error();
    return manager_->throttle(c->principal, c->pid, c->root_in_host, method);
}

bool BusService::visible(sd_bus *on, const daemon::Binding &b) const {
    // The call being handled on the connection it came in on (the bus, or a pod connection).
    sd_bus_message *m = sd_bus_get_current_message(on);
    if (!m) return true; // our own emissions (InterfacesAdded)
    auto c = credentials(m);
    if (!c) return false;
    return owns(*c, b) || authorizer_.is_auditor(*c, manager_->policy().settings);
}

const daemon::Binding *BusService::binding_at(sd_bus *on, const char *path) const {
    const daemon::Binding *b = manager_->find(id_of(path));
    return b && visible(on, *b) ? b : nullptr;
}

int BusService::find_binding(sd_bus *bus, const char *path, const char *, void *self, void **found,
                             sd_bus_error *) {
    return guarded("find binding", nullptr, [&]() -> int {
        auto *s = service(self);
        // A pod-socket holder back after a restart takes its binding by asking about it.
        if (!s->awaiting_.empty() || !s->untold_.empty()) s->take_back_on_touch(bus, id_of(path));
        if (!s->binding_at(bus, path)) return 0; // others' bindings do not exist for you
        *found = self;
        return 1;
    });
}

int BusService::enumerate_bindings(sd_bus *bus, const char *, void *self, char ***nodes,
                                   sd_bus_error *) {
    return guarded("enumerate bindings", nullptr, [&]() -> int {
        auto *s = service(self);
        std::vector<std::string> paths;
        for (auto *b : s->manager_->bindings())
            if (s->visible(bus, *b)) paths.push_back(binding_path(b->id));
        char **out = static_cast<char **>(calloc(paths.size() + 1, sizeof(char *)));
        if (!out) return -ENOMEM;
        for (std::size_t i = 0; i < paths.size(); ++i)
            out[i] = strdup(paths[i].c_str());
        *nodes = out;
        return 0;
    });
}

int BusService::request_binding(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("RequestBinding", err, [&]() -> int {
        auto *s = service(self);
        daemon::RequestArgs a;
        const char *netdev = nullptr, *gpu = nullptr, *mode = nullptr;
        int r = sd_bus_message_read(m, "ssshtt", &netdev, &gpu, &mode, &a.region_fd, &a.offset,
                                    &a.length);
        if (r < 0) return r;
        // Every refusal is journaled, also these before the core has the arguments: with what
        // was read so far (cut: the core escapes and bounds it) and whoever the caller is.
        auto refuse = [&](const Error &why) {
            auto cut = [](const char *v) { return std::string(v ? v : "").substr(0, 256); };
            daemon::RequestArgs seen = a;
            seen.netdev = cut(netdev);
            seen.gpu = cut(gpu);
            seen.mode = cut(mode);
            s->journal_refused_request(m, seen, why);
            return fail(err, why);
        };
        // Sizes are checked on sd-bus's own copy of the message, before anything is copied.
        for (auto check : {limits::check_length("netdev", netdev, limits::netdev),
                           limits::check_length("gpu", gpu, limits::gpu),
                           limits::check_length("mode", mode, limits::mode)})
            if (!check) return refuse(check.error());
        if ((r = sd_bus_message_enter_container(m, 'a', "s")) < 0) return r;
        const char *flow = nullptr;
        while ((r = sd_bus_message_read(m, "s", &flow)) > 0) {
            if (a.flows.size() == s->manager_->max_flows())
                return refuse(make_error(
                    Errc::invalid_argument,
                    "flows: at most " + std::to_string(s->manager_->max_flows()) + " per binding"));
            std::string name = "flows[" + std::to_string(a.flows.size()) + "]";
            if (auto c = limits::check_length(name, flow, limits::flow); !c)
                return refuse(c.error());
            a.flows.emplace_back(flow);
        }
        if (r < 0 || (r = sd_bus_message_exit_container(m)) < 0) return r;
        a.netdev = netdev;
        a.gpu = gpu;
        a.mode = mode;
        auto caller = s->peer(m);
        if (!caller) return refuse(caller.error());
        // The reply goes once the grant is durable; meanwhile the loop serves other callers.
        std::shared_ptr<sd_bus_message> call = hold_call(m);
        s->manager_->request(*caller, a, [s, call](Result<daemon::Granted> granted) {
            if (!granted) return reply_error(call.get(), granted.error());
            sd_bus_message *reply_raw = nullptr;
            int built = sd_bus_message_new_method_return(call.get(), &reply_raw);
            MessagePtr reply(reply_raw);
            std::string path = binding_path(granted->id);
            if (built >= 0)
                built =
                    sd_bus_message_append(reply.get(), "os", path.c_str(), granted->key_id.c_str());
            if (built >= 0)
                built = sd_bus_message_append_array(reply.get(), 'y', granted->key.data(),
                                                    granted->key.size());
            if (built >= 0) {
                sd_bus_send(nullptr, reply.get(), nullptr);
                return;
            }
            // The key cannot reach the caller: the binding it could never activate ends now,
            // and the caller hears why at once instead of waiting out its timeout.
            s->manager_->release(granted->id, {}, true, [](Result<void>) {});
            reply_error(call.get(), make_error(Errc::io, std::string("the reply could not be "
                                                                     "built: ") +
                                                             std::strerror(-built)));
        });
        return 1; // replied, or will be
    });
}

int BusService::list_bindings(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("ListBindings", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "ListBindings"); !t) return fail(err, t.error());
        bool all = s->authorizer_.is_auditor(*c, s->manager_->policy().settings);
        sd_bus_message *reply_raw = nullptr;
        int r = sd_bus_message_new_method_return(m, &reply_raw);
        if (r < 0) return r;
        MessagePtr reply(reply_raw);
        if ((r = sd_bus_message_open_container(reply.get(), 'a', "(osssssuut)")) < 0) return r;
        for (auto *b : s->manager_->bindings()) {
            if (!all && !owns(*c, *b)) continue;
            std::string path = binding_path(b->id);
            r = sd_bus_message_append(
                reply.get(), "(osssssuut)", path.c_str(), b->id.c_str(), b->netdev.c_str(),
                b->gpu.c_str(), policy::to_string(b->mode), daemon::to_string(b->state),
                b->owner.uid, static_cast<std::uint32_t>(b->owner.pid), b->region_id.length);
            if (r < 0) return r;
        }
        if ((r = sd_bus_message_close_container(reply.get())) < 0) return r;
        return sd_bus_send(nullptr, reply.get(), nullptr);
    });
}

int BusService::revoke_binding(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("RevokeBinding", err, [&]() -> int {
        auto *s = service(self);
        const char *id = nullptr, *why = nullptr;
        int r = sd_bus_message_read(m, "ss", &id, &why);
        if (r < 0) return r;
        for (auto check : {limits::check_length("id", id, limits::binding_id),
                           limits::check_length("reason", why, limits::reason)})
            if (!check) return fail(err, check.error());
        // Bad input is refused before anyone (polkit) is asked about the caller.
        if (why[0] == '\0')
            return fail(err, make_error(Errc::invalid_argument, "reason: say why you revoke"));
        if (auto t = s->throttle(m, "RevokeBinding"); !t) return fail(err, t.error());
        if (auto c = s->credentials(m); !c)
            return fail(err, c.error());
        else if (auto h = s->host_only(*c, "RevokeBinding", journal::kind::revoke_refused); !h)
            return fail(err, h.error());
        auto caller = s->peer(m);
        if (!caller) return fail(err, caller.error());
        Credentials c;
        c.uid = caller->uid;
        c.pid = caller->pid;
        c.sender = caller->bus_name;
        take_identity(c, *caller);
        auto done = reply_when_done(m);
        auto asked = s->authorizer_.check_admin(
            c, s->manager_->policy().settings,
            [s, done, id = std::string(id), why = std::string(why), peer = *caller](bool admin) {
                if (!admin) {
                    auto denied = make_error(Errc::denied,
                                             "revoking a binding needs root, the admin group, or "
                                             "polkit action org.knod.policy1.manage");
                    s->manager_->refuse_action(journal::kind::revoke_refused, peer,
                                               "not-authorized", denied.message, id);
                    return done(denied);
                }
                s->manager_->revoke(id, why, peer, done);
            });
        if (!asked) return s->refuse_limit(m, c, asked.error(), err);
        return 1; // replied, or will be
    });
}

int BusService::reload_policy(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("ReloadPolicy", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "ReloadPolicy"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "ReloadPolicy", journal::kind::reload_refused); !h)
            return fail(err, h.error());
        std::shared_ptr<sd_bus_message> call = hold_call(m);
        daemon::Peer by = refused_caller(*c);
        auto asked = s->authorizer_.check_admin(
            *c, s->manager_->policy().settings, [s, call, by](bool admin) {
                if (!admin) {
                    auto denied = make_error(Errc::denied, "reloading policy needs root, the admin "
                                                           "group, or polkit action "
                                                           "org.knod.policy1.manage");
                    s->manager_->refuse_action(journal::kind::reload_refused, by, "not-authorized",
                                               denied.message);
                    return reply_error(call.get(), denied);
                }
                auto revoked = s->manager_->reload(by, "uid " + std::to_string(by.uid));
                if (!revoked) return reply_error(call.get(), revoked.error());
                sd_bus_reply_method_return(
                    call.get(), "uu",
                    static_cast<std::uint32_t>(s->manager_->policy().rules.size()),
                    static_cast<std::uint32_t>(*revoked));
            });
        if (!asked) return s->refuse_limit(m, *c, asked.error(), err);
        return 1; // replied, or will be
    });
}

namespace {

// An a{ss} argument, at most `max` entries, each string at most `max_bytes`.
Result<std::map<std::string, std::string>> read_string_map(sd_bus_message *m, const char *what,
                                                           std::size_t max, std::size_t max_bytes) {
    std::map<std::string, std::string> out;
    if (sd_bus_message_enter_container(m, 'a', "{ss}") < 0)
        return make_error(Errc::invalid_argument, std::string(what) + ": not a{ss}");
    const char *k = nullptr, *v = nullptr;
    int r;
    while ((r = sd_bus_message_read(m, "{ss}", &k, &v)) > 0) {
        if (out.size() >= max)
            return make_error(Errc::invalid_argument,
                              std::string(what) + ": at most " + std::to_string(max) + " entries");
        for (auto check :
             {limits::check_length(what, k, max_bytes), limits::check_length(what, v, max_bytes)})
            if (!check) return check.error();
        out[k] = v;
    }
    if (r < 0 || sd_bus_message_exit_container(m) < 0)
        return make_error(Errc::invalid_argument, std::string(what) + ": cannot be read");
    return out;
}

} // namespace

// A pod method from anyone but the host's root: refused, and journaled (pod-refused,
// not-authorized) like every refusal.
Error BusService::refuse_pod_call(BusService &s, const Credentials &c, const std::string &why) {
    auto denied = make_error(Errc::denied, why);
    daemon::Peer by = refused_caller(c);
    s.manager_->refuse_action(journal::kind::pod_refused, by, "not-authorized", denied.message);
    return denied;
}

int BusService::register_pod(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("RegisterPod", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "RegisterPod"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "RegisterPod", journal::kind::pod_refused); !h)
            return fail(err, h.error());
        const char *container = nullptr, *ifname = nullptr;
        int fd = -1;
        int r = sd_bus_message_read(m, "ssh", &container, &ifname, &fd);
        if (r < 0) return r;
        if (!c->host_root)
            return fail(err, refuse_pod_call(*s, *c,
                                             "only the host's root (the node's CNI plugin) "
                                             "registers pods; a container's root is not it"));
        for (auto check : {limits::check_length("container_id", container, 256),
                           limits::check_length("ifname", ifname, 15)})
            if (!check) return fail(err, check.error());
        auto pod = read_string_map(m, "pod", 4, 253);
        if (!pod) return fail(err, pod.error());
        auto annotations = read_string_map(m, "annotations", 64, 4096);
        if (!annotations) return fail(err, annotations.error());
        // The message owns the fd; the registration holds a copy of its own.
        int held = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (held < 0)
            return fail(err, system_error(Errc::out_of_resources, errno,
                                          "cannot hold the sandbox's network namespace"));
        daemon::PodRegistration reg;
        reg.container_id = container;
        reg.ifname = ifname;
        reg.netns = UniqueFd(held);
        reg.pod = std::move(*pod);
        reg.annotations = std::move(*annotations);
        if (auto added = s->admission().register_pod(std::move(reg)); !added)
            return fail(err, added.error());
        return sd_bus_reply_method_return(m, "");
    });
}

int BusService::unregister_pod(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("UnregisterPod", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "UnregisterPod"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "UnregisterPod", journal::kind::pod_refused); !h)
            return fail(err, h.error());
        if (!c->host_root)
            return fail(err, refuse_pod_call(*s, *c,
                                             "only the host's root (the node's CNI "
                                             "plugin) unregisters pods"));
        const char *container = nullptr, *ifname = nullptr;
        int r = sd_bus_message_read(m, "ss", &container, &ifname);
        if (r < 0) return r;
        for (auto check : {limits::check_length("container_id", container, 256),
                           limits::check_length("ifname", ifname, 15)})
            if (!check) return fail(err, check.error());
        auto ended = s->admission().unregister_pod(container, ifname);
        return sd_bus_reply_method_return(m, "u", static_cast<std::uint32_t>(ended));
    });
}

int BusService::collect_pods(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("CollectPods", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "CollectPods"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "CollectPods", journal::kind::pod_refused); !h)
            return fail(err, h.error());
        if (!c->host_root)
            return fail(err, refuse_pod_call(*s, *c,
                                             "only the host's root (the node's CNI "
                                             "plugin) garbage-collects pods"));
        const char *network = nullptr;
        int r = sd_bus_message_read(m, "s", &network);
        if (r < 0) return r;
        if (auto check = limits::check_length("network", network, 253); !check)
            return fail(err, check.error());
        if (*network == '\0')
            return fail(err, make_error(Errc::invalid_argument,
                                        "network: the CNI network's name, not empty"));
        // The runtime lists every attachment still valid on the network: bounded well above
        // what a node runs (the registry keeps at most 4,096), below the bus's message limit.
        constexpr std::size_t max_valid = 65536;
        std::set<std::pair<std::string, std::string>> valid;
        if (sd_bus_message_enter_container(m, 'a', "(ss)") < 0)
            return fail(err, make_error(Errc::invalid_argument, "valid: not a(ss)"));
        const char *container = nullptr, *ifname = nullptr;
        while ((r = sd_bus_message_read(m, "(ss)", &container, &ifname)) > 0) {
            if (valid.size() >= max_valid)
                return fail(err, make_error(Errc::invalid_argument, "valid: at most " +
                                                                        std::to_string(max_valid) +
                                                                        " attachments"));
            for (auto check : {limits::check_length("container_id", container, 256),
                               limits::check_length("ifname", ifname, 15)})
                if (!check) return fail(err, check.error());
            valid.emplace(container, ifname);
        }
        if (r < 0 || sd_bus_message_exit_container(m) < 0)
            return fail(err, make_error(Errc::invalid_argument, "valid: cannot be read"));
        std::size_t ended = 0;
        std::size_t collected = s->admission().collect_pods(network, valid, ended);
        return sd_bus_reply_method_return(m, "uu", static_cast<std::uint32_t>(collected),
                                          static_cast<std::uint32_t>(ended));
    });
}

int BusService::can_manage(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("CanManage", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "CanManage"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "CanManage", nullptr); !h) return fail(err, h.error());
        std::shared_ptr<sd_bus_message> call = hold_call(m);
        auto asked =
            s->authorizer_.check_admin(*c, s->manager_->policy().settings, [call](bool admin) {
                sd_bus_reply_method_return(
                    call.get(), "bs", admin,
                    admin ? ""
                          : "revoking and reloading need root, the policy's admin group, "
                            "or polkit action org.knod.policy1.manage (without a password)");
            });
        if (!asked) return s->refuse_limit(m, *c, asked.error(), err);
        return 1; // replied, or will be
    });
}

int BusService::host_report(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("GetHostReport", err, [&]() -> int {
        auto *s = service(self);
        if (auto t = s->throttle(m, "GetHostReport"); !t) return fail(err, t.error());
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto h = s->host_only(*c, "GetHostReport", nullptr); !h) return fail(err, h.error());
        return sd_bus_reply_method_return(m, "s", daemon::host_report_json(*s->manager_).c_str());
    });
}

int BusService::metrics(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("GetMetrics", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "GetMetrics"); !t) return fail(err, t.error());
        if (auto h = s->host_only(*c, "GetMetrics", nullptr); !h) return fail(err, h.error());
        if (!s->authorizer_.is_auditor(*c, s->manager_->policy().settings))
            return fail(err, make_error(Errc::denied,
                                        "GetMetrics needs root, the auditor group or the admin "
                                        "group: its figures cover every user's bindings"));
        return sd_bus_reply_method_return(
            m, "s", daemon::metrics_json(*s->manager_, daemon_version).c_str());
    });
}

namespace {

// Reads an access key argument ("ay"), capped before anything looks at it. Returns 1 when read,
// otherwise what the handler returns (a negative errno, or the error already set in `err`).
int read_key(sd_bus_message *m, sd_bus_error *err, std::span<const std::uint8_t> &key) {
    const void *data = nullptr;
    size_t size = 0;
    if (int r = sd_bus_message_read_array(m, 'y', &data, &size); r < 0) return r;
    if (size > limits::key)
        return fail(err, make_error(Errc::invalid_argument,
                                    "key: at most " + std::to_string(limits::key) + " bytes"));
    key = {static_cast<const std::uint8_t *>(data), size};
    return 1;
}

} // namespace

int BusService::activate(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("Activate", err, [&]() -> int {
        auto *s = service(self);
        std::span<const std::uint8_t> key;
        if (int r = read_key(m, err, key); r <= 0) return r;
        auto caller = s->peer(m);
        if (!caller) return fail(err, caller.error());
        std::string id = id_of(sd_bus_message_get_path(m));
        auto done = s->manager_->activate(id, *caller, key);
        if (!done) return fail(err, done.error());
        if (const daemon::Binding *b = s->manager_->find(id)) s->emit_state_changed(*b);
        return sd_bus_reply_method_return(m, "");
    });
}

int BusService::renew(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("Renew", err, [&]() -> int {
        auto *s = service(self);
        std::span<const std::uint8_t> key;
        if (int r = read_key(m, err, key); r <= 0) return r;
        auto caller = s->peer(m);
        if (!caller) return fail(err, caller.error());
        std::string id = id_of(sd_bus_message_get_path(m));
        if (auto t = s->throttle(m, "Renew"); !t) return fail(err, t.error());
        auto until = s->manager_->renew(id, *caller, key);
        if (!until) return fail(err, until.error());
        return sd_bus_reply_method_return(m, "t", static_cast<std::uint64_t>(*until));
    });
}

int BusService::set_job(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("SetJob", err, [&]() -> int {
        auto *s = service(self);
        std::span<const std::uint8_t> key;
        if (int r = read_key(m, err, key); r <= 0) return r;
        const char *job = nullptr, *group = nullptr;
        std::uint32_t rank = 0;
        if (int r = sd_bus_message_read(m, "ssu", &job, &group, &rank); r < 0) return r;
        auto caller = s->peer(m);
        if (!caller) return fail(err, caller.error());
        // The core checks the strings (check_job_tag) and journals the tag.
        auto done = s->manager_->set_job(id_of(sd_bus_message_get_path(m)), *caller, key,
                                         {job, group, rank});
        if (!done) return fail(err, done.error());
        return sd_bus_reply_method_return(m, "");
    });
}

int BusService::rx_notifier(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("RxNotifier", err, [&]() -> int {
        auto *s = service(self);
        std::span<const std::uint8_t> key;
        if (int r = read_key(m, err, key); r <= 0) return r;
        auto caller = s->peer(m);
        if (!caller) return fail(err, caller.error());
        auto n = s->manager_->rx_notifier(id_of(sd_bus_message_get_path(m)), *caller, key);
        if (!n) return fail(err, n.error());
        // sd-bus sends a dup of the fd; ours closes when `n` goes.
        return sd_bus_reply_method_return(m, "ht", n->fd.get(), n->rx_bytes);
    });
}

int BusService::release(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("Release", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "Release"); !t) return fail(err, t.error());
        daemon::Peer by = refused_caller(*c);
        std::string id = id_of(sd_bus_message_get_path(m));
        const daemon::Binding *b = s->manager_->find(id);
        if (!b || owns(*c, *b)) {
            // Ownership as owns() sees it (uid and domain): the core's own check is by uid.
            s->manager_->release(id, by, b != nullptr, reply_when_done(m));
            return 1;
        }
        // Someone else's binding: only an admin may release it (polkit may take a while).
        auto done = reply_when_done(m);
        auto asked = s->authorizer_.check_admin(
            *c, s->manager_->policy().settings,
            [s, id, by, done](bool admin) { s->manager_->release(id, by, admin, done); });
        if (!asked) return s->refuse_limit(m, *c, asked.error(), err);
        return 1;
    });
}

int BusService::name_owner_changed(sd_bus_message *m, void *self, sd_bus_error *) {
    return guarded("NameOwnerChanged", nullptr, [&]() -> int {
        auto *s = service(self);
        // Only the bus's own says that a connection left: any client may address a signal with
        // this name to us, but none can send as org.freedesktop.DBus (the bus sets the sender).
        const char *sender = sd_bus_message_get_sender(m);
        if (!sender || std::strcmp(sender, "org.freedesktop.DBus") != 0) return 0;
        const char *name = nullptr, *old_owner = nullptr, *new_owner = nullptr;
        if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return 0;
        if (!name || name[0] != ':' || !new_owner || new_owner[0] != '\0') return 0;
        if (!s->connections_.count(name)) return 0; // never called us: nothing kept for it
        std::string gone = name;
        s->forget(gone);
        s->manager_->connection_gone(gone);
        return 0;
    });
}

int BusService::subscribe(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("Subscribe", err, [&]() -> int {
        auto *s = service(self);
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        if (auto t = s->throttle(m, "Subscribe"); !t) return fail(err, t.error());
        // Only a remembered connection may subscribe: it is forgotten, subscription and all,
        // when it leaves.
        auto it = c->sender.empty() ? s->connections_.end() : s->connections_.find(c->sender);
        if (it == s->connections_.end())
            return fail(err, make_error(Errc::denied, "the caller's connection or process could "
                                                      "not be identified"));
        if (!s->subscribers_.count(c->sender)) {
            // A second Subscribe on a subscribed connection costs nothing; a new one counts.
            auto mine = s->subscriptions_of_.find(c->principal);
            std::size_t held = mine == s->subscriptions_of_.end() ? 0 : mine->second;
            std::string what;
            bool exempt = c->root_in_host;
            if (!exempt && held >= s->limits_.subscriptions_per_uid)
                what = "at most " + std::to_string(s->limits_.subscriptions_per_uid) +
                       " subscribed connections per user; subscribe on fewer connections";
            else if (!exempt && s->unprivileged_subscriptions_ >= s->limits_.subscriptions)
                what = "at most " + std::to_string(s->limits_.subscriptions) +
                       " subscribed connections in all; retry later";
            if (!what.empty())
                return fail(err, s->manager_->refuse_limit(c->uid, c->pid, c->root_in_host,
                                                           "Subscribe", what));
            s->subscriptions_of_[c->principal] += 1;
            if (!exempt) s->unprivileged_subscriptions_ += 1;
            it->second.exempt_subscription = exempt;
            s->subscribers_.insert(c->sender);
        }
        it->second.subscriber = Subscriber{*c, {}, false}; // decided at the next signal
        return sd_bus_reply_method_return(m, "");
    });
}

int BusService::attest_process(sd_bus_message *m, void *self, sd_bus_error *err) {
    return guarded("AttestProcess", err, [&]() -> int {
        auto *s = service(self);
        int socket = -1;
        int r = sd_bus_message_read(m, "h", &socket);
        if (r < 0) return r;
        auto c = s->credentials(m);
        if (!c) return fail(err, c.error());
        // Not rate-limited: the SDK calls it once per connection, before its first request,
        // and a proven connection's further calls only read what is held.
        auto it = s->connections_.find(c->sender);
        if (it == s->connections_.end() || !it->second.creds)
            return fail(err, make_error(Errc::denied, "the caller's connection or process could "
                                                      "not be identified"));
        // Proven once, proven for the connection's life: its process is pinned by the pidfd.
        daemon::ProvenProcess &held = it->second.creds->process;
        if (held.proof == daemon::ProcessProof::pid_only) {
            auto attested =
                it->second.creds->connector_gone
                    ? Result<daemon::AttestedProcess>(make_error(
                          Errc::denied, "the bus says the process that made this connection has "
                                        "exited; connect again from the calling process"))
                    : daemon::attest_socketpair_end(socket, c->uid, c->pid);
            if (!attested) {
                daemon::Peer who = refused_caller(*c);
                s->manager_->refuse_action(journal::kind::attest_refused, who, "not-proven",
                                           attested.error().message);
                return fail(err, attested.error());
            }
            held = {std::make_shared<UniqueFd>(std::move(attested->pidfd)),
                    daemon::ProcessProof::attested, attested->pid};
            // The process read at this pid is now the one that connected: read again as such
            // (root's rights if it is the host's root, its pod's identity if it is in one).
            Credentials &creds = *it->second.creds;
            auto proven =
                daemon::identify_peer(creds.uid, creds.pid, creds.bus_gids, creds.sender, held);
            if (!proven) return fail(err, proven.error());
            s->place(*proven);
            take_identity(creds, std::move(*proven));
            // A subscriber's copy of the credentials too.
            if (it->second.subscriber) {
                it->second.subscriber->creds = creds;
            }
        }
        return sd_bus_reply_method_return(m, "s", daemon::to_string(held.proof));
    });
}

std::set<std::string> BusService::entitled(const daemon::Binding &b, bool to_holder) {
    std::set<std::string> to;
    if (to_holder && !b.owner.bus_name.empty()) to.insert(b.owner.bus_name);
    const auto &settings = manager_->policy().settings;
    std::string groups = settings.admin_group + "\n" + settings.auditor_group + "\n";
    for (auto &name : subscribers_) {
        auto conn = connections_.find(name);
        if (conn == connections_.end() || !conn->second.subscriber) continue;
        Subscriber &sub = *conn->second.subscriber;
        if (sub.groups != groups) {
            sub.sees_all = authorizer_.is_auditor(sub.creds, settings);
            sub.groups = groups;
        }
        // The same test as visible(): what ListBindings would show this subscriber.
        if (sub.sees_all || owns(sub.creds, b)) to.insert(name);
    }
    return to;
}

void BusService::signal_about(const daemon::Binding &b, const SignalName &name,
                              const SignalBody &body, Audience audience) {
    // A lost signal costs a listener an update, never a binding: log it and go on. A pod
    // connection's signals go over that connection (no bus routes them).
    std::set<std::string> on_bus;
    for (auto &to : entitled(b, audience == Audience::holder_and_subscribers)) {
        auto pod = pod_buses_.find(to);
        if (pod == pod_buses_.end()) {
            if (!is_pod_connection_name(to)) on_bus.insert(to); // else closed: no one to tell
        } else if (auto r = send_to_peer(pod->second, name, body); !r) {
            std::cerr << "knod-policyd: binding " << b.id << ": " << r.error().message << " (" << to
                      << ")" << std::endl;
        }
    }
    if (auto r = send_unicast(bus_, on_bus, name, body); !r)
        std::cerr << "knod-policyd: binding " << b.id << ": " << r.error().message << std::endl;
}

void BusService::emit_state_changed(const daemon::Binding &b) {
    std::string path = binding_path(b.id);
    signal_about(b, {path.c_str(), "org.freedesktop.DBus.Properties", "PropertiesChanged"},
                 [&](sd_bus_message *m) {
                     int r = sd_bus_message_append(m, "s", binding_interface);
                     if (r >= 0) r = sd_bus_message_open_container(m, 'a', "{sv}");
                     if (r >= 0)
                         r = sd_bus_message_append(m, "{sv}", "State", "s",
                                                   daemon::to_string(b.state));
                     if (r >= 0) r = sd_bus_message_close_container(m);
                     return r < 0 ? r : sd_bus_message_append(m, "as", 0);
                 });
}

int BusService::append_interfaces_added(sd_bus_message *m, const daemon::Binding &b) {
    std::string path = binding_path(b.id);
    int r = sd_bus_message_append(m, "o", path.c_str());
    if (r >= 0) r = sd_bus_message_open_container(m, 'a', "{sa{sv}}");
    for (const char *iface : standard_interfaces)
        if (r >= 0) r = sd_bus_message_append(m, "{sa{sv}}", iface, 0);
    if (r >= 0) r = sd_bus_message_open_container(m, 'e', "sa{sv}");
    if (r >= 0) r = sd_bus_message_append(m, "s", binding_interface);
    if (r >= 0) r = sd_bus_message_open_container(m, 'a', "{sv}");
    // Every property of the vtable, through the getter Get uses.
    emitting_ = &b;
    for (const sd_bus_vtable *v = binding_vtable; r >= 0 && v->type != _SD_BUS_VTABLE_END; ++v) {
        if (v->type != _SD_BUS_VTABLE_PROPERTY) continue;
        r = sd_bus_message_open_container(m, 'e', "sv");
        if (r >= 0) r = sd_bus_message_append(m, "s", v->x.property.member);
        if (r >= 0) r = sd_bus_message_open_container(m, 'v', v->x.property.signature);
        if (r >= 0)
            r = v->x.property.get(bus_, path.c_str(), binding_interface, v->x.property.member, m,
                                  this, nullptr);
        if (r >= 0) r = sd_bus_message_close_container(m); // variant
        if (r >= 0) r = sd_bus_message_close_container(m); // entry
    }
    emitting_ = nullptr;
    for (int level = 0; level < 3 && r >= 0; ++level) // properties, interface entry, interfaces
        r = sd_bus_message_close_container(m);
    return r;
}

void BusService::check_connections() {
    std::set<std::string> names;
    for (auto *b : manager_->bindings())
        if (!b->owner.bus_name.empty()) names.insert(b->owner.bus_name);
    confirm(names);
}

void BusService::confirm_remembered() {
    std::set<std::string> names;
    for (auto &[name, entry] : connections_)
        names.insert(name);
    confirm(names);
}

void BusService::confirm(const std::set<std::string> &names) {
    for (auto &name : names) {
        // A pod connection is gone unless served now: none outlives the daemon that accepted it.
        // A holder's may come back (set_pod_reclaim): its bindings wait for it.
        if (is_pod_connection_name(name)) {
            if (!pod_buses_.count(name) && !awaiting_.count(name)) {
                forget(name);
                manager_->connection_gone(name);
            }
            continue;
        }
        sd_bus_error err = SD_BUS_ERROR_NULL;
        sd_bus_message *reply = nullptr;
        int has = 1; // unknown (the bus did not answer): keep, as for any other call
        if (sd_bus_call_method(bus_, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                               "org.freedesktop.DBus", "NameHasOwner", &err, &reply, "s",
                               name.c_str()) >= 0)
            if (sd_bus_message_read(reply, "b", &has) < 0) has = 1;
        sd_bus_message_unref(reply);
        sd_bus_error_free(&err);
        if (!has) {
            forget(name);
            manager_->connection_gone(name);
        }
    }
}

void BusService::binding_adopted(const daemon::Binding &b) {
    // Its holder's connection, if it is still there (check_connections() asks the bus): a
    // binding's holder is remembered whatever the bounds (it was admitted before the restart).
    if (!b.owner.bus_name.empty())
        (void)remember(b.owner.bus_name, b.owner.principal(), 0, nullptr, b.owner.root_in_host());
    if (is_pod_connection_name(b.owner.bus_name) && pod_reclaim_.count() > 0) {
        awaiting_.insert(b.owner.bus_name);
        if (!reclaim_until_) reclaim_until_ = std::chrono::steady_clock::now() + pod_reclaim_;
    }
}

namespace {

// The executable as granted and as read now: a program file replaced on disk (an upgrade)
// reads "PATH (deleted)" from a process that still runs it.
std::string_view program(std::string_view exe) {
    constexpr std::string_view deleted = " (deleted)";
    if (exe.ends_with(deleted)) exe.remove_suffix(deleted.size());
    return exe;
}

} // namespace

void BusService::take_back_on_touch(sd_bus *conn, const std::string &id) {
    auto pod = pod_connections_.find(conn);
    if (pod == pod_connections_.end()) return;
    // Only a call on the binding's own object: sd-bus also looks bindings up to answer
    // GetManagedObjects on the manager, which names none of them.
    sd_bus_message *m = sd_bus_get_current_message(conn);
    const char *path = m ? sd_bus_message_get_path(m) : nullptr;
    if (!path || binding_path(id) != path) return;
    auto entry = connections_.find(pod->second.name);
    if (entry == connections_.end() || !entry->second.creds) return;
    const Credentials &caller = *entry->second.creds;
    // Only the very process that held it, as the kernel vouches for it (its pidfd at accept):
    // a pid alone may have changed hands during the restart.
    if (caller.process.proof == daemon::ProcessProof::pid_only || caller.start_time == 0) return;
    const keys::Holder who{caller.pid, caller.start_time};
    std::string old_name;
    if (const daemon::Binding *b = manager_->find(id)) {
        if (!awaiting_.count(b->owner.bus_name) || !(b->owner.holder() == who) ||
            b->owner.uid != caller.uid || b->owner.pod_sandbox != caller.pod_sandbox)
            return;
        // Still the program that was granted: a holder that exec()ed another during the
        // restart is a caller the policy has not decided on.
        if (program(b->owner.executable) != program(caller.executable) ||
            b->owner.cgroup != caller.cgroup)
            return;
        old_name = b->owner.bus_name;
    } else {
        for (auto &u : untold_)
            if (u.id == id && u.holder == who) old_name = u.connection;
        if (old_name.empty()) return;
    }
    // The connection that asks about one binding of the old connection is that client's
    // successor: it holds all of them, and hears what ended meanwhile.
    std::vector<std::string> ids;
    for (const daemon::Binding *b : manager_->bindings())
        if (b->owner.bus_name == old_name && b->owner.holder() == who) ids.push_back(b->id);
    for (auto &moved : ids)
        manager_->hold_on(moved, caller.sender);
    bool more = false;
    for (const daemon::Binding *other : manager_->bindings())
        more = more || other->owner.bus_name == old_name;
    if (!more && awaiting_.erase(old_name)) forget(old_name);
    tell_untold(conn, old_name);
}

namespace {

void tell_end(sd_bus *conn, const std::string &id, bool revoked, const std::string &reason) {
    std::string path = binding_path(id);
    const char *member = revoked ? "BindingRevoked" : "BindingReleased";
    if (auto r = send_to_peer(conn, {manager_path, manager_interface, member},
                              [&](sd_bus_message *m) {
                                  return sd_bus_message_append(m, "oss", path.c_str(), id.c_str(),
                                                               reason.c_str());
                              });
        !r)
        std::cerr << "knod-policyd: binding " << id << ": " << r.error().message << std::endl;
}

} // namespace

void BusService::tell_untold(sd_bus *conn, const std::string &old_name) {
    std::erase_if(untold_, [&](const UntoldEnd &u) {
        if (u.connection != old_name) return false;
        tell_end(conn, u.id, u.revoked, u.reason);
        return true;
    });
}

void BusService::reclaim_tick() {
    if (reclaim_until_ && std::chrono::steady_clock::now() >= *reclaim_until_) {
        reclaim_until_.reset();
        // Ended one name at a time, each still awaited while its bindings end (their ends are
        // kept for the holder, should it come back later).
        while (!awaiting_.empty()) {
            std::string name = *awaiting_.begin();
            forget(name);
            manager_->connection_gone(name);
            awaiting_.erase(name);
        }
        // A holder that came back but was not given its bindings (another program since, or
        // another cgroup) waits on a connection of its own: every connection of its process
        // hears the end.
        std::set<std::size_t> told;
        for (auto &[conn, pod] : pod_connections_) {
            auto entry = connections_.find(pod.name);
            if (entry == connections_.end() || !entry->second.creds) continue;
            const Credentials &c = *entry->second.creds;
            if (c.process.proof == daemon::ProcessProof::pid_only) continue;
            for (std::size_t i = 0; i < untold_.size(); ++i)
                if (untold_[i].holder == keys::Holder{c.pid, c.start_time}) {
                    tell_end(conn, untold_[i].id, untold_[i].revoked, untold_[i].reason);
                    told.insert(i);
                }
        }
        for (auto i = told.rbegin(); i != told.rend(); ++i)
            untold_.erase(untold_.begin() + static_cast<std::ptrdiff_t>(*i));
    }
    // A holder that is gone will never be told.
    for (auto it = untold_.begin(); it != untold_.end();) {
        auto start = daemon::process_start_time(it->holder.pid);
        if (start && *start == it->holder.start_time)
            ++it;
        else
            it = untold_.erase(it);
    }
}

void BusService::binding_created(const daemon::Binding &b) {
    std::string path = binding_path(b.id);
    signal_about(b, {manager_path, manager_interface, "BindingCreated"}, [&](sd_bus_message *m) {
        return sd_bus_message_append(m, "os", path.c_str(), b.id.c_str());
    });
    // InterfacesAdded by hand: sd_bus_emit_object_added can only broadcast.
    signal_about(b, {manager_path, "org.freedesktop.DBus.ObjectManager", "InterfacesAdded"},
                 [&](sd_bus_message *m) { return append_interfaces_added(m, b); });
}

void BusService::binding_ended(const daemon::Binding &b, daemon::EndReason why,
                               const std::string &note) {
    std::string path = binding_path(b.id);
    bool revoked = daemon::is_revocation(why);
    // The holder learns why: the journaled reason, then what the admin said ("revoke: ...") or
    // what the driver saw ("steering-drift: ...").
    std::string reason = daemon::to_string(why);
    if (!note.empty()) reason += ": " + note;
    // A pod-socket holder not back since the restart hears it when it returns.
    if (awaiting_.count(b.owner.bus_name) && why != daemon::EndReason::process_exit)
        untold_.push_back({b.owner.holder(), b.owner.bus_name, b.id, revoked, reason});
    signal_about(
        b, {manager_path, manager_interface, revoked ? "BindingRevoked" : "BindingReleased"},
        [&](sd_bus_message *m) {
            return sd_bus_message_append(m, "oss", path.c_str(), b.id.c_str(), reason.c_str());
        },
        Audience::holder_and_subscribers);
    signal_about(b, {manager_path, "org.freedesktop.DBus.ObjectManager", "InterfacesRemoved"},
                 [&](sd_bus_message *m) {
                     int r = sd_bus_message_append(m, "o", path.c_str());
                     if (r >= 0) r = sd_bus_message_open_container(m, 'a', "s");
                     for (const char *iface : standard_interfaces)
                         if (r >= 0) r = sd_bus_message_append(m, "s", iface);
                     if (r >= 0) r = sd_bus_message_append(m, "s", binding_interface);
                     return r < 0 ? r : sd_bus_message_close_container(m);
                 });
}

// No binding's details: every listener may know that the policy changed.
void BusService::policy_reloaded(std::size_t rules, std::size_t revoked) {
    for (auto &[on, pod] : pod_connections_)
        sd_bus_emit_signal(on, manager_path, manager_interface, "PolicyReloaded", "uu",
                           static_cast<std::uint32_t>(rules), static_cast<std::uint32_t>(revoked));
    sd_bus_emit_signal(bus_, manager_path, manager_interface, "PolicyReloaded", "uu",
                       static_cast<std::uint32_t>(rules), static_cast<std::uint32_t>(revoked));
}

} // namespace knod::bus
