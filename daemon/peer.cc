#include "daemon/peer.h"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/syscall.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace knod::daemon {
namespace {

int pidfd_open(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int pidfd_send_signal(int fd, int sig) {
    return static_cast<int>(::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0));
}

std::string read_file(const std::string &path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// The effective uid from /proc/PID/status ("Uid: real effective saved fs").
std::optional<uid_t> effective_uid(const std::string &status) {
    std::istringstream in(status);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Uid:", 0) != 0) continue;
        std::istringstream fields(line.substr(4));
        unsigned long real = 0, effective = 0;
        if (fields >> real >> effective) return static_cast<uid_t>(effective);
    }
    return std::nullopt;
}

// The systemd unit is the innermost .service or .scope in the cgroup path.
std::string unit_of(const std::string &cgroup) {
    std::string unit;
    std::size_t start = 0;
    while (start < cgroup.size()) {
        std::size_t end = cgroup.find('/', start);
        if (end == std::string::npos) end = cgroup.size();
        std::string part = cgroup.substr(start, end - start);
        if (part.ends_with(".service") || part.ends_with(".scope")) unit = part;
        start = end + 1;
    }
    return unit;
}

std::vector<gid_t> groups_of(uid_t uid) {
    struct passwd *pw = getpwuid(uid);
    if (!pw) return {};
    int n = 64;
    std::vector<gid_t> gids(static_cast<std::size_t>(n));
    while (getgrouplist(pw->pw_name, pw->pw_gid, gids.data(), &n) < 0)
        gids.resize(static_cast<std::size_t>(n));
    gids.resize(static_cast<std::size_t>(n));
    return gids;
}

} // namespace

Result<std::uint64_t> process_start_time(pid_t pid, const std::string &proc_root) {
    std::string stat = read_file(proc_root + "/" + std::to_string(pid) + "/stat");
    // The command name (field 2) may hold spaces and parentheses: parse after the last ')'.
    auto close = stat.rfind(')');
    if (stat.empty() || close == std::string::npos)
        return make_error(Errc::not_found, "process " + std::to_string(pid) + " is gone");
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    // Field 3 is the first after ')'; the start time is field 22.
    for (int i = 3; i < 22 && fields >> field; ++i) {
    }
    std::uint64_t start = 0;
    if (!(fields >> start))
        return make_error(Errc::corrupt,
                          "cannot read the start time of process " + std::to_string(pid));
    return start;
}

Result<Peer> identify_peer(uid_t uid, pid_t pid, std::vector<gid_t> gids, std::string bus_name,
                           const std::string &proc_root) {
    if (pid <= 0) return make_error(Errc::denied, "the bus did not vouch for the caller's pid");
    Peer p;
    p.uid = uid;
    p.pid = pid;
    p.bus_name = std::move(bus_name);
    int fd = pidfd_open(pid);
    if (fd < 0)
        return make_error(Errc::denied, "caller process " + std::to_string(pid) +
                                            " is gone: " + std::strerror(errno));
    p.pidfd = std::make_shared<UniqueFd>(fd);
    std::string dir = proc_root + "/" + std::to_string(pid);
    auto start = process_start_time(pid, proc_root);
    if (!start) return start.error();
    p.start_time = *start;
    auto euid = effective_uid(read_file(dir + "/status"));
    // The pidfd pins the process: if it still answers now, what we read above was about it.
    if (pidfd_send_signal(fd, 0) != 0 || !euid || *euid != uid)
        return make_error(Errc::denied, "caller process " + std::to_string(pid) +
                                            " no longer matches the bus's credentials");
    char exe[4096];
    ssize_t n = ::readlink((dir + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0) p.executable.assign(exe, static_cast<std::size_t>(n));
    std::string cg = read_file(dir + "/cgroup");
    if (auto pos = cg.find("0::"); pos != std::string::npos) {
        p.cgroup = cg.substr(pos + 3);
        if (auto nl = p.cgroup.find('\n'); nl != std::string::npos) p.cgroup.resize(nl);
    }
    p.unit = unit_of(p.cgroup);
    p.gids = gids.empty() ? groups_of(uid) : std::move(gids);
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
    c.cgroup = cgroup;
    c.executable = executable;
    return c;
}

} // namespace knod::daemon
