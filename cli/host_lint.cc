#include "cli/host_lint.h"
#include "host/caller_identity.h"

#include "host/gpu_inventory.h"
#include "host/netdev_inventory.h"
#include "knod/untrusted.h"

#include <fnmatch.h>
#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <filesystem>

namespace knod::cli {
namespace {

namespace fs = std::filesystem;

// Where the sim driver's devices are called by default (knod-policyd --driver=sim): they exist
// only while such a daemon runs, so a rule naming them is not a typo.
constexpr const char *sim_netdev = "knodsim0";
constexpr const char *sim_gpu = "sim0";

bool matches(const std::string &glob, const std::string &name) {
    return fnmatch(glob.c_str(), name.c_str(), 0) == 0;
}

std::string joined(const std::vector<std::string> &v) {
    std::string s;
    for (auto &x : v)
        s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "none" : s;
}

policy::SourceLocation policy_start(const policy::Policy &p) {
    return {p.files.empty() ? std::string("policy") : p.files.front(), 1, 1};
}

policy::Diagnostic warn(policy::SourceLocation where, std::string message) {
    return {policy::Severity::warning, std::move(where), std::move(message)};
}

bool has_user(const policy::Principal &u) {
    return u.id ? true : getpwnam(u.name.c_str()) != nullptr;
}
bool has_group(const std::string &name) {
    return getgrnam(name.c_str()) != nullptr;
}

} // namespace

std::vector<policy::Diagnostic> grant_warnings(const policy::Policy &p) {
    std::vector<policy::Diagnostic> out;
    if (p.rules.empty())
        out.push_back(warn(policy_start(p), "the policy has no rules: every request is denied "
                                            "(default deny)"));
    else if (std::none_of(p.rules.begin(), p.rules.end(),
                          [](const policy::Rule &r) { return r.action == policy::Action::allow; }))
        out.push_back(warn(policy_start(p), "every rule denies: no request can be granted"));
    return out;
}

std::vector<policy::Diagnostic> host_warnings(const policy::Policy &p,
                                              const host::HostPaths &paths) {
    std::vector<policy::Diagnostic> out;
    for (auto [key, group] : {std::pair{"auditor_group", p.settings.auditor_group},
                              std::pair{"admin_group", p.settings.admin_group}})
        if (!group.empty() && !has_group(group))
            out.push_back(
                warn(policy_start(p), std::string(key) + " " + quote_untrusted(group) +
                                          " is not a group on this host: nobody is in it"));

    std::vector<std::string> netdevs;
    if (auto list = host::list_netdevs(paths))
        for (auto &n : *list)
            if (n.name != "lo") netdevs.push_back(n.name);
    auto gpus = host::list_gpus(paths);
    std::vector<std::string> gpu_names;
    for (auto &g : gpus)
        for (auto &n : host::names_of(g))
            gpu_names.push_back(n);
    std::error_code ec;
    bool iommu = !fs::is_empty(fs::path(paths.sysfs) / "kernel/iommu_groups", ec) && !ec;
    // Only the running kernel can be asked; a fixture tree says nothing about it.
    bool provable = !paths.live() || host::kernel_has_peer_pidfd();

    for (auto &r : p.rules) {
        auto rule = "rule " + quote_untrusted(r.name) + ": ";
        for (auto &u : r.users)
            if (!has_user(u))
                out.push_back(warn(r.where, rule + "user " + quote_untrusted(u.name) +
                                                " does not exist on this host: never matches"));
        for (auto &g : r.groups)
            if (!g.id && !has_group(g.name))
                out.push_back(warn(r.where, rule + "group " + quote_untrusted(g.name) +
                                                " does not exist on this host: never matches"));
        for (auto &glob : r.netdevs)
            if (std::none_of(netdevs.begin(), netdevs.end(),
                             [&](auto &n) { return matches(glob, n); }))
                out.push_back(warn(
                    r.where,
                    rule + "netdevs " + quote_untrusted(glob) +
                        " matches no network device on this host (here: " + joined(netdevs) + ")" +
                        (matches(glob, sim_netdev)
                             ? "; the sim driver's knodsim0 exists only while "
                               "knod-policyd runs with --driver=sim"
                             : "")));
        for (auto &glob : r.gpus)
            if (std::none_of(gpu_names.begin(), gpu_names.end(),
                             [&](auto &n) { return matches(glob, n); }))
                out.push_back(warn(
                    r.where, rule + "gpus " + quote_untrusted(glob) +
                                 " matches no GPU on this host (here: " + joined(gpu_names) + ")" +
                                 (matches(glob, sim_gpu) ? "; sim0 is the sim driver's GPU" : "")));
        if (r.action != policy::Action::allow) continue;
        if (!iommu && r.iommu != policy::IommuRequirement::any)
            out.push_back(warn(
                r.where, rule + "iommu = " + quote_untrusted(policy::to_string(r.iommu)) +
                             ", but this host has no IOMMU: the devmem and knod drivers can never "
                             "grant it (knod-policy doctor says how to enable one)"));
        if (!provable && (!r.units.empty() || !r.user_units.empty() || !r.cgroups.empty() ||
                          !r.executables.empty()))
            out.push_back(warn(r.where, rule + "names units, user_units, cgroups or executables, "
                                               "which only a proven process matches, and this "
                                               "kernel (no SO_PEERPIDFD: Linux < 6.5) proves none: "
                                               "it can never grant (knod-policy doctor, "
                                               "caller.identity)"));
    }
    return out;
}

} // namespace knod::cli
