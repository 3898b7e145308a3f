// Whom a quota, a rate bucket or a per-user bound is counted for.
#pragma once

#include <sys/types.h>

#include <compare>
#include <string>

namespace knod::daemon {

// Whom the daemon counts a quota, a rate bucket or a per-user bound for: a uid in a domain
// (issue #51). "host" for a caller in the daemon's network namespace outside a registered pod
// (whatever pid, user or cgroup namespaces it made: its uid is the host's, and a new user
// namespace must not buy a fresh quota), "pod:SANDBOX" in a registered pod (a pod's uid 1000 is
// not the host's, nor another pod's), "unplaced" in any other network namespace: such a caller
// can be granted nothing, and a pod's process that made a network namespace of its own must not
// spend the host user's bounds (one extra bucket per uid at most: every unplaced caller of a uid
// shares it).
struct PrincipalKey {
    std::string domain;
    uid_t uid = 0;
    auto operator<=>(const PrincipalKey &) const = default;
    std::string to_string() const; // "uid 1000" on the host, "uid 1000 in pod:SANDBOX"
};
PrincipalKey principal_key(uid_t uid, const std::string &pod_sandbox, bool in_host_netns = true);

} // namespace knod::daemon
