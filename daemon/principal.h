// Whom a quota, a rate bucket or a per-user bound is counted for.
#pragma once

#include <sys/types.h>

#include <compare>
#include <string>

namespace knod::daemon {

// Whom the daemon counts a quota, a rate bucket or a per-user bound for: a uid in a domain
// (issue #51). "host" for every caller outside a registered pod (whatever namespaces it made:
// its uid is the host's, and a new user namespace must not buy a fresh quota), "pod:SANDBOX"
// in a registered pod (a pod's uid 1000 is not the host's, nor another pod's).
struct PrincipalKey {
    std::string domain;
    uid_t uid = 0;
    auto operator<=>(const PrincipalKey &) const = default;
    std::string to_string() const; // "uid 1000" on the host, "uid 1000 in pod:SANDBOX"
};
PrincipalKey principal_key(uid_t uid, const std::string &pod_sandbox);

} // namespace knod::daemon
