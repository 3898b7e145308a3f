#include "daemon/pod_admission.h"

#include "journal/records.h"
#include "knod/json.h"
#include "knod/system_error.h"
#include "knod/untrusted.h"
#include "policy/parser.h"
#include "protocol/pod_spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

namespace knod::daemon {
namespace {

Error invalid(const std::string &what) {
    return make_error(Errc::invalid_argument, what);
}

// The network namespace an fd refers to; InvalidArgument for anything else.
Result<NamespaceId> network_namespace_of(int fd) {
    int type = ::ioctl(fd, NS_GET_NSTYPE);
    if (type != CLONE_NEWNET)
        return invalid("netns: the fd is not a network namespace (open the sandbox's CNI_NETNS "
                       "path and pass that)");
    struct stat st {};
    if (::fstat(fd, &st) != 0) return invalid("netns: cannot fstat the fd");
    return NamespaceId{st.st_dev, st.st_ino};
}

void log(const std::string &line) {
    std::cerr << "knod-policyd: " << line << std::endl;
}

} // namespace

Result<std::optional<BindingManager::PodOffload>>
pod_offload_of(const std::map<std::string, std::string> &annotations) {
    auto wants = [&](const char *key) {
        auto it = annotations.find(std::string(policy::pod_annotation_prefix) + key);
        return it == annotations.end() ? std::string() : it->second;
    };
    std::string flows = wants("flows");
    if (flows.empty()) return std::optional<BindingManager::PodOffload>();
    BindingManager::PodOffload o;
    o.netdev = wants("netdev");
    o.gpu = wants("gpu");
    for (std::size_t at = 0; at <= flows.size();) {
        std::size_t end = std::min(flows.find(',', at), flows.size());
        std::string one = flows.substr(at, end - at);
        one.erase(0, one.find_first_not_of(" \t\n"));
        one.erase(one.find_last_not_of(" \t\n") + 1);
        if (!one.empty()) o.flows.push_back(one);
        at = end + 1;
    }
    std::string region = wants("region");
    auto bytes = policy::parse_size(region.empty() ? "4KiB" : region);
    if (!bytes)
        return invalid(std::string(policy::pod_annotation_prefix) +
                       "region: a size like 64MiB, not " + quote_untrusted(region, 32));
    o.region_bytes = *bytes;
    return std::optional(std::move(o));
}

Result<void> PodAdmission::register_pod(PodRegistration r) {
    auto netns = network_namespace_of(r.netns.get());
    if (!netns) return netns.error();
    struct stat host {};
    if (::stat("/proc/self/ns/net", &host) == 0 && NamespaceId{host.st_dev, host.st_ino} == *netns)
        return invalid("netns: that is the host's network namespace (a pod with hostNetwork is "
                       "no pod to knod-policyd)");
    PodSandbox sandbox;
    sandbox.container_id = r.container_id;
    sandbox.ifname = r.ifname;
    sandbox.netns = *netns;
    sandbox.netns_fd = std::make_shared<UniqueFd>(std::move(r.netns));
    for (auto &[k, v] : r.pod) {
        if (k == "namespace")
            sandbox.pod.k8s_namespace = v;
        else if (k == "name")
            sandbox.pod.name = v;
        else if (k == "uid")
            sandbox.pod.uid = v;
        else if (k == "network")
            sandbox.network = v;
        else
            return invalid("pod: keys are namespace, name, uid and network, not " +
                           quote_untrusted(k, 32));
    }
    sandbox.pod.annotations = std::move(r.annotations);
    sandbox.registered_us = journal::now_us();
    // What the pod declares it will ask for is decided now: a misconfigured pod fails at its
    // start, in the runtime's own error.
    auto offload = pod_offload_of(sandbox.pod.annotations);
    if (!offload) return offload.error();
    if (*offload)
        if (auto checked = manager_.check_pod(sandbox, **offload); !checked) return checked;
    if (auto added = manager_.pods().add(std::move(sandbox)); !added) return added;
    drop_spooled(r.container_id, r.ifname);
    return {};
}

std::size_t PodAdmission::unregister_pod(const std::string &container_id,
                                         const std::string &ifname) {
    drop_spooled(container_id, ifname);
    return manager_.pod_deleted(container_id, ifname);
}

std::size_t PodAdmission::collect_pods(const std::string &network,
                                       const std::set<std::pair<std::string, std::string>> &valid,
                                       std::size_t &ended) {
    return manager_.pods_collected(network, valid, ended);
}

void PodAdmission::drop_spooled(const std::string &container_id, const std::string &ifname) {
    if (spool_dir_.empty()) return;
    if (ifname.empty()) return; // a DEL of every ifname: spooled entries name one each
    if (auto name = pod_spool::entry_name(container_id, ifname))
        (void)::unlink((spool_dir_ + "/" + *name).c_str()); // none there is the usual case
}

PodAdmission::SpoolPass PodAdmission::consume_spool() {
    SpoolPass pass;
    if (spool_dir_.empty()) return pass;
    int dfd = ::open(spool_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return pass; // no spool yet: nothing was ever left there
    UniqueFd dir_fd(dfd);
    struct stat d {};
    // Root's, and closed to others; the group (2770) only when it is the daemon's own.
    bool trusted = ::fstat(dfd, &d) == 0 && S_ISDIR(d.st_mode) && d.st_uid == 0 &&
                   (d.st_mode & S_IRWXO) == 0 &&
                   ((d.st_mode & S_IRWXG) == 0 || d.st_gid == ::getegid());
    if (!trusted) {
        if (!untrusted_logged_)
            log("the CNI spool " + quote_untrusted(spool_dir_, 256) +
                " is not root's directory closed to others (0700, or 2770 with this daemon's "
                "group): nothing in it is read");
        untrusted_logged_ = true;
        return pass;
    }
    untrusted_logged_ = false;
    std::vector<std::string> names;
    if (DIR *dir = ::fdopendir(::fcntl(dfd, F_DUPFD_CLOEXEC, 3))) {
        while (dirent *e = ::readdir(dir)) {
            std::string n = e->d_name;
            if (n.empty() || n[0] == '.') continue; // ".", "..", and the writer's temporaries
            names.push_back(std::move(n));
            if (names.size() >= pod_spool::max_entries) break;
        }
        ::closedir(dir);
    }
    std::sort(names.begin(), names.end());
    for (auto &name : names) {
        auto refuse = [&](const std::string &why) {
            log("CNI spool entry " + quote_untrusted(name, 160) + " refused: " + why);
            ++pass.refused;
        };
        // Taken out of the writer's way first: an entry the plugin renames over this name from
        // now on is a newer one, read on the next pass rather than removed with this one.
        std::string taken = ".taken-" + name;
        if (::renameat(dfd, name.c_str(), dfd, taken.c_str()) != 0) {
            // ENOENT: gone meanwhile (a direct call dropped it). Anything else (a read-only
            // mount, no write permission) would leave every entry waiting: said once.
            if (errno != ENOENT && !unwritable_logged_)
                log("cannot take entries out of the CNI spool " + quote_untrusted(spool_dir_, 256) +
                    ": " + std::strerror(errno) + " (the daemon needs to write there)");
            unwritable_logged_ = unwritable_logged_ || errno != ENOENT;
            continue;
        }
        int fd = ::openat(dfd, taken.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        UniqueFd file(fd);
        struct stat st {};
        std::string text;
        // One link: the name it was taken under (a hard link to a file elsewhere has two).
        bool ok = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
                  st.st_nlink == 1 && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 &&
                  static_cast<std::size_t>(st.st_size) <= pod_spool::max_entry_bytes;
        if (ok) {
            text.resize(static_cast<std::size_t>(st.st_size));
            ok = ::read(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        }
        (void)::unlinkat(dfd, taken.c_str(), 0); // read or refused: it must not come back
        if (!ok) {
            refuse("not a regular file of root's with one link, at most " +
                   std::to_string(pod_spool::max_entry_bytes) + " bytes");
            continue;
        }
        auto j = parse_json(text);
        auto str = [&](const char *key) {
            auto it = j.find(key);
            return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
        };
        auto map = [&](const char *key, std::map<std::string, std::string> &out) {
            auto it = j.find(key);
            if (it == j.end()) return true;
            if (!it->is_object()) return false;
            for (auto &[k, v] : it->items()) {
                if (!v.is_string()) return false;
                out[k] = v.get<std::string>();
            }
            return true;
        };
        if (j.is_discarded() || !j.is_object()) {
            refuse("not a JSON object");
            continue;
        }
        std::string op = str("op"), container = str("container_id"), ifname = str("ifname");
        if (pod_spool::entry_name(container, ifname) != name) {
            refuse("its name is not its container id and ifname");
            continue;
        }
        if (op == "del") {
            std::size_t ended = manager_.pod_deleted(container, ifname);
            ++pass.deleted;
            log("CNI spool: DEL of sandbox " + container + " carried out (" +
                std::to_string(ended) + " binding(s) ended)");
            continue;
        }
        PodRegistration r;
        r.container_id = container;
        r.ifname = ifname;
        std::string path = str("netns");
        auto dev = j.find("netns_dev"), ino = j.find("netns_ino");
        if (op != "add" || path.empty() || path[0] != '/' || path.size() > 4096 || dev == j.end() ||
            !dev->is_number_unsigned() || ino == j.end() || !ino->is_number_unsigned() ||
            !map("pod", r.pod) || !map("annotations", r.annotations)) {
            refuse("not an add or del entry as knod-cni writes them");
            continue;
        }
        // The runtime's path again, as the plugin opened it (O_NONBLOCK: a FIFO planted there
        // must not hang the loop); it must still be the namespace the plugin saw, or the
        // sandbox is gone and the path names something else now.
        int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (ns < 0) {
            refuse("ADD of sandbox " + container + ": its network namespace " +
                   quote_untrusted(path, 128) + " is gone (" + std::strerror(errno) + ")");
            continue;
        }
        r.netns = UniqueFd(ns);
        struct stat nst {};
        if (::fstat(ns, &nst) != 0 || nst.st_dev != dev->get<std::uint64_t>() ||
            nst.st_ino != ino->get<std::uint64_t>()) {
            refuse("ADD of sandbox " + container + ": " + quote_untrusted(path, 128) +
                   " is no longer the network namespace knod-cni saw");
            continue;
        }
        std::string pod_name = r.pod.count("name") ? r.pod["name"] : "";
        if (auto added = register_pod(std::move(r)); !added) {
            refuse("ADD of sandbox " + container + ": " + added.error().message);
            continue;
        }
        ++pass.registered;
        log("CNI spool: sandbox " + container + " registered as pod " + pod_name +
            " (its ADD came while this daemon did not answer)");
    }
    return pass;
}

} // namespace knod::daemon
