// The pod sandboxes the node's CNI plugin (knod-cni) registered: for each, the network
// namespace the runtime made for it (by device and inode, read off the fd the plugin passed)
// and the pod's identity (namespace, name, UID, the annotations under policy::
// pod_annotation_prefix). A caller whose process is in one of those network namespaces is that
// pod's (daemon/peer.h); nothing a caller says makes it one.
//
// Why the network namespace: the runtime makes one per sandbox and every container of the pod
// joins it; a process cannot enter another's without CAP_SYS_ADMIN over it (setns), and a host
// process (pod or not) is in the host's. A pod with hostNetwork shares the host's namespace and
// is never a pod here (docs/kubernetes.md). The cgroup path is not used: its layout depends on
// the runtime's cgroup driver, and a process may move itself within a delegated subtree.
//
// Bounded: at most `max_sandboxes` (a node runs ~110 pods by default; 4,096 is far above), each
// with at most 64 annotations; strings are capped before anything is kept.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"
#include "policy/engine.h"

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace knod::daemon {

// A namespace as the kernel names it: the nsfs device and inode (stat of /proc/PID/ns/net, or
// fstat of an fd opened there).
struct NamespaceId {
    dev_t dev = 0;
    ino_t ino = 0;
    bool operator==(const NamespaceId &) const = default;
    auto operator<=>(const NamespaceId &) const = default;
};

struct PodSandbox {
    std::string container_id; // the runtime's sandbox id (CNI_CONTAINERID)
    std::string ifname;       // CNI_IFNAME: one sandbox may be registered per network
    // The CNI network that registered it (its conflist's "name"): GC names a network and the
    // attachments still valid on it. Empty: registered without one, never garbage-collected.
    std::string network;
    NamespaceId netns;
    // Held while registered: a namespace stays alive (its inode is not handed to a new one)
    // while an fd refers to it, so a sandbox deleted without a DEL cannot lend its
    // registration to whoever makes the next namespace.
    std::shared_ptr<UniqueFd> netns_fd;
    policy::PodIdentity pod;
    std::int64_t registered_us = 0;
};

struct PodLimits {
    std::size_t max_sandboxes = 4096;
    std::size_t max_annotations = 64;
};

class PodRegistry {
  public:
    explicit PodRegistry(PodLimits limits = {}) : limits_(limits) {}

    // Checks the strings (InvalidArgument naming the field: container id 1-256 bytes of
    // [A-Za-z0-9_.-], ifname 1-15, namespace 1-63 of DNS characters, name 1-253 of
    // [A-Za-z0-9_.-] starting with a letter or digit (podman's container names too), uid at most
    // 64, network at most 253 printable bytes, annotations under the prefix, keys at most 317 and
    // values at most 4,096 bytes), then keeps it. The same (container id, ifname) again replaces
    // the entry (a repeated ADD); a network namespace already registered for another container id
    // is refused (Denied): one namespace, one pod; so is the same container id on another
    // ifname with another netns or pod namespace, name or UID (one sandbox, one identity).
    // LimitsExceeded at max_sandboxes.
    Result<void> add(PodSandbox sandbox);
    // Forgets (container id, ifname), or every ifname of the container id when `ifname` is
    // empty. Returns what went (nothing is not an error: a DEL may come twice).
    std::vector<PodSandbox> remove(const std::string &container_id, const std::string &ifname);
    // CNI GC: forgets every sandbox registered by `network` whose (container id, ifname) is not
    // in `valid` (the runtime's cni.dev/valid-attachments for that network); the others'
    // registrations stay. Returns what went.
    std::vector<PodSandbox> collect(const std::string &network,
                                    const std::set<std::pair<std::string, std::string>> &valid);
    // The pod whose sandbox has this network namespace, if any.
    const PodSandbox *by_netns(const NamespaceId &netns) const;
    // Whether any registration of this container id is left.
    bool has_container(const std::string &container_id) const;
    std::size_t size() const { return sandboxes_.size(); }
    std::vector<const PodSandbox *> all() const;

  private:
    PodLimits limits_;
    std::map<std::pair<std::string, std::string>, PodSandbox> sandboxes_;
};

} // namespace knod::daemon
