// Who may do what. Any local user may request and release its own bindings; the auditor group
// reads everything; admin calls (revoke, reload) need root, the policy's admin group, or the
// polkit action org.knod.policy1.manage. Polkit unreachable means denied. A group setting names
// a group (resolved through NSS) or, when no group has that name, a numeric gid; the caller is
// in it when its process holds that gid.
#pragma once

#include "policy/policy.h"

#include <sys/types.h>
#include <systemd/sd-bus.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace knod::bus {

// Who is on the other end of a connection. `gids` are the process's (effective and
// supplementary: see daemon/peer.h), never the user database's.
struct Credentials {
    uid_t uid = 0;
    pid_t pid = 0;
    std::vector<gid_t> gids;
    std::string sender;
    std::optional<std::vector<gid_t>> bus_gids; // UnixGroupIDs, when the bus sent them
};

class Authorizer {
  public:
    explicit Authorizer(sd_bus *bus) : bus_(bus) {}

    bool is_auditor(const Credentials &c, const policy::Settings &s) const;
    // Calls `done` with the answer: at once for root and the admin group, otherwise when
    // polkit answers (asynchronously: the daemon serves others meanwhile; no answer within
    // 5 s, or no polkit on the bus, means no).
    void check_admin(const Credentials &c, const policy::Settings &s,
                     std::function<void(bool)> done) const;

  private:
    bool in_group(const Credentials &c, const std::string &group) const;
    void ask_polkit(const std::string &sender, std::function<void(bool)> done) const;
    sd_bus *bus_;
};

} // namespace knod::bus
