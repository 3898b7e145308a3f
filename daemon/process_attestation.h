// What a caller's process can prove about itself beyond the pid the bus took at connect(2).
// dbus-daemon 1.14 (Debian 12) names a connection by that pid only, and a pid is recycled
// (docs/threat-model.md, "Known limits"). One end of a socketpair(2) carries the credentials of
// the process that made it, set by the kernel when socketpair() ran, wherever the fd travels
// afterwards (unix(7): SO_PEERCRED, SO_PEERGROUPS, SO_PEERPIDFD): an end the caller passes is
// proof that the process it names made it, and a pidfd for that very process. Accepted only
// when that process is alive at the pid the bus vouched for, so it proves that the process now
// at the bus's pid is the one that connected (not one that inherited the pid).
//
// Groundwork for issue #32 (AttestProcess on the bus); nothing calls it from the bus yet.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <sys/types.h>

#include <vector>

namespace knod::daemon {

struct AttestedProcess {
    UniqueFd pidfd;            // the maker's pidfd (SO_PEERPIDFD), O_CLOEXEC
    pid_t pid = 0;             // in the daemon's pid namespace
    uid_t uid = 0;             // effective uid when it made the pair (SO_PEERCRED)
    gid_t gid = 0;             // effective gid then
    std::vector<gid_t> groups; // supplementary groups then (SO_PEERGROUPS), sorted
};

// The pid of the process behind `pidfd` in the daemon's pid namespace, from
// /proc/self/fdinfo/FD's "Pid:" line. Errc::not_found once that process has exited (the kernel
// says -1), Errc::denied when it lies outside the namespace (0), Errc::unsupported when the
// kernel gives no such line.
Result<pid_t> pidfd_pid(int pidfd);

// `socket` as proof of its maker: Errc::denied naming what did not hold unless it is an AF_UNIX
// socket with both ends unnamed (a socketpair; an accepted or connected socket names a
// listener, and its peer credentials would be whichever process connected or listened), made by
// `bus_pid` running as `bus_uid`, and that process is still running. Errc::unsupported on a
// kernel without SO_PEERPIDFD (Linux < 6.5).
Result<AttestedProcess> attest_socketpair_end(int socket, uid_t bus_uid, pid_t bus_pid);

} // namespace knod::daemon
