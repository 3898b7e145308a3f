#include "host/caller_identity.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace knod::host {

bool kernel_has_peer_pidfd() {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return false;
    int pidfd = -1;
    socklen_t len = sizeof pidfd;
    bool ok = ::getsockopt(pair[0], SOL_SOCKET, so_peerpidfd, &pidfd, &len) == 0;
    if (ok) ::close(pidfd);
    ::close(pair[0]);
    ::close(pair[1]);
    return ok;
}

HostCheck caller_identity_check(bool kernel_peer_pidfd, std::optional<bool> bus_sends_pidfd) {
    HostCheck c;
    c.id = "caller.identity";
    c.subject = "host";
    const char *rules = "rules naming units, user_units, cgroups or executables";
    if (bus_sends_pidfd.value_or(false)) {
        c.status = CheckStatus::pass;
        c.message = std::string("bus-pidfd: the bus sends each caller's pidfd (ProcessFD); ") +
                    rules + " can grant every caller";
    } else if (kernel_peer_pidfd) {
        c.status = CheckStatus::pass;
        c.message = std::string(bus_sends_pidfd ? "attested: the bus sends no ProcessFD"
                                                : "attested: the bus could not be asked") +
                    "; callers that use the client library prove their process "
                    "(AttestProcess, SO_PEERPIDFD); " +
                    rules + " never grant a caller that speaks D-Bus without it";
    } else {
        c.status = CheckStatus::warn;
        c.message = std::string("pid-only: this kernel has no SO_PEERPIDFD, so no caller's "
                                "process can be proven; ") +
                    rules + " never grant anything here";
        c.fix = "run Linux 6.5 or later (and, for every caller, dbus-broker >= 34 or dbus-daemon "
                ">= 1.15.8), or write those rules with users and groups";
    }
    return c;
}

} // namespace knod::host
