#include "daemon/fd_store.h"

#include <nlohmann/json.hpp>
#include <systemd/sd-daemon.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>

namespace knod::daemon {
namespace {

// Process-wide, as the notify socket is; read by the bus handlers' reports on the same loop, but
// guarded anyway (a report may be built elsewhere one day).
std::mutex stats_mu;
NotifyStats stats;
std::chrono::steady_clock::time_point last_said{};
bool said_failing = false; // the state stderr last heard of

enum class Sent { kept, not_kept, remove_failed, other_failed };

// Counts one message's fate and says a change on stderr (the journal's view of the daemon):
// the first refusal after a success, the first success after refusals, each at most once per
// 10 s, so a socket that fills and drains all the time writes a line per 10 s, not per message.
void account(Sent what, const std::string &error) {
    std::lock_guard lock(stats_mu);
    bool failed = what != Sent::kept && !error.empty();
    switch (what) {
    case Sent::kept:
        ++stats.kept;
        break;
    case Sent::not_kept:
        ++stats.not_kept;
        break;
    case Sent::remove_failed:
        ++stats.remove_failed;
        break;
    case Sent::other_failed:
        ++stats.other_failed;
        break;
    }
    if (failed) stats.last_error = error;
    stats.failing = failed;
    if (failed == said_failing) return;
    auto now = std::chrono::steady_clock::now();
    if (last_said != std::chrono::steady_clock::time_point{} &&
        now - last_said < std::chrono::seconds(10))
        return;
    last_said = now;
    said_failing = failed;
    if (failed)
        std::cerr << "knod-policyd: " << error
                  << " (systemd is not reading its notify socket; bindings whose handles are not "
                     "kept end at the next stop, as without systemd)"
                  << std::endl;
    else
        std::cerr << "knod-policyd: systemd's notify socket takes messages again; "
                  << stats.not_kept << " binding handle(s) were not kept, " << stats.remove_failed
                  << " removal(s) not sent" << std::endl;
}

} // namespace

NotifyStats notify_stats() {
    std::lock_guard lock(stats_mu);
    return stats;
}

nlohmann::json fd_store_json() {
    NotifyStats st = notify_stats();
    return {{"enabled", st.enabled},           {"kept", st.kept},
            {"not_kept", st.not_kept},         {"remove_failed", st.remove_failed},
            {"other_failed", st.other_failed}, {"failing", st.failing},
            {"last_error", st.last_error}};
}

Result<void> notify_nowait(const std::string &msg, const int *fds, std::size_t n) {
    const char *e = std::getenv("NOTIFY_SOCKET");
    if (!e || !*e) return make_error(Errc::unavailable, "NOTIFY_SOCKET is not set");
    std::string path = e;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    // A path, or '@' for an abstract name (sd_notify's two AF_UNIX forms); systemd's vsock form
    // is not one a host daemon gets.
    if ((path[0] != '/' && path[0] != '@') || path.size() + (path[0] == '/') > sizeof sa.sun_path)
        return make_error(Errc::unavailable, "NOTIFY_SOCKET is not an AF_UNIX address");
    std::memcpy(sa.sun_path, path.data(), path.size());
    if (path[0] == '@') sa.sun_path[0] = '\0';
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() +
                                           (path[0] == '/' ? 1 : 0));
    UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock.valid()) return make_error(Errc::io, std::string("socket: ") + std::strerror(errno));
    iovec iov{const_cast<char *>(msg.data()), msg.size()};
    msghdr m{};
    m.msg_name = &sa;
    m.msg_namelen = len;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    std::vector<char> control;
    if (n > 0) {
        control.assign(CMSG_SPACE(sizeof(int) * n), 0);
        m.msg_control = control.data();
        m.msg_controllen = control.size();
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n);
        std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    }
    // MSG_DONTWAIT: a full queue (net.unix.max_dgram_qlen datagrams PID 1 has not read) is
    // EAGAIN now, never a wait on the loop.
    if (::sendmsg(sock.get(), &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        int err = errno;
        return make_error(Errc::unavailable, std::string("systemd's notify socket: ") +
                                                 (err == EAGAIN ? "full (PID 1 is not reading it)"
                                                                : std::strerror(err)));
    }
    return {};
}

void watchdog_tick(std::uint64_t now_us) {
    static std::uint64_t interval = [] {
        std::uint64_t usec = 0;
        // unset_environment: children never inherit it; WATCHDOG_PID is checked.
        return sd_watchdog_enabled(1, &usec) > 0 ? usec / 2 : 0;
    }();
    static std::uint64_t last = 0;
    if (interval == 0 || (last != 0 && now_us - last < interval)) return;
    last = now_us;
    if (auto r = notify_nowait("WATCHDOG=1"); !r) account(Sent::other_failed, r.error().message);
}

bool valid_fd_name(const std::string &name) {
    if (name.empty() || name.size() > 255) return false;
    for (char c : name)
        // systemd's rule for FDNAME, less ':' (it separates LISTEN_FDNAMES).
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'))
            return false;
    return true;
}

bool FdStore::available() {
    const char *s = std::getenv("NOTIFY_SOCKET");
    return s && *s;
}

FdStore FdStore::from_environment(bool enabled) {
    FdStore store;
    store.enabled_ = enabled && available();
    {
        std::lock_guard lock(stats_mu);
        stats.enabled = store.enabled_;
    }
    char **names = nullptr;
    // LISTEN_PID must name this process; unset_environment: children never inherit them.
    int n = sd_listen_fds_with_names(1, &names);
    for (int i = 0; i < n; ++i) {
        int fd = SD_LISTEN_FDS_START + i;
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        std::string name = names && names[i] ? names[i] : "unknown";
        store.received_.emplace(name, UniqueFd(fd));
    }
    if (names) {
        for (int i = 0; i < n; ++i)
            std::free(names[i]);
        std::free(names);
    }
    return store;
}

FdStore::~FdStore() = default;

bool FdStore::store(const std::string &name, int fd) {
    if (!enabled_ || fd < 0 || !valid_fd_name(name)) return false;
    // FDPOLL=0: systemd must not drop a stored netlink socket because it polls POLLERR (an
    // overrun); the binding's life is ours to end, with FDSTOREREMOVE.
    std::string msg = "FDSTORE=1\nFDPOLL=0\nFDNAME=" + name;
    if (auto r = notify_nowait(msg, &fd, 1); !r) {
        last_error_ = "cannot store " + name + " with systemd (not kept): " + r.error().message;
        account(Sent::not_kept, last_error_);
        return false;
    }
    account(Sent::kept, {});
    taken_.erase(name);
    return true;
}

void FdStore::remove(const std::string &name) {
    if (!available() || !valid_fd_name(name)) return;
    std::string msg = "FDSTOREREMOVE=1\nFDNAME=" + name;
    // Best effort: an fd left behind is handed back at the next start, where no binding takes
    // it and discard_untaken() removes it.
    if (auto r = notify_nowait(msg); !r) {
        last_error_ = "cannot remove " + name + " from systemd's store: " + r.error().message;
        account(Sent::remove_failed, last_error_);
    }
}

std::optional<UniqueFd> FdStore::take(const std::string &name) {
    auto it = received_.find(name);
    if (it == received_.end()) return std::nullopt;
    UniqueFd fd = std::move(it->second);
    received_.erase(it);
    taken_.insert(name);
    return fd;
}

std::size_t FdStore::discard_untaken() {
    std::set<std::string> names = std::move(taken_);
    taken_.clear();
    for (auto &[name, fd] : received_)
        names.insert(name);
    for (auto &name : names)
        remove(name); // every fd of that name
    received_.clear();
    return names.size();
}

} // namespace knod::daemon
