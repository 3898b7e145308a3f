#include "daemon/bus/authorizer.h"

#include "daemon/bus/bus_ptr.h"
#include "daemon/bus/names.h"

#include <grp.h>

#include <algorithm>

namespace knod::bus {

bool Authorizer::in_group(const Credentials &c, const std::string &group) const {
    if (group.empty()) return false;
    struct group *gr = getgrnam(group.c_str());
    if (!gr) return false;
    return std::find(c.gids.begin(), c.gids.end(), gr->gr_gid) != c.gids.end();
}

bool Authorizer::is_auditor(const Credentials &c, const policy::Settings &s) const {
    return c.uid == 0 || in_group(c, s.admin_group) || in_group(c, s.auditor_group);
}

bool Authorizer::is_admin(const Credentials &c, const policy::Settings &s) const {
    if (c.uid == 0 || in_group(c, s.admin_group)) return true;
    return polkit_allows(c.sender);
}

bool Authorizer::polkit_allows(const std::string &sender) const {
    sd_bus_message *raw = nullptr;
    if (sd_bus_message_new_method_call(
            bus_, &raw, "org.freedesktop.PolicyKit1", "/org/freedesktop/PolicyKit1/Authority",
            "org.freedesktop.PolicyKit1.Authority", "CheckAuthorization") < 0)
        return false;
    MessagePtr call(raw);
    // Subject: the caller's bus name, which polkit resolves through the bus itself.
    if (sd_bus_message_append(call.get(), "(sa{sv})sa{ss}us", "system-bus-name", 1, "name", "s",
                              sender.c_str(), manage_action, 0, 0u, "") < 0)
        return false;
    BusError error;
    sd_bus_message *reply_raw = nullptr;
    if (sd_bus_call(bus_, call.get(), 2'000'000, error.get(), &reply_raw) < 0) return false;
    MessagePtr reply(reply_raw);
    int authorized = 0, challenge = 0;
    if (sd_bus_message_enter_container(reply.get(), 'r', "bba{ss}") < 0 ||
        sd_bus_message_read(reply.get(), "bb", &authorized, &challenge) < 0)
        return false;
    return authorized != 0;
}

} // namespace knod::bus
