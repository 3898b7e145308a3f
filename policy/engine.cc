#include "policy/engine.h"

#include "knod/untrusted.h"

#include <fnmatch.h>

#include <algorithm>

namespace knod::policy {
namespace {

bool glob_match(const std::string &pattern, const std::string &value) {
    return fnmatch(pattern.c_str(), value.c_str(), 0) == 0;
}

bool any_glob(const std::vector<std::string> &patterns, const std::string &value) {
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](auto &p) { return glob_match(p, value); });
}

std::string join(const std::vector<std::string> &items) {
    std::string out;
    for (auto &i : items)
        out += (out.empty() ? "" : ", ") + i;
    return out;
}

template <typename T> std::string join_principals(const std::vector<T> &items) {
    std::vector<std::string> names;
    for (auto &i : items)
        names.push_back(i.to_string());
    return join(names);
}

bool is_user(const Principal &p, const Caller &c) {
    return p.id ? *p.id == c.uid : (!c.user.empty() && p.name == c.user);
}

bool in_group(const Principal &p, const Caller &c) {
    if (p.id) return std::find(c.gids.begin(), c.gids.end(), *p.id) != c.gids.end();
    return std::find(c.group_names.begin(), c.group_names.end(), p.name) != c.group_names.end();
}

// Conditions only a process can prove, not the connection's kernel credentials.
bool names_process(const Rule &r) {
    return !r.units.empty() || !r.user_units.empty() || !r.cgroups.empty() ||
           !r.executables.empty();
}

bool names_pod(const Rule &r) {
    return !r.k8s_namespaces.empty() || !r.k8s_pods.empty() || !r.k8s_annotations.empty();
}

// Why the rule's domain is not the caller's, or why a pod rule does not match the caller;
// empty when it matches. Domains are separate (issue #51): a pod's creator chooses its uid and
// groups (runAsUser, supplementalGroups), so a rule written for host users and groups never
// matches a pod's process, allow or deny, and a pod rule never matches a host process.
std::string pod_mismatch(const Rule &rule, const Caller &c) {
    if (c.pod_unproven) {
        if (names_pod(rule) && rule.action == Action::deny) return {}; // fail closed
        return "caller is in a registered pod's network namespace but its process is not proven "
               "(the bus gave only a pid, which another process may have taken since the caller "
               "connected): pod rules match only a process the bus (ProcessFD) or the client "
               "library (AttestProcess) proved, and rules for host callers never match a pod";
    }
    if (!names_pod(rule)) {
        if (!c.pod) return {};
        return "caller is in pod " +
               quote_untrusted(c.pod->k8s_namespace + "/" + c.pod->name, 256) +
               ": rules without k8s_namespaces, k8s_pods or k8s_annotations are for host callers "
               "only";
    }
    if (!c.pod)
        return "caller is in no registered pod: rules naming k8s_namespaces, k8s_pods or "
               "k8s_annotations match only processes of a pod the node's CNI plugin registered";
    const PodIdentity &p = *c.pod;
    if (!rule.k8s_namespaces.empty() && !any_glob(rule.k8s_namespaces, p.k8s_namespace))
        return "caller's pod namespace " + quote_untrusted(p.k8s_namespace, 256) +
               " matches none of [" + join(rule.k8s_namespaces) + "]";
    if (!rule.k8s_pods.empty() && !any_glob(rule.k8s_pods, p.name))
        return "caller's pod " + quote_untrusted(p.name, 256) + " matches none of [" +
               join(rule.k8s_pods) + "]";
    for (auto &[key, value] : rule.k8s_annotations) {
        auto it = p.annotations.find(key);
        if (it == p.annotations.end()) return "caller's pod has no annotation " + key;
        if (it->second != value)
            return "caller's pod annotation " + key + " is " + quote_untrusted(it->second, 256) +
                   ", not '" + value + "'";
    }
    return {};
}

std::string human_bytes(std::uint64_t b) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && b >= 1024 && b % 1024 == 0) {
        b /= 1024;
        ++u;
    }
    return std::to_string(b) + " " + units[u];
}

} // namespace

const char *to_string(Verdict v) {
    switch (v) {
    case Verdict::allow:
        return "allow";
    case Verdict::deny:
        return "deny";
    case Verdict::quota_exceeded:
        return "quota-exceeded";
    }
    return "?";
}

std::string mismatch(const Rule &rule, const Request &r) {
    const Caller &c = r.caller;
    if (auto why = pod_mismatch(rule, c); !why.empty()) return why;
    if (!c.placed && rule.action == Action::allow)
        return "caller's network namespace is neither the host's nor a registered pod's: it "
               "could receive nothing it binds, and no allow rule matches it";
    if (!c.uid_known && (!rule.users.empty() || !rule.groups.empty())) {
        // Fail closed both ways, as for an unproven process below.
        if (rule.action == Action::allow)
            return "the pod's uid and groups are not known before its processes run: rules "
                   "naming users or groups are decided when a process of the pod asks";
    } else {
        if (!rule.users.empty() && std::none_of(rule.users.begin(), rule.users.end(),
                                                [&](auto &p) { return is_user(p, c); }))
            return "caller uid " + std::to_string(c.uid) +
                   (c.user.empty() ? ""
                                   : " (" + escape_untrusted(c.user, Escape::value, 64) + ")") +
                   " is not one of users [" + join_principals(rule.users) + "]";
        if (!rule.groups.empty() && std::none_of(rule.groups.begin(), rule.groups.end(),
                                                 [&](auto &p) { return in_group(p, c); }))
            return "caller is in none of groups [" + join_principals(rule.groups) + "]";
    }
    if (names_process(rule) && !c.process_proven) {
        // Fail closed both ways: a deny rule is not escaped by showing another process's unit.
        if (rule.action == Action::allow)
            return "caller's process is not proven (the bus gave only a pid, which another "
                   "process may have taken since the caller connected): rules naming units, "
                   "user_units, cgroups or executables match only a process the bus (ProcessFD) "
                   "or the client library (AttestProcess) proved";
    } else {
        if (!rule.units.empty() && !any_glob(rule.units, c.unit))
            return "caller unit " + quote_untrusted(c.unit, 256) + " matches none of [" +
                   join(rule.units) + "]";
        if (!rule.user_units.empty() && !any_glob(rule.user_units, c.user_unit))
            return "caller user unit " + quote_untrusted(c.user_unit, 256) + " matches none of [" +
                   join(rule.user_units) + "]";
        if (!rule.cgroups.empty() && !any_glob(rule.cgroups, c.cgroup))
            return "caller cgroup " + quote_untrusted(c.cgroup, 256) + " matches none of [" +
                   join(rule.cgroups) + "]";
        if (!rule.executables.empty() && !any_glob(rule.executables, c.executable))
            return "caller executable " + quote_untrusted(c.executable, 256) +
                   " matches none of [" + join(rule.executables) + "]";
    }
    if (!rule.netdevs.empty() && !any_glob(rule.netdevs, r.netdev))
        return "netdev " + quote_untrusted(r.netdev) + " is not one of [" + join(rule.netdevs) +
               "]";
    if (!rule.gpus.empty() && std::none_of(r.gpu_names.begin(), r.gpu_names.end(),
                                           [&](auto &g) { return any_glob(rule.gpus, g); }))
        return "gpu " + quote_untrusted(r.gpu_names.empty() ? std::string() : r.gpu_names.front()) +
               " is not one of [" + join(rule.gpus) + "]";
    if (std::find(rule.modes.begin(), rule.modes.end(), r.mode) == rule.modes.end())
        return std::string("mode ") + to_string(r.mode) + " is not granted";
    if (rule.max_region_bytes && r.region_bytes > *rule.max_region_bytes)
        return "region of " + std::to_string(r.region_bytes) + " bytes exceeds max_region " +
               human_bytes(*rule.max_region_bytes);
    if (!rule.flows.empty()) {
        for (auto &f : r.flows) {
            bool inside = std::any_of(rule.flows.begin(), rule.flows.end(),
                                      [&](auto &g) { return g.contains(f); });
            if (!inside) return "flow '" + f.to_string() + "' is outside the rule's flows";
        }
    }
    return {};
}

Decision decide(const Policy &policy, const Request &request, const Usage &usage) {
    Decision d;
    if (request.mode != Mode::rx_only) {
        // A capability limit, not a policy choice: permissive mode does not lift it.
        d.reason = std::string("mode ") + to_string(request.mode) +
                   " is not supported by any driver yet; use rx-only";
        return d;
    }
    const Rule *deciding = nullptr;
    for (auto &rule : policy.rules) {
        std::string why = mismatch(rule, request);
        if (why.empty()) {
            deciding = &rule;
            break;
        }
        d.misses.push_back({rule.name, rule.where, std::move(why)});
    }

    if (!deciding) {
        d.reason = "no rule matched (default deny)";
    } else {
        d.rule = deciding->name;
        d.rule_where = deciding->where;
        d.iommu = deciding->iommu;
        d.key_lifetime = deciding->key_lifetime;
        if (deciding->action == Action::deny) {
            d.reason = "denied by rule '" + deciding->name + "'";
        } else if (deciding->max_bindings_per_uid &&
                   usage.bindings + 1 > *deciding->max_bindings_per_uid) {
            d.verdict = Verdict::quota_exceeded;
            d.reason = "uid " + std::to_string(request.caller.uid) + " already holds " +
                       std::to_string(usage.bindings) + " binding(s); rule '" + deciding->name +
                       "' allows " + std::to_string(*deciding->max_bindings_per_uid);
        } else if (deciding->max_total_bytes_per_uid &&
                   (usage.bytes + request.region_bytes < usage.bytes ||
                    usage.bytes + request.region_bytes > *deciding->max_total_bytes_per_uid)) {
            d.verdict = Verdict::quota_exceeded;
            d.reason = "uid " + std::to_string(request.caller.uid) + " would hold " +
                       std::to_string(usage.bytes + request.region_bytes) +
                       " region bytes; rule '" + deciding->name + "' allows " +
                       human_bytes(*deciding->max_total_bytes_per_uid);
        } else {
            d.verdict = Verdict::allow;
            d.reason = "allowed by rule '" + deciding->name + "'";
        }
    }
    if (d.verdict != Verdict::allow && policy.settings.permissive) {
        d.would_deny = true;
        d.verdict = Verdict::allow;
        d.reason = "permissive mode: granted, but would deny: " + d.reason;
    }
    return d;
}

} // namespace knod::policy
