#include "daemon/fd_store.h"

#include <systemd/sd-daemon.h>

#include <fcntl.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace knod::daemon {

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
    int r = sd_pid_notify_with_fds(0, 0, msg.c_str(), &fd, 1);
    if (r > 0) {
        taken_.erase(name);
        return true;
    }
    last_error_ = "cannot store " + name + " with systemd: " +
                  (r == 0 ? std::string("NOTIFY_SOCKET is not set") : std::strerror(-r));
    return false;
}

void FdStore::remove(const std::string &name) {
    if (!available() || !valid_fd_name(name)) return;
    std::string msg = "FDSTOREREMOVE=1\nFDNAME=" + name;
    if (int r = sd_pid_notify(0, 0, msg.c_str()); r <= 0)
        last_error_ = "cannot remove " + name + " from systemd's store: " + std::strerror(-r);
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
