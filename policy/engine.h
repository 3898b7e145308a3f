// The decision engine: given a policy, who is asking and what for, decide. Pure: the caller
// supplies identity and current usage, so the same code serves the daemon and `explain`.
#pragma once

#include "policy/policy.h"

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace knod::policy {

// What the daemon knows, from the bus and the kernel, about who is asking.
// The Kubernetes pod a caller's process runs in, as the node's CNI plugin registered its
// sandbox (daemon/pod_registry.h) and the kernel placed the process (its network namespace).
// Annotations: only those under pod_annotation_prefix.
struct PodIdentity {
    std::string k8s_namespace;
    std::string name;
    std::string uid;
    std::map<std::string, std::string> annotations;
};

struct Caller {
    std::uint32_t uid = 0;
    std::string user;                // may be empty when the uid has no name
    std::vector<std::uint32_t> gids; // primary and supplementary
    std::vector<std::string> group_names;
    std::string unit;      // the system manager's unit (sd_pid_get_unit), if any
    std::string user_unit; // the user manager's unit (sd_pid_get_user_unit), if any
    std::string cgroup;    // cgroup v2 path
    std::string executable;
    // Whether the process these were read from is proven to be the one that made the
    // connection: the bus sent its pidfd (ProcessFD), or the client attested it (AttestProcess),
    // and it was still running when read. Otherwise they rest on the pid the bus took at
    // connect(2), which another process may have taken since (docs/threat-model.md, "Caller
    // identity"). An unproven caller matches no allow rule that names units, user_units,
    // cgroups or executables, and every deny rule that names them counts them as matching.
    bool process_proven = false;
    // Set when the caller's process is in a registered pod; rules naming k8s_namespaces,
    // k8s_pods or k8s_annotations match no other caller (allow or deny).
    std::optional<PodIdentity> pod;
    // In a registered pod's network namespace, but its process is not proven (see
    // process_proven): the pid may since name another process, so the pod's identity is not
    // the caller's (issue #51). `pod` is then empty: it matches no allow rule (pod or host),
    // every deny rule naming pods, and no rule for host callers.
    bool pod_unproven = false;
    // False when a pod's request is checked before any of its processes runs (the CNI
    // plugin's ADD): its uid and groups are not known yet, so allow rules naming users or
    // groups do not match it and deny rules naming them do (as for an unproven process).
    bool uid_known = true;
    // False for a process in a network namespace that is neither the daemon's nor a registered
    // pod's (a process that made one of its own): it matches no allow rule; deny rules apply.
    bool placed = true;
};

struct Request {
    Caller caller;
    std::string netdev;
    std::vector<std::string> gpu_names; // every name the GPU goes by: PCI address, node, sim name
    Mode mode = Mode::rx_only;
    std::uint64_t region_bytes = 0;
    std::vector<FlowSpec> flows;
};

// The caller's live bindings, for quotas.
struct Usage {
    std::uint32_t bindings = 0;
    std::uint64_t bytes = 0;
};

enum class Verdict { allow, deny, quota_exceeded };
const char *to_string(Verdict v);

struct RuleMiss {
    std::string rule;
    SourceLocation where;
    std::string why_not;
};

struct Decision {
    Verdict verdict = Verdict::deny;
    bool would_deny = false; // permissive mode granted what the rules refuse
    std::string rule;        // the deciding rule; empty when none matched
    SourceLocation rule_where;
    std::string reason;           // one sentence a person can act on
    std::vector<RuleMiss> misses; // why each earlier rule did not match
    IommuRequirement iommu = IommuRequirement::translated;
    std::chrono::seconds key_lifetime{3600};

    bool granted() const { return verdict == Verdict::allow; }
};

// Why `rule` does not match `request`, or an empty string when it does.
std::string mismatch(const Rule &rule, const Request &request);

Decision decide(const Policy &policy, const Request &request, const Usage &usage);

} // namespace knod::policy
