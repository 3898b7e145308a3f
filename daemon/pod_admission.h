// Registering and forgetting pod sandboxes (the core of RegisterPod, UnregisterPod and the CNI
// plugin's spool; issue 51 item 8, issue 52 item 1). The bus adaptor only unpacks a call,
// identifies the caller (the host's root) and calls in here; everything that is policy lives
// here: what the fd is (a network namespace, not the host's), which pod keys exist, what the
// knod.io/ annotations ask for (flows split, the region sized), the policy's verdict on it, and
// the registry. No D-Bus here.
//
// The spool (protocol/pod_spool.h): knod-cni leaves there what it could not hand to the daemon
// within its budget; consume_spool() carries it out (an ADD by opening the runtime's netns path
// again, which must be the same namespace the plugin saw; a DEL as UnregisterPod). A direct
// call for an attachment drops its spooled entry: the direct call is the newer word. Because
// registering the same (container id, ifname) again replaces the entry, a spooled ADD and the
// same ADD delivered late over the bus do not make two pods.
#pragma once

#include "daemon/binding_manager.h"
#include "knod/result.h"
#include "knod/unique_fd.h"

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace knod::daemon {

// What a RegisterPod call (or a spooled ADD) carries.
struct PodRegistration {
    std::string container_id, ifname;
    UniqueFd netns; // an fd the caller opened on the sandbox's network namespace (owned)
    // "namespace", "name", "uid", "network"; any other key is refused.
    std::map<std::string, std::string> pod;
    std::map<std::string, std::string> annotations; // under policy::pod_annotation_prefix
};

// What the knod.io/ annotations ask for: flows, netdev, gpu and region. nullopt when the pod
// declares no flows (it asks for nothing); InvalidArgument when the region does not parse.
Result<std::optional<BindingManager::PodOffload>>
pod_offload_of(const std::map<std::string, std::string> &annotations);

class PodAdmission {
  public:
    // `spool_dir`: where knod-cni spools (empty: no spool is read).
    PodAdmission(BindingManager &manager, std::string spool_dir)
        : manager_(manager), spool_dir_(std::move(spool_dir)) {}

    // RegisterPod: InvalidArgument for an fd that is no network namespace, the host's own, an
    // unknown pod key or annotations that do not parse; Denied (journaled as pod-refused) when
    // the policy refuses what the pod declares; the registry's refusals (pod_registry.h).
    Result<void> register_pod(PodRegistration r);
    // UnregisterPod: ends the sandbox's bindings (pod-deleted) and forgets it, and drops a
    // spooled entry for it. Returns how many bindings ended.
    std::size_t unregister_pod(const std::string &container_id, const std::string &ifname);
    // CollectPods (CNI GC).
    std::size_t collect_pods(const std::string &network,
                             const std::set<std::pair<std::string, std::string>> &valid,
                             std::size_t &ended);

    // Carries out what knod-cni spooled, oldest name first, at most pod_spool::max_entries
    // files a pass; each entry is removed once read (carried out or refused: a refusal is
    // logged, and a bad entry must not come back every tick). A directory that is not root's
    // and closed to others is not read at all (logged once).
    struct SpoolPass {
        std::size_t registered = 0, deleted = 0, refused = 0;
    };
    SpoolPass consume_spool();
    const std::string &spool_dir() const { return spool_dir_; }

  private:
    void drop_spooled(const std::string &container_id, const std::string &ifname);
    BindingManager &manager_;
    std::string spool_dir_;
    bool untrusted_logged_ = false, unwritable_logged_ = false;
};

} // namespace knod::daemon
