#include "daemon/process_attestation.h"

#include "daemon/peer.h"
#include "host/caller_identity.h"
#include "knod/system_error.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>
#include <string_view>

namespace knod::daemon {
namespace {

// SO_PEERGROUPS answers ERANGE with the size it needs; no process has more than NGROUPS_MAX.
constexpr std::size_t max_groups = 65536;

// Whether this end (or, with `peer`, the other end) of a unix socket has no address: true of
// both ends of a socketpair only.
bool unnamed(int fd, bool peer) {
    sockaddr_un a{};
    socklen_t len = sizeof a;
    int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len)
                 : ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    return r == 0 && a.sun_family == AF_UNIX && len == sizeof(sa_family_t);
}

Result<std::vector<gid_t>> peer_groups(int fd) {
    std::vector<gid_t> groups(64);
    for (;;) {
        socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
            groups.resize(len / sizeof(gid_t));
            break;
        }
        // Only a larger size the kernel asked for is tried: the loop cannot go round for ever.
        if (errno != ERANGE || len / sizeof(gid_t) > max_groups ||
            len / sizeof(gid_t) <= groups.size())
            return system_error(Errc::denied, errno, "cannot read the socket's groups");
        groups.resize(len / sizeof(gid_t));
    }
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    return groups;
}

} // namespace

Result<pid_t> pidfd_pid(int pidfd) {
    std::string path = "/proc/self/fdinfo/" + std::to_string(pidfd);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return system_error(Errc::io, errno, "cannot read " + path);
    char buf[4096];
    ssize_t n;
    do {
        n = ::read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n < 0) return system_error(Errc::io, errno, "cannot read " + path);
    std::string_view info(buf, static_cast<std::size_t>(n));
    std::size_t at = info.find("\nPid:");
    if (at == std::string_view::npos)
        return make_error(Errc::unsupported, "the kernel does not say which process a pidfd is");
    std::string_view rest = info.substr(at + 5);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t'))
        rest.remove_prefix(1);
    long pid = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || end == rest.data())
        return make_error(Errc::corrupt, "unreadable Pid: line in " + path);
    if (pid == -1) return make_error(Errc::not_found, "the process has exited");
    if (pid <= 0)
        return make_error(Errc::denied, "the process is outside the daemon's pid namespace");
    return static_cast<pid_t>(pid);
}

Result<AttestedProcess> attest_socketpair_end(int socket, uid_t bus_uid, pid_t bus_pid) {
    int domain = 0;
    socklen_t len = sizeof domain;
    if (::getsockopt(socket, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
        return make_error(Errc::denied, "the attestation is not a unix socket");
    if (!unnamed(socket, false) || !unnamed(socket, true))
        return make_error(Errc::denied, "the attestation is not one end of a socketpair (a "
                                        "socket with an address names a listener, not its maker)");
    ucred cred{};
    len = sizeof cred;
    if (::getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return system_error(Errc::denied, errno, "cannot read the socket's credentials");
    if (cred.pid != bus_pid || cred.uid != bus_uid)
        return make_error(Errc::denied,
                          "the socketpair was made by process " + std::to_string(cred.pid) +
                              " (uid " + std::to_string(cred.uid) +
                              "), not by the caller (process " + std::to_string(bus_pid) +
                              ", uid " + std::to_string(bus_uid) + ")");
    AttestedProcess out;
    int pidfd = -1;
    len = sizeof pidfd;
    if (::getsockopt(socket, SOL_SOCKET, host::so_peerpidfd, &pidfd, &len) != 0) {
        if (errno == ENOPROTOOPT)
            return make_error(Errc::unsupported,
                              "this kernel has no SO_PEERPIDFD (Linux 6.5 or later has)");
        if (errno == ESRCH)
            return make_error(Errc::denied, "the process that made the socketpair has exited");
        return system_error(Errc::denied, errno, "cannot pin the socketpair's maker");
    }
    out.pidfd.reset(pidfd);
    // 6.16 and later give a pidfd of an exited maker (its Pid: is -1); earlier kernels ESRCH.
    auto pid = pidfd_pid(pidfd);
    if (!pid && pid.error().code == Errc::not_found)
        return make_error(Errc::denied, "the process that made the socketpair has exited");
    if (!pid) return pid.error();
    if (*pid != bus_pid || !still_running(pidfd))
        return make_error(Errc::denied, "the process that made the socketpair has exited");
    auto groups = peer_groups(socket);
    if (!groups) return groups.error();
    out.pid = *pid;
    out.uid = cred.uid;
    out.gid = cred.gid;
    out.groups = std::move(*groups);
    return out;
}

} // namespace knod::daemon
