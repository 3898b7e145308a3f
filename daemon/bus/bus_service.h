// The D-Bus adaptor of knod-policyd: one vtable per interface. Handlers unpack arguments, ask
// the bus who is calling, check privilege, and call the BindingManager; no policy logic here.
#pragma once

#include "daemon/binding_manager.h"
#include "daemon/bus/authorizer.h"
#include "daemon/bus/bus_ptr.h"
#include "daemon/bus/unicast.h"

#include <functional>
#include <map>
#include <set>

namespace knod::bus {

// Loads the policy afresh for a reload; an invalid policy comes back as an error.
using PolicyLoader = std::function<Result<policy::Policy>()>;

class BusService : public daemon::BindingEvents {
  public:
    BusService(sd_bus *bus, sd_event *event, PolicyLoader loader);
    ~BusService() override;

    // Registers the objects and takes the well-known name.
    Result<void> start(daemon::BindingManager &manager);
    // Reload on SIGHUP: same path as the method, attributed to the signal's sender (`by`);
    // `via` says how it was asked. A policy that does not load is journaled as refused.
    Result<std::size_t> reload(const daemon::Peer &by, const std::string &via);

    void binding_created(const daemon::Binding &b) override;
    void binding_ended(const daemon::Binding &b, const std::string &why,
                       const std::string &note) override;
    void policy_reloaded(std::size_t rules, std::size_t revoked) override;
    void binding_adopted(const daemon::Binding &b) override;
    // After a restart took bindings back: a holder whose bus connection closed meanwhile (the
    // bus's NameOwnerChanged went to nobody) loses its bindings as on a disconnect.
    void check_connections();

    // sd-bus callbacks; public only so the vtables in bus_service.cc can name them.
    static int request_binding(sd_bus_message *m, void *self, sd_bus_error *err);
    static int list_bindings(sd_bus_message *m, void *self, sd_bus_error *err);
    static int revoke_binding(sd_bus_message *m, void *self, sd_bus_error *err);
    static int reload_policy(sd_bus_message *m, void *self, sd_bus_error *err);
    static int host_report(sd_bus_message *m, void *self, sd_bus_error *err);
    static int subscribe(sd_bus_message *m, void *self, sd_bus_error *err);
    static int activate(sd_bus_message *m, void *self, sd_bus_error *err);
    static int renew(sd_bus_message *m, void *self, sd_bus_error *err);
    static int rx_notifier(sd_bus_message *m, void *self, sd_bus_error *err);
    static int release(sd_bus_message *m, void *self, sd_bus_error *err);
    static int manager_property(sd_bus *bus, const char *path, const char *interface,
                                const char *property, sd_bus_message *reply, void *self,
                                sd_bus_error *err);
    static int binding_property(sd_bus *bus, const char *path, const char *interface,
                                const char *property, sd_bus_message *reply, void *self,
                                sd_bus_error *err);
    static int find_binding(sd_bus *bus, const char *path, const char *interface, void *self,
                            void **found, sd_bus_error *err);
    static int enumerate_bindings(sd_bus *bus, const char *prefix, void *self, char ***nodes,
                                  sd_bus_error *err);
    static int name_owner_changed(sd_bus_message *m, void *self, sd_bus_error *err);
    static int holder_exited(sd_event_source *s, int fd, uint32_t revents, void *self);

  private:
    void watch_holder(const daemon::Binding &b);
    Result<Credentials> credentials(sd_bus_message *m) const;
    Result<daemon::Peer> peer(sd_bus_message *m) const;
    // The per-uid rate limit for methods the core does not see (RequestBinding and Activate
    // are limited there).
    Result<void> throttle(sd_bus_message *m, const char *method) const;
    // May the sender of the message being handled see this binding?
    bool visible(const daemon::Binding &b) const;
    const daemon::Binding *binding_at(const char *path) const;
    // One property of a binding, as Get and InterfacesAdded carry it (no visibility check).
    int append_property(sd_bus_message *reply, const daemon::Binding &b,
                        const std::string &property) const;
    // The ObjectManager's InterfacesAdded arguments for a binding, as GetManagedObjects shows it.
    int append_interfaces_added(sd_bus_message *m, const daemon::Binding &b) const;

    // Signals about a binding go only to the connections that may list it: the one that
    // requested it, and subscribers (Subscribe) of the owner's uid, auditors and admins.
    std::set<std::string> entitled(const daemon::Binding &b);
    void signal_about(const daemon::Binding &b, const SignalName &name, const SignalBody &body);
    void emit_state_changed(const daemon::Binding &b);

    sd_bus *bus_;
    sd_event *event_;
    PolicyLoader loader_;
    Authorizer authorizer_;
    daemon::BindingManager *manager_ = nullptr;
    std::vector<SlotPtr> slots_;
    // One pidfd watch per holder process (pid and start time), however many bindings it holds:
    // a process with 10,000 bindings costs one fd here, not 10,000.
    struct HolderWatch {
        SourcePtr source;
        std::shared_ptr<UniqueFd> pidfd;
        std::set<std::string> bindings;
    };
    std::map<std::pair<pid_t, std::uint64_t>, HolderWatch> holders_;
    // What the bus vouched for, per connection: a unique name is never reused and its uid and
    // pid never change, so one GetConnectionCredentials round trip per connection is enough.
    // Dropped when the connection goes.
    mutable std::map<std::string, Credentials> creds_cache_;
    // Connections that called Subscribe, by unique name; dropped when the connection goes.
    // Whether one sees every binding is decided once per admin/auditor group setting, so that a
    // signal costs no user-database lookups however many subscribers there are.
    struct Subscriber {
        Credentials creds;
        std::string groups; // the admin and auditor groups `sees_all` was decided under
        bool sees_all = false;
    };
    std::map<std::string, Subscriber> subscribers_;
};

std::string binding_path(const std::string &id);

} // namespace knod::bus
