#include "daemon/peer.h"
#include "knod/system_error.h"

#include "policy/cgroup_unit.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>

namespace knod::daemon {
namespace {

int pidfd_open(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
// One read(2) loop into a string: /proc files are small and generated on read, so a stream
// (ifstream into a stringstream) was most of identify_peer's instructions (callgrind).
std::string read_file(const std::string &path) {
    std::string out;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return out;
    char buf[4096];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > (1u << 20)) break; // no /proc file we read is this long
    }
    ::close(fd);
    return out;
}

// The numbers after "Key:" on the line of /proc/PID/status that starts with it (as `>>` reads
// them: whitespace-separated, up to the first thing that is not a number).
std::optional<std::vector<unsigned long>> status_numbers(std::string_view status,
                                                         std::string_view key) {
    std::size_t at = 0;
    while (at <= status.size()) {
        std::size_t end = status.find('\n', at);
        if (end == std::string_view::npos) end = status.size();
        std::string_view line = status.substr(at, end - at);
        at = end + 1;
        if (!line.starts_with(key)) continue;
        std::vector<unsigned long> out;
        const char *p = line.data() + key.size(), *stop = line.data() + line.size();
        for (;;) {
            while (p < stop && (*p == ' ' || *p == '\t'))
                ++p;
            unsigned long v = 0;
            auto [next, ec] = std::from_chars(p, stop, v);
            if (ec != std::errc() || next == p) break;
            out.push_back(v);
            p = next;
        }
        return out;
    }
    return std::nullopt;
}

// The effective uid from /proc/PID/status ("Uid: real effective saved fs").
std::optional<uid_t> effective_uid(const std::string &status) {
    auto uids = status_numbers(status, "Uid:");
    if (!uids || uids->size() < 2) return std::nullopt;
    return static_cast<uid_t>((*uids)[1]);
}

// The namespace at a /proc/.../ns/NAME path, by device and inode.
std::optional<NamespaceId> namespace_at(const std::string &path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return NamespaceId{st.st_dev, st.st_ino};
}

// The kinds whose difference makes a process contained (a container's): a pid namespace hides
// the host's processes from it, a user namespace maps its root elsewhere, a cgroup namespace
// roots its view of the hierarchy. Read once: the daemon's own do not change.
constexpr const char *contained_kinds[] = {"pid", "user", "cgroup"};

const std::vector<std::optional<NamespaceId>> &own_namespaces() {
    static const std::vector<std::optional<NamespaceId>> own = [] {
        std::vector<std::optional<NamespaceId>> v;
        for (const char *kind : contained_kinds)
            v.push_back(namespace_at(std::string("/proc/self/ns/") + kind));
        return v;
    }();
    return own;
}

} // namespace

bool Peer::root_in_host() const {
    return uid == 0 && host_namespaces && pod_sandbox.empty();
}

bool Peer::host_root() const {
    return root_in_host() && process_proof != ProcessProof::pid_only;
}

std::string Peer::domain() const {
    if (!pod_sandbox.empty()) return (pod ? "pod:" : "unproven-pod:") + pod_sandbox;
    if (host_namespaces) return "host";
    return "ns:" + namespaces;
}

Result<std::uint64_t> process_start_time(pid_t pid, const std::string &proc_root) {
    errno = 0;
    std::string stat = read_file(proc_root + "/" + std::to_string(pid) + "/stat");
    if (stat.empty() && exhausted_resource(errno))
        return system_error(Errc::io, errno, "cannot read /proc/" + std::to_string(pid) + "/stat");
    // The command name (field 2) may hold spaces and parentheses: parse after the last ')'.
    auto close = stat.rfind(')');
    if (stat.empty() || close == std::string::npos)
        return make_error(Errc::not_found, "process " + std::to_string(pid) + " is gone");
    // Field 3 is the first after ") "; the start time is field 22: skip 19 fields.
    std::string_view rest = std::string_view(stat).substr(std::min(stat.size(), close + 2));
    auto skip_spaces = [&] {
        while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n'))
            rest.remove_prefix(1);
    };
    for (int i = 3; i < 22; ++i) {
        skip_spaces();
        rest.remove_prefix(std::min(rest.size(), rest.find_first_of(" \n")));
    }
    skip_spaces();
    std::uint64_t start = 0;
    auto [next, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), start);
    if (ec != std::errc() || next == rest.data())
        return make_error(Errc::corrupt,
                          "cannot read the start time of process " + std::to_string(pid));
    return start;
}

Result<std::shared_ptr<UniqueFd>> pin_process(pid_t pid, std::uint64_t start_time,
                                              const std::string &proc_root) {
    auto gone = [&] {
        return make_error(Errc::not_found, "process " + std::to_string(pid) + " has exited");
    };
    int fd = pid > 0 ? pidfd_open(pid) : -1;
    if (fd < 0 && pid > 0 && errno != ESRCH)
        return system_error(Errc::io, errno, "cannot pin process " + std::to_string(pid));
    if (fd < 0) return gone();
    auto pidfd = std::make_shared<UniqueFd>(fd);
    // Read after the pidfd pins the pid: a recycled pid shows another start time.
    auto start = process_start_time(pid, proc_root);
    if (!start && start.error().code == Errc::out_of_resources) return start.error();
    if (!start || *start != start_time || !still_running(fd)) return gone();
    return pidfd;
}

std::vector<gid_t> groups_from_status(const std::string &status) {
    std::vector<gid_t> gids;
    if (auto gid = status_numbers(status, "Gid:"); gid && gid->size() >= 2)
        gids.push_back(static_cast<gid_t>((*gid)[1]));
    if (auto groups = status_numbers(status, "Groups:"))
        for (unsigned long g : *groups)
            gids.push_back(static_cast<gid_t>(g));
    std::sort(gids.begin(), gids.end());
    gids.erase(std::unique(gids.begin(), gids.end()), gids.end());
    return gids;
}

const char *to_string(ProcessProof p) {
    switch (p) {
    case ProcessProof::attested:
        return "attested";
    case ProcessProof::bus_pidfd:
        return "bus-pidfd";
    case ProcessProof::pid_only:
        break;
    }
    return "pid-only";
}

ProcessProof parse_process_proof(std::string_view text) {
    if (text == "attested") return ProcessProof::attested;
    if (text == "bus-pidfd") return ProcessProof::bus_pidfd;
    return ProcessProof::pid_only;
}

Result<Peer> identify_peer(uid_t uid, pid_t pid, std::optional<std::vector<gid_t>> bus_gids,
                           std::string bus_name, const ProvenProcess &proven,
                           const std::string &proc_root) {
    if (pid <= 0) return make_error(Errc::denied, "the bus did not vouch for the caller's pid");
    Peer p;
    p.uid = uid;
    p.pid = pid;
    p.bus_name = std::move(bus_name);
    bool is_proven =
        proven.proof != ProcessProof::pid_only && proven.pidfd && proven.pidfd->valid();
    if (is_proven) {
        // The process that proved itself must be the caller now: the process at this pid when
        // it proved itself (a process keeps its pid while it runs, no /proc read needed), alive.
        if (proven.pid != pid || !still_running(proven.pidfd->get()))
            return make_error(Errc::denied,
                              "the process that made this connection (pid " + std::to_string(pid) +
                                  ") has exited: a connection speaks only for the process that "
                                  "proved itself on it; connect again from the calling process");
        p.pidfd = proven.pidfd;
        p.process_proof = proven.proof;
    } else {
        int fd = pidfd_open(pid);
        // Only ESRCH means the caller is gone; a full fd table is the daemon's problem, said so.
        if (fd < 0 && errno != ESRCH)
            return system_error(Errc::denied, errno,
                                "cannot identify caller process " + std::to_string(pid));
        if (fd < 0)
            return make_error(Errc::denied, "caller process " + std::to_string(pid) +
                                                " is gone: " + std::strerror(errno));
        p.pidfd = std::make_shared<UniqueFd>(fd);
    }
    int fd = p.pidfd->get();
    std::string dir = proc_root + "/" + std::to_string(pid);
    auto changed = [&] {
        return make_error(Errc::denied, "caller process " + std::to_string(pid) +
                                            " no longer matches the bus's credentials");
    };
    // A /proc read that fails because the daemon is out of fds (or memory) is the daemon's
    // problem, said so: never a caller that "no longer matches".
    auto read_own = [&](const std::string &name) -> Result<std::string> {
        errno = 0;
        std::string text = read_file(dir + "/" + name);
        if (text.empty() && exhausted_resource(errno))
            return system_error(Errc::io, errno,
                                "cannot read /proc/" + std::to_string(pid) + "/" + name);
        return text;
    };
    // Start time and identity first, ...
    auto start = process_start_time(pid, proc_root);
    if (!start) return start.error();
    auto status_read = read_own("status");
    if (!status_read) return status_read.error();
    std::string status = std::move(*status_read);
    auto euid = effective_uid(status);
    if (!euid || *euid != uid) return changed();
    // ... then the rest, ...
    char exe[4096];
    ssize_t n = ::readlink((dir + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0) p.executable.assign(exe, static_cast<std::size_t>(n));
    auto cg_read = read_own("cgroup");
    if (!cg_read) return cg_read.error();
    std::string cg = std::move(*cg_read);
    if (auto path = policy::unified_cgroup_path(cg)) p.cgroup = std::move(*path);
    p.host_netns = false; // unless read and equal to the daemon's
    if (auto net = namespace_at(dir + "/ns/net")) {
        p.netns = *net;
        static const std::optional<NamespaceId> own_net = namespace_at("/proc/self/ns/net");
        p.host_netns = own_net && *own_net == *net;
    }
    p.host_namespaces = true;
    for (std::size_t i = 0; i < std::size(contained_kinds); ++i) {
        auto ns = namespace_at(dir + "/ns/" + contained_kinds[i]);
        if (!ns || !own_namespaces()[i] || *ns != *own_namespaces()[i]) p.host_namespaces = false;
        p.namespaces += (i ? "/" : "") + (ns ? std::to_string(ns->ino) : std::string("?"));
    }
    // ... and identity again: the same process, unchanged, and still running (so its pid was
    // not reused by another between the reads).
    auto start_after = process_start_time(pid, proc_root);
    if (!start_after && start_after.error().code == Errc::out_of_resources)
        return start_after.error();
    auto status_after_read = read_own("status");
    if (!status_after_read) return status_after_read.error();
    std::string status_after = std::move(*status_after_read);
    auto euid_after = effective_uid(status_after);
    std::vector<gid_t> groups = groups_from_status(status);
    if (!start_after || *start_after != *start || !euid_after || *euid_after != uid ||
        groups_from_status(status_after) != groups || !still_running(fd))
        return changed();
    p.start_time = *start;
    p.unit = policy::system_unit_of(p.cgroup);
    p.user_unit = policy::user_unit_of(p.cgroup);
    if (bus_gids) {
        // The bus vouched for the groups as they were when the process connected (dbus-daemon
        // and dbus-broker include the primary gid). Not the process's groups of now: a
        // proven process may since have exec'd a setgid program while a child holds the
        // connection.
        p.gids = std::move(*bus_gids);
        std::sort(p.gids.begin(), p.gids.end());
        p.gids.erase(std::unique(p.gids.begin(), p.gids.end()), p.gids.end());
        p.gids_from_bus = true;
    } else if (is_proven) {
        p.gids = std::move(groups);
    } // else: a pid alone vouches for no group
    return p;
}

namespace {

// User and group names change rarely and NSS reads files (or asks a service) each time: names are
// remembered for a few seconds. The daemon's loop is its only caller.
class NameCache {
  public:
    const std::string &user(uid_t uid) {
        return lookup(users_, uid, [](unsigned id) {
            struct passwd *pw = getpwuid(id);
            return pw ? std::string(pw->pw_name) : std::string();
        });
    }
    const std::string &group(gid_t gid) {
        return lookup(groups_, gid, [](unsigned id) {
            struct group *gr = getgrgid(id);
            return gr ? std::string(gr->gr_name) : std::string();
        });
    }

  private:
    struct Entry {
        std::string name;
        std::chrono::steady_clock::time_point at;
    };
    template <typename Fn>
    const std::string &lookup(std::map<unsigned, Entry> &m, unsigned id, Fn fetch) {
        auto now = std::chrono::steady_clock::now();
        auto it = m.find(id);
        if (it == m.end() || now - it->second.at > std::chrono::seconds(5)) {
            if (m.size() > 4096) m.clear();
            it = m.insert_or_assign(id, Entry{fetch(id), now}).first;
        }
        return it->second.name;
    }
    std::map<unsigned, Entry> users_, groups_;
};

NameCache &names() {
    static NameCache cache;
    return cache;
}

} // namespace

policy::Caller Peer::caller() const {
    policy::Caller c;
    c.uid = uid;
    c.user = names().user(uid);
    for (gid_t g : gids) {
        c.gids.push_back(g);
        if (const std::string &name = names().group(g); !name.empty())
            c.group_names.push_back(name);
    }
    c.unit = unit;
    c.user_unit = user_unit;
    c.cgroup = cgroup;
    c.executable = executable;
    c.process_proven = process_proof != ProcessProof::pid_only;
    c.pod = pod;
    c.pod_unproven = !pod && !pod_sandbox.empty();
    c.placed = placed();
    return c;
}

bool still_running(int pidfd) {
    struct pollfd p {
        pidfd, POLLIN, 0
    };
    int n;
    do {
        n = ::poll(&p, 1, 0);
    } while (n < 0 && errno == EINTR);
    return n == 0;
}

} // namespace knod::daemon
