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

class BusService : public daemon::BindingEvents {
  public:
    explicit BusService(sd_bus *bus);
    ~BusService() override;

    // Registers the objects and takes the well-known name.
    Result<void> start(daemon::BindingManager &manager);

    void binding_created(const daemon::Binding &b) override;
    void binding_ended(const daemon::Binding &b, daemon::EndReason why,
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
    static int connection_left(sd_bus_track *track, void *self);
    static int name_has_owner(sd_bus_message *reply, void *check, sd_bus_error *err);

  private:
    Result<Credentials> credentials(sd_bus_message *m) const;
    Result<daemon::Peer> peer(sd_bus_message *m) const;
    // RequestBinding refused before the core had it (argument sizes, an unidentifiable caller):
    // journaled through the core with whatever identifies the caller.
    void journal_refused_request(sd_bus_message *m, const daemon::RequestArgs &args,
                                 const Error &why) const;
    // The per-uid rate limit for methods the core does not see (RequestBinding and Activate
    // are limited there).
    Result<void> throttle(sd_bus_message *m, const char *method) const;
    // May the sender of the message being handled see this binding?
    bool visible(const daemon::Binding &b) const;
    const daemon::Binding *binding_at(const char *path) const;
    // The ObjectManager's InterfacesAdded arguments for a binding, as GetManagedObjects shows it.
    int append_interfaces_added(sd_bus_message *m, const daemon::Binding &b);

    // Signals about a binding go only to the connections that may list it: the one that
    // requested it, and subscribers (Subscribe) of the owner's uid, auditors and admins.
    std::set<std::string> entitled(const daemon::Binding &b);
    void signal_about(const daemon::Binding &b, const SignalName &name, const SignalBody &body);
    void emit_state_changed(const daemon::Binding &b);

    sd_bus *bus_;
    Authorizer authorizer_;
    daemon::BindingManager *manager_ = nullptr;
    // The binding whose InterfacesAdded is being built: its getters skip the visibility check
    // (the signal goes only to those entitled to it).
    const daemon::Binding *emitting_ = nullptr;
    std::vector<SlotPtr> slots_;
    // What the bus vouched for, per connection: a unique name is never reused and its uid and
    // pid never change, so one GetConnectionCredentials round trip per connection is enough.
    // Dropped when the connection goes.
    mutable std::map<std::string, Credentials> creds_cache_;
    // Every connection that called us, watched by sd-bus (sd_bus_track, as systemd's services
    // do): when it leaves, its cached credentials, its subscription and its bindings go.
    void track(const std::string &name) const;
    mutable std::map<std::string, TrackPtr> tracks_;
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
