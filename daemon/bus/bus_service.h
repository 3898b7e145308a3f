// The D-Bus adaptor of knod-policyd: one vtable per interface. Handlers unpack arguments, ask
// the bus who is calling, check privilege, and call the BindingManager; no policy logic here.
#pragma once

#include "daemon/binding_manager.h"
#include "daemon/bus/authorizer.h"
#include "daemon/bus/bus_ptr.h"
#include "daemon/bus/unicast.h"
#include "daemon/pod_admission.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace knod::bus {

// Bounds on what callers can make the daemon keep (docs/threat-model.md, "State a caller can
// make the daemon keep"). Root is not bounded (it can stop the daemon anyway).
struct CallerLimits {
    // Connections the daemon remembers (the bus's credentials, a subscription, bindings): the
    // system bus lets one user open 256 connections, and the daemon keeps at most that many per
    // uid, and this many in all (the bus completes at most 2048 connections by default).
    std::size_t connections_per_uid = 256;
    std::size_t connections = 4096;
    // Polkit questions in flight (each one a pending reply on the daemon's own connection, of
    // the 128 dbus-daemon allows per connection by default).
    std::size_t polkit_per_uid = 4;
    std::size_t polkit = 64;
    // Subscribed connections: each signal about a binding is one unicast message per entitled
    // subscriber (all of them for an auditor's or admin's), queued on the daemon's connection,
    // so the fan-out of every event is bounded by these, well below the connection bounds.
    std::size_t subscriptions_per_uid = 32;
    std::size_t subscriptions = 1024;
};

class BusService : public daemon::BindingEvents {
  public:
    explicit BusService(sd_bus *bus, CallerLimits limits = {});
    ~BusService() override;

    // Registers the objects and takes the well-known name. `pod_spool`: where knod-cni spools
    // what it could not hand over in time (empty: none is read; protocol/pod_spool.h).
    Result<void> start(daemon::BindingManager &manager, const std::string &pod_spool = {});

    // The pod socket (daemon/bus/pod_socket.h): a peer-to-peer connection that no bus vouches
    // for, so the kernel does. `admit_pod_caller`: who made the connection (SO_PEERCRED's uid
    // and pid, SO_PEERPIDFD's pidfd or none), identified as a bus caller is; refused (Denied,
    // journaled pod-refused/not-a-pod) unless it is in a registered pod's network namespace.
    Result<Credentials> admit_pod_caller(uid_t uid, pid_t pid, std::shared_ptr<UniqueFd> pidfd,
                                         const std::string &name) const;
    // Serves the same objects on `conn` for `caller` (from admit_pod_caller), remembered under
    // its name within the per-principal bounds; the slots live as long as the connection.
    Result<std::vector<SlotPtr>> serve_pod_connection(sd_bus *conn, const Credentials &caller);
    // The connection closed (or its maker exited): forgotten, and its bindings end as on a
    // disconnect from the bus.
    void pod_connection_closed(const std::string &name);
    // The daemon is stopping and the connection goes with it: nothing more is sent on it, and
    // its bindings end (or are handed off) as the stop decides.
    void pod_connection_detached(const std::string &name);
    // A bound of the pod socket reached (`what`: which): journaled like the others'.
    Error refuse_pod_limit(const Credentials &c, const std::string &what) const;
    // The pod methods' core (valid after start()); the daemon's tick consumes the spool here.
    daemon::PodAdmission &admission() { return *admission_; }

    void binding_created(const daemon::Binding &b) override;
    void binding_ended(const daemon::Binding &b, daemon::EndReason why,
                       const std::string &note) override;
    void policy_reloaded(std::size_t rules, std::size_t revoked) override;
    void binding_adopted(const daemon::Binding &b) override;
    // After a restart took bindings back: a holder whose bus connection closed meanwhile (the
    // bus's NameOwnerChanged went to nobody) loses its bindings as on a disconnect.
    void check_connections();
    // Once, soon after the start: a connection whose call was queued before the daemon's
    // NameOwnerChanged match reached the bus may have left unseen; the bus says which did, and
    // they are forgotten (their bindings end) as if seen leaving.
    void confirm_remembered();
    // Pod-socket holders across a restart. No pod connection outlives the daemon that accepted
    // it, so a binding taken back whose holder held it on one waits, until `window` after the
    // first such binding came back, for that very process to ask about it on a new connection:
    // the same pid and start time (read through the pidfd the kernel gave at accept), in the
    // same pod, as the same uid, executable and cgroup. It is then held on that connection; a
    // binding that ended meanwhile is told to the connection that asks about it. One not asked
    // for in time ends as on a disconnect. Zero: none waits (each ends at the start, as before).
    void set_pod_reclaim(std::chrono::seconds window) { pod_reclaim_ = window; }
    // The daemon's tick: ends what waited past the window.
    void reclaim_tick();

    // sd-bus callbacks; public only so the vtables in bus_service.cc can name them.
    static int request_binding(sd_bus_message *m, void *self, sd_bus_error *err);
    static int list_bindings(sd_bus_message *m, void *self, sd_bus_error *err);
    static int revoke_binding(sd_bus_message *m, void *self, sd_bus_error *err);
    static int reload_policy(sd_bus_message *m, void *self, sd_bus_error *err);
    static int can_manage(sd_bus_message *m, void *self, sd_bus_error *err);
    static int register_pod(sd_bus_message *m, void *self, sd_bus_error *err);
    static int unregister_pod(sd_bus_message *m, void *self, sd_bus_error *err);
    static int collect_pods(sd_bus_message *m, void *self, sd_bus_error *err);
    static Error refuse_pod_call(BusService &s, const Credentials &c, const std::string &why);
    static int host_report(sd_bus_message *m, void *self, sd_bus_error *err);
    static int metrics(sd_bus_message *m, void *self, sd_bus_error *err);
    static int subscribe(sd_bus_message *m, void *self, sd_bus_error *err);
    static int attest_process(sd_bus_message *m, void *self, sd_bus_error *err);
    static int activate(sd_bus_message *m, void *self, sd_bus_error *err);
    static int renew(sd_bus_message *m, void *self, sd_bus_error *err);
    static int rx_notifier(sd_bus_message *m, void *self, sd_bus_error *err);
    static int set_job(sd_bus_message *m, void *self, sd_bus_error *err);
    static int release(sd_bus_message *m, void *self, sd_bus_error *err);
    // One getter per property: `get` reads one figure of the manager, or one field of the
    // binding at the path (if the caller may see it), and appends it.
    using ManagerGet = int (*)(sd_bus_message *, const daemon::BindingManager &);
    using BindingGet = int (*)(sd_bus_message *, const daemon::Binding &,
                               const daemon::BindingManager &);
    template <ManagerGet get>
    static int manager_property(sd_bus *bus, const char *path, const char *interface,
                                const char *property, sd_bus_message *reply, void *self,
                                sd_bus_error *err);
    template <BindingGet get>
    static int binding_property(sd_bus *bus, const char *path, const char *interface,
                                const char *property, sd_bus_message *reply, void *self,
                                sd_bus_error *err);
    static int find_binding(sd_bus *bus, const char *path, const char *interface, void *self,
                            void **found, sd_bus_error *err);
    static int enumerate_bindings(sd_bus *bus, const char *prefix, void *self, char ***nodes,
                                  sd_bus_error *err);
    // The bus's NameOwnerChanged, for every name (one match rule, whatever the number of
    // callers): a remembered connection that left is forgotten, and its bindings end.
    static int name_owner_changed(sd_bus_message *m, void *self, sd_bus_error *err);
    // Connections remembered now (tests and the threat model's figures).
    std::size_t remembered_connections() const { return connections_.size(); }

  private:
    // Registers the vtables, the node enumerator and the object manager on `bus` (the system
    // bus, or one pod connection): one set of tables, served on every connection.
    Result<std::vector<SlotPtr>> add_objects(sd_bus *bus);
    Result<Credentials> credentials(sd_bus_message *m) const;
    // A call on a pod connection: what the kernel said at accept, if its maker still runs and
    // its sandbox is still registered.
    Result<Credentials> pod_credentials(sd_bus *conn) const;
    Result<daemon::Peer> peer(sd_bus_message *m) const;
    // Puts the pod registered for the peer's network namespace, if any, on it.
    void place(daemon::Peer &p) const;
    // RequestBinding refused before the core had it (argument sizes, an unidentifiable caller):
    // journaled through the core with whatever identifies the caller.
    void journal_refused_request(sd_bus_message *m, const daemon::RequestArgs &args,
                                 const Error &why) const;
    // The per-uid rate limit for methods the core does not see (RequestBinding and Activate
    // are limited there).
    Result<void> throttle(sd_bus_message *m, const char *method) const;
    // Refuses (Denied, journaled) a call on a connection whose maker has exited since it was
    // identified: a connection speaks only for the process that made it.
    Result<void> maker_gone(const Credentials &c) const;
    Error refuse_maker_gone(const Credentials &c, const char *how) const;
    // Denied (journaled as `kind`, if any, not-authorized) on the pod socket: `method` is for
    // the node's administrators and its CNI plugin, who use the system bus.
    Result<void> host_only(const Credentials &c, const char *method, const char *kind) const;
    // May the sender of the message being handled on `on` see this binding?
    bool visible(sd_bus *on, const daemon::Binding &b) const;
    const daemon::Binding *binding_at(sd_bus *on, const char *path) const;
    // The ObjectManager's InterfacesAdded arguments for a binding, as GetManagedObjects shows it.
    int append_interfaces_added(sd_bus_message *m, const daemon::Binding &b);

    // Signals about a binding go only to the connections that may list it: subscribers
    // (Subscribe) of the owner's uid, auditors and admins, and, for the binding's end only
    // (`to_holder`), the connection that requested it even unsubscribed: the rest repeats what
    // its own calls' replies said, and skipping it saves every pair four signals (#54).
    std::set<std::string> entitled(const daemon::Binding &b, bool to_holder);
    enum class Audience { subscribers, holder_and_subscribers };
    void signal_about(const daemon::Binding &b, const SignalName &name, const SignalBody &body,
                      Audience audience = Audience::subscribers);
    void emit_state_changed(const daemon::Binding &b);

    sd_bus *bus_;
    Authorizer authorizer_;
    daemon::BindingManager *manager_ = nullptr;
    std::unique_ptr<daemon::PodAdmission> admission_;
    // The binding whose InterfacesAdded is being built: its getters skip the visibility check
    // (the signal goes only to those entitled to it).
    const daemon::Binding *emitting_ = nullptr;
    std::vector<SlotPtr> slots_;
    CallerLimits limits_;
    // Every connection that called us (once the bus vouched for it and its process was read),
    // and every holder's connection taken back after a restart: what the bus vouched for (a
    // unique name is never reused and its uid and pid never change, so one
    // GetConnectionCredentials round trip per connection is enough) and its subscription.
    // Forgotten when the bus says the connection left (one NameOwnerChanged match for all
    // names, filtered here: no match rule per caller, so no caller can use up the daemon's
    // match rules on the bus and have it disconnected). Bounded per uid and in all.
    struct Subscriber {
        Credentials creds;
        std::string groups; // the admin and auditor groups `sees_all` was decided under
        bool sees_all = false;
    };
    struct Connection {
        daemon::PrincipalKey principal;
        std::optional<Credentials> creds; // none: only known as a taken-back binding's holder
        std::optional<Subscriber> subscriber;
        // Counted in no bound (the host's root: Peer::root_in_host), as it was remembered.
        bool exempt = false;
        bool exempt_subscription = false;
    };
    // Remembers `name` for `uid`, or refuses the call being handled (LimitsExceeded, journaled);
    // `exempt`: the host's root, counted in no bound.
    // `method`: the call that made it remembered (bounds apply; nullptr: a taken-back holder).
    Result<Connection *> remember(const std::string &name, const daemon::PrincipalKey &who,
                                  pid_t pid, const char *method, bool exempt) const;
    void forget(const std::string &name);
    // Asks the bus (NameHasOwner, waited for) whether each name is still connected; one that is
    // not is forgotten, and its bindings end. No answer keeps it.
    void confirm(const std::set<std::string> &names);
    // Refuses the call being handled for a bound (`why`: which), journaled; the handler's return.
    int refuse_limit(sd_bus_message *m, const Credentials &c, const Error &why,
                     sd_bus_error *err) const;
    mutable std::unordered_map<std::string, Connection> connections_;
    // Remembered connections per principal (a uid in its domain).
    mutable std::map<daemon::PrincipalKey, std::size_t> connections_of_;
    mutable std::size_t unprivileged_connections_ = 0; // remembered, of uids other than 0
    // Connections that called Subscribe (each also in connections_). Whether one sees every
    // binding is decided once per admin/auditor group setting, so that a signal costs no
    // user-database lookups however many subscribers there are.
    std::set<std::string> subscribers_;
    std::map<daemon::PrincipalKey, std::size_t> subscriptions_of_; // per principal
    std::size_t unprivileged_subscriptions_ = 0; // subscribed, of uids other than 0
    // Pod connections being served: the connection's name (pod_connection_name) and the
    // network namespace it was admitted from; and back, for signals addressed to a name.
    struct PodConnection {
        std::string name;
        daemon::NamespaceId netns;
    };
    std::map<sd_bus *, PodConnection> pod_connections_;
    std::map<std::string, sd_bus *> pod_buses_;
    // A pod connection asks about binding `id` (any call or property on its object): if its
    // process held it before a restart and has not taken it back yet, the binding is held on
    // this connection from now on; if it ended meanwhile, this connection is told
    // (set_pod_reclaim). Another connection of the same process that never asks takes nothing.
    void take_back_on_touch(sd_bus *conn, const std::string &id);
    // Tells `conn` every end kept for the holder's old connection `old_name` (all of them: the
    // connection that asks about one binding of it is its successor).
    void tell_untold(sd_bus *conn, const std::string &old_name);
    std::chrono::seconds pod_reclaim_{30};
    std::optional<std::chrono::steady_clock::time_point> reclaim_until_;
    std::set<std::string> awaiting_; // the old pod connections of bindings taken back
    // Ends of awaited holders' bindings, told when the holder returns, even after the window
    // (at most one per binding taken back; dropped once the holder's process is gone).
    struct UntoldEnd {
        keys::Holder holder;
        std::string connection; // the holder's connection before the restart
        std::string id;
        bool revoked = false;
        std::string reason;
    };
    std::vector<UntoldEnd> untold_;
};

// Names a pod connection the way a bus names its connections, never like a bus's unique name
// (":1.42"), and unique across daemon starts (a binding taken back after a restart names a
// connection that is gone).
std::string pod_connection_name(std::uint64_t serial);
bool is_pod_connection_name(const std::string &name);

std::string binding_path(const std::string &id);

} // namespace knod::bus
