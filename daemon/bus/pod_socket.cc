#include "daemon/bus/pod_socket.h"

#include "daemon/bus/guard.h"
#include "daemon/peer.h"
#include "daemon/process_attestation.h"
#include "host/caller_identity.h"
#include "knod/system_error.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <systemd/sd-id128.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

namespace knod::bus {
namespace {

void log(const std::string &line) {
    std::cerr << "knod-policyd: pod socket: " << line << std::endl;
}

Result<sockaddr_un> address_of(const std::string &path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof a.sun_path)
        return make_error(Errc::invalid_argument, "--pod-socket: a path of 1 to " +
                                                      std::to_string(sizeof a.sun_path - 1) +
                                                      " bytes");
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    return a;
}

// A socket file at `path` that nobody answers on is an earlier daemon's: removed. One that
// answers is another daemon's, which this one must not take over.
Result<void> clear_stale(const std::string &path, const sockaddr_un &a) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0)
        return errno == ENOENT ? Result<void>{}
                               : system_error(Errc::io, errno, "--pod-socket: cannot stat " + path);
    if (!S_ISSOCK(st.st_mode))
        return make_error(Errc::invalid_argument,
                          "--pod-socket: " + path + " exists and is not a socket");
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        ::connect(probe.get(), reinterpret_cast<const sockaddr *>(&a), sizeof a) == 0)
        return make_error(Errc::unavailable,
                          "--pod-socket: another daemon serves " + path + "; stop it first");
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        return system_error(Errc::io, errno, "--pod-socket: cannot replace " + path);
    return {};
}

int pidfd_open(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

} // namespace

Result<std::unique_ptr<PodSocket>> PodSocket::listen(const std::string &path, sd_event *event,
                                                     BusService &service, PodSocketLimits limits) {
    auto a = address_of(path);
    if (!a) return a.error();
    if (auto r = clear_stale(path, *a); !r) return r.error();
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return system_error(Errc::io, errno, "--pod-socket: socket");
    if (::bind(fd.get(), reinterpret_cast<const sockaddr *>(&*a), sizeof *a) != 0)
        return system_error(Errc::io, errno, "--pod-socket: cannot bind " + path);
    // Anyone may connect: whether a connection is served is decided by its network namespace
    // (a pod's directory holds the socket; a host user would only be refused).
    if (::chmod(path.c_str(), 0666) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
        int e = errno;
        ::unlink(path.c_str());
        return system_error(Errc::io, e, "--pod-socket: cannot listen on " + path);
    }
    std::unique_ptr<PodSocket> s(new PodSocket(std::move(fd), path, event, service, limits));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        s->dev_ = st.st_dev;
        s->ino_ = st.st_ino;
    }
    sd_event_source *src = nullptr;
    int r = sd_event_add_io(event, &src, s->listener_.get(), EPOLLIN, on_accept, s.get());
    s->accept_source_.reset(src);
    if (r >= 0) {
        src = nullptr;
        r = sd_event_add_defer(event, &src, on_close_later, s.get());
        s->closer_.reset(src);
        if (r >= 0) r = sd_event_source_set_enabled(src, SD_EVENT_OFF);
    }
    if (r < 0) return make_error(Errc::io, std::string("--pod-socket: ") + std::strerror(-r));
    return s;
}

PodSocket::PodSocket(UniqueFd listener, std::string path, sd_event *event, BusService &service,
                     PodSocketLimits limits)
    : listener_(std::move(listener)), path_(std::move(path)), event_(event), service_(service),
      limits_(limits) {}

PodSocket::~PodSocket() {
    // The daemon is stopping: its bindings end (or are handed off) as the stop decides, not
    // as disconnects; nothing more is sent on these connections.
    for (auto &[name, conn] : conns_)
        service_.pod_connection_detached(name);
    conns_.clear();
    struct stat st {};
    if (ino_ && ::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
        ::unlink(path_.c_str());
}

int PodSocket::on_accept(sd_event_source *, int, uint32_t, void *self) {
    return guarded("pod socket accept", nullptr, [&]() -> int {
        auto *s = static_cast<PodSocket *>(self);
        // One connection per wake-up: each is identified (a few /proc reads) before the next,
        // and the loop serves the calls in between.
        int fd = ::accept4(s->listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                // Level-triggered: waiting is the only way not to spin; 100 ms, then again.
                log(std::string("accept: ") + std::strerror(errno) + "; pausing 100 ms");
                sd_event_source_set_enabled(s->accept_source_.get(), SD_EVENT_OFF);
                std::uint64_t now = 0;
                sd_event_now(s->event_, CLOCK_MONOTONIC, &now);
                sd_event_source *src = nullptr;
                if (sd_event_add_time(s->event_, &src, CLOCK_MONOTONIC, now + 100'000, 10'000,
                                      on_resume, s) >= 0)
                    s->resume_.reset(src);
                else
                    sd_event_source_set_enabled(s->accept_source_.get(), SD_EVENT_ON);
            }
            return 0;
        }
        if (auto r = s->serve(UniqueFd(fd)); !r) log("refused a connection: " + r.error().message);
        return 0;
    });
}

int PodSocket::on_resume(sd_event_source *, uint64_t, void *self) {
    auto *s = static_cast<PodSocket *>(self);
    sd_event_source_set_enabled(s->accept_source_.get(), SD_EVENT_ON);
    return 0;
}

Result<void> PodSocket::serve(UniqueFd fd) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0)
        return system_error(Errc::denied, errno, "no peer credentials");
    // The kernel's pidfd of the very process that connected (Linux 6.5); without it the caller
    // is known by its pid only (BusService::admit_pod_caller).
    std::shared_ptr<UniqueFd> proof;
    int pidfd = -1;
    len = sizeof pidfd;
    if (::getsockopt(fd.get(), SOL_SOCKET, host::so_peerpidfd, &pidfd, &len) == 0) {
        proof = std::make_shared<UniqueFd>(pidfd);
        auto at = daemon::pidfd_pid(pidfd);
        if (!at || *at != cred.pid)
            return make_error(Errc::denied, "the process that connected has exited");
    } else if (errno == ESRCH) {
        return make_error(Errc::denied, "the process that connected has exited");
    }
    std::string name = pod_connection_name(++serial_);
    auto caller = service_.admit_pod_caller(cred.uid, cred.pid, proof, name);
    if (!caller) return caller.error();
    std::string why;
    auto mine = per_sandbox_.find(caller->pod_sandbox);
    if (mine != per_sandbox_.end() && mine->second >= limits_.per_sandbox)
        why = "at most " + std::to_string(limits_.per_sandbox) +
              " connections per pod on the pod socket; close connections you no longer use";
    else if (conns_.size() >= limits_.total)
        why = "at most " + std::to_string(limits_.total) +
              " connections on the pod socket in all; retry later";
    if (!why.empty()) return service_.refuse_pod_limit(*caller, why);

    auto conn = std::make_unique<Connection>();
    conn->owner = this;
    conn->name = name;
    conn->sandbox = caller->pod_sandbox;
    conn->maker = proof;
    if (!conn->maker) {
        // Only to notice the exit (never as proof): the pid may have changed hands already.
        int watch = pidfd_open(cred.pid);
        if (watch >= 0) conn->maker = std::make_shared<UniqueFd>(watch);
    }
    sd_bus *raw = nullptr;
    int r = sd_bus_new(&raw);
    conn->bus.reset(raw);
    sd_id128_t id{};
    if (r >= 0) r = sd_id128_randomize(&id);
    if (r >= 0) r = sd_bus_set_fd(raw, fd.get(), fd.get());
    if (r >= 0) (void)fd.release(); // the bus's now
    if (r >= 0) r = sd_bus_set_server(raw, 1, id);
    // The SASL handshake identifies nobody here: the caller was identified at accept, from
    // SO_PEERCRED and its pidfd. EXTERNAL's own uid check compares the uid a client names in its
    // namespace with the one the kernel maps it to, and so shuts out every pod in a user
    // namespace of its own (hostUsers: false, rootless podman); anonymous accepts any handshake.
    if (r >= 0) r = sd_bus_set_anonymous(raw, 1);
    if (r >= 0) r = sd_bus_negotiate_fds(raw, 1); // regions, notifiers and proofs are fds
    sd_bus_slot *slot = nullptr;
    // No bus driver to add a match to: the rule is sd-bus's own, for its Disconnected.
    if (r >= 0)
        r = sd_bus_match_signal(raw, &slot, nullptr, "/org/freedesktop/DBus/Local",
                                "org.freedesktop.DBus.Local", "Disconnected", on_disconnected,
                                conn.get());
    conn->disconnected.reset(slot);
    if (r >= 0) r = sd_bus_start(raw);
    if (r >= 0) r = sd_bus_attach_event(raw, event_, SD_EVENT_PRIORITY_NORMAL);
    if (r >= 0 && conn->maker) {
        sd_event_source *src = nullptr;
        r = sd_event_add_io(event_, &src, conn->maker->get(), EPOLLIN, on_maker_exit, conn.get());
        conn->maker_exit.reset(src);
    }
    if (r < 0) return make_error(Errc::io, std::string("cannot serve it: ") + std::strerror(-r));
    auto objects = service_.serve_pod_connection(raw, *caller);
    if (!objects) return objects.error();
    conn->objects = std::move(*objects);
    per_sandbox_[conn->sandbox] += 1;
    conns_.emplace(name, std::move(conn));
    return {};
}

int PodSocket::on_disconnected(sd_bus_message *, void *c, sd_bus_error *) {
    auto *conn = static_cast<Connection *>(c);
    conn->owner->close_later(conn->name);
    return 0;
}

int PodSocket::on_maker_exit(sd_event_source *src, int, uint32_t, void *c) {
    auto *conn = static_cast<Connection *>(c);
    sd_event_source_set_enabled(src, SD_EVENT_OFF); // readable for good from now on
    conn->owner->close_later(conn->name);
    return 0;
}

void PodSocket::close_later(const std::string &name) {
    closing_.insert(name);
    sd_event_source_set_enabled(closer_.get(), SD_EVENT_ONESHOT);
}

int PodSocket::on_close_later(sd_event_source *, void *self) {
    return guarded("pod socket close", nullptr, [&]() -> int {
        auto *s = static_cast<PodSocket *>(self);
        std::set<std::string> names;
        names.swap(s->closing_);
        for (auto &name : names) {
            auto it = s->conns_.find(name);
            if (it == s->conns_.end()) continue;
            if (auto n = s->per_sandbox_.find(it->second->sandbox);
                n != s->per_sandbox_.end() && --n->second == 0)
                s->per_sandbox_.erase(n);
            // Forgotten first, so that the ends of its bindings are sent to no one.
            s->service_.pod_connection_closed(name);
            s->conns_.erase(it);
        }
        return 0;
    });
}

} // namespace knod::bus
