#include "cli/caller_lookup.h"
#include "cli/commands.h"
#include "host/gpu_inventory.h"
#include "policy/cgroup_unit.h"
#include "policy/engine.h"
#include "policy/parser.h"

#include "knod/json.h"
#include "knod/untrusted.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

namespace knod::cli {
namespace {

struct Options {
    std::vector<std::string> policy_files;
    std::string user; // empty: the invoking user
    std::vector<std::string> groups;
    std::string unit, user_unit, cgroup, exe;
    std::string netdev;
    std::vector<std::string> gpus;
    std::string host_root;
    std::string mode = "rx-only";
    std::vector<std::string> flows;
    std::string bytes = "0";
    std::uint32_t held_bindings = 0;
    std::string held_bytes = "0";
    bool unproven = false;
    bool json = false;
    std::string pod; // NAMESPACE/NAME: the caller is in this pod
    std::string pod_uid;
    std::vector<std::string> annotations; // KEY=VALUE, keys under knod.io/
};

// The GPU's names as the daemon's hardware backends see them: a name that is one of this host's
// GPUs stands for every name that GPU goes by (host::names_of); any other (a sim name, a GPU of
// another host) is matched as given.
struct GpuNames {
    std::vector<std::string> names;
    std::string resolved_pci; // empty when no GPU of this host goes by the names given
};

GpuNames resolve_gpu(const std::vector<std::string> &given, const host::HostPaths &paths) {
    GpuNames out;
    auto gpus = host::list_gpus(paths);
    auto add = [&](const std::string &n) {
        if (std::find(out.names.begin(), out.names.end(), n) == out.names.end())
            out.names.push_back(n);
    };
    for (auto &name : given) {
        if (const host::Gpu *g = host::find_gpu(gpus, name)) {
            out.resolved_pci = g->pci;
            for (auto &n : host::names_of(*g))
                add(n);
        } else {
            add(name);
        }
    }
    return out;
}

std::string or_none(const std::string &s, const char *hint) {
    return s.empty() ? std::string("-  (none; ") + hint + ")" : quote_untrusted(s);
}

int report(const policy::Decision &d, const policy::Caller &c, GroupsSource groups,
           const std::string &who_from, const GpuNames &gpu, bool json) {
    if (json) {
        nlohmann::json out{
            {"decision", policy::to_string(d.verdict)},
            {"caller",
             {{"uid", c.uid},
              {"user", c.user},
              {"uid_source", who_from},
              {"gids", c.gids},
              {"groups", c.group_names},
              {"groups_source", to_string(groups)},
              {"unit", c.unit},
              {"user_unit", c.user_unit},
              {"cgroup", c.cgroup},
              {"executable", c.executable},
              {"process_proven", c.process_proven},
              {"pod", c.pod ? nlohmann::json{{"namespace", c.pod->k8s_namespace},
                                             {"name", c.pod->name},
                                             {"uid", c.pod->uid},
                                             {"annotations", c.pod->annotations}}
                            : nlohmann::json()}}},
            {"gpu",
             {{"names", gpu.names},
              {"host_gpu",
               gpu.resolved_pci.empty() ? nlohmann::json() : nlohmann::json(gpu.resolved_pci)}}},
            {"would_deny", d.would_deny},
            {"reason", d.reason}};
        // A denial carries what decided it; only a grant carries what it grants.
        if (!d.rule.empty()) {
            out["rule"] = d.rule;
            out["rule_location"] = d.rule_where.to_string();
        }
        if (d.granted()) {
            out["iommu"] = policy::to_string(d.iommu);
            out["key_lifetime_s"] = d.key_lifetime.count();
        }
        out["earlier_rules"] = nlohmann::json::array();
        for (auto &m : d.misses)
            out["earlier_rules"].push_back(
                {{"rule", m.rule}, {"location", m.where.to_string()}, {"why_not", m.why_not}});
        std::cout << knod::dump_json_escaped(out, 2) << "\n";
    } else {
        std::string gids;
        for (auto g : c.gids)
            gids += (gids.empty() ? "" : ",") + std::to_string(g);
        std::cout << "caller:   uid " << c.uid << (c.user.empty() ? "" : " (" + c.user + ")")
                  << " [" << who_from << "], groups [" << gids << "] from " << to_string(groups)
                  << "\n";
        std::cout << "unit:     " << or_none(c.unit, "--unit or --cgroup")
                  << (c.user_unit.empty() ? "" : ", user unit " + quote_untrusted(c.user_unit))
                  << "\n";
        std::cout << "exe:      " << or_none(c.executable, "--exe") << "\n";
        std::cout << "process:  "
                  << (c.process_proven ? "proven (the bus's ProcessFD, or the client attested it)"
                                       : "not proven: a pid only (--unproven)")
                  << "\n";
        // Only with --pod: admin_cli_test reads the header line by line.
        if (c.pod) {
            std::string ann;
            for (auto &[k, v] : c.pod->annotations)
                ann += (ann.empty() ? "" : ", ") + k + "=" + quote_untrusted(v, 64);
            std::cout << "pod:      " << quote_untrusted(c.pod->k8s_namespace + "/" + c.pod->name)
                      << (ann.empty() ? "" : " [" + ann + "]") << "\n";
        }
        std::string names;
        for (auto &n : gpu.names)
            names += (names.empty() ? "" : ", ") + n;
        std::cout << "gpu:      " << names
                  << (gpu.resolved_pci.empty()
                          ? " (no GPU of this host goes by it: matched as given)"
                          : " (this host's GPU " + gpu.resolved_pci + ", by every name it has)")
                  << "\n";
        std::cout << "decision: " << policy::to_string(d.verdict)
                  << (d.would_deny ? " (permissive; would deny)" : "") << "\n";
        if (!d.rule.empty())
            std::cout << "rule:     " << d.rule << " (" << d.rule_where.to_string() << ")\n";
        std::cout << "reason:   " << d.reason << "\n";
        if (d.granted())
            std::cout << "grants:   iommu " << policy::to_string(d.iommu) << ", key lifetime "
                      << d.key_lifetime.count() << " s\n";
        if (!d.misses.empty()) {
            std::cout << "earlier rules that did not match:\n";
            for (auto &m : d.misses)
                std::cout << "  " << m.rule << " (" << m.where.to_string() << "): " << m.why_not
                          << "\n";
        }
    }
    return d.granted() ? exit_ok : exit_failed;
}

} // namespace

Runner add_explain(CLI::App &app) {
    auto *cmd = app.add_subcommand(
        "explain", "Show how the policy decides one binding request, and why each earlier rule "
                   "did not match.");
    auto o = std::make_shared<Options>();
    cmd->add_option("--policy", o->policy_files,
                    "policy files or directories, read as knod-policyd and check read them "
                    "(default: /etc/knod/policy.toml and policy.d/)");
    cmd->add_option("--uid,--user", o->user,
                    "the caller, by uid or user name (default: you, the invoking user; under "
                    "sudo, SUDO_UID)");
    cmd->add_option("--group,--gid", o->groups,
                    "a group (name or gid) the calling process holds; repeat for each. Given, "
                    "these are all its groups; not given, they are this process's own "
                    "(getgroups) when --user is you, else the user database's as a stand-in");
    cmd->add_option("--unit", o->unit,
                    "the caller's system unit (default: from --cgroup, as the daemon derives it)");
    cmd->add_option("--user-unit", o->user_unit,
                    "the caller's unit under its user manager (default: from --cgroup)");
    cmd->add_option("--cgroup", o->cgroup, "the caller's cgroup path");
    cmd->add_option("--exe", o->exe, "the caller's executable path");
    cmd->add_option("--netdev", o->netdev, "network device to bind")->required();
    cmd->add_option("--gpu", o->gpus,
                    "the GPU: PCI address, render node or sim name. A GPU of this host stands for "
                    "every name it goes by, as in the daemon")
        ->required();
    cmd->add_option("--host-root", o->host_root,
                    "resolve GPU names on a fixture tree (DIR/sys...), as doctor --host-root");
    cmd->add_option("--mode", o->mode, "rx-only, tx or rx-tx")->capture_default_str();
    cmd->add_option("--flow", o->flows,
                    "a flow spec, e.g. 'udp 10.0.0.0/16:* -> 10.1.2.3:5000'; "
                    "repeat for several")
        ->required();
    cmd->add_option("--bytes", o->bytes, "region size: bytes or e.g. 64MiB")->required();
    cmd->add_option("--held-bindings", o->held_bindings, "bindings the uid already holds (quotas)");
    cmd->add_option("--held-bytes", o->held_bytes, "region bytes the uid already holds (quotas)");
    cmd->add_flag("--unproven", o->unproven,
                  "decide as for a caller the daemon knows by its pid alone (a bus without "
                  "ProcessFD and a client that did not attest): allow rules naming units, "
                  "user units, cgroups or executables do not match it, deny rules naming them do");
    cmd->add_option("--pod", o->pod,
                    "decide for a process of this Kubernetes pod (NAMESPACE/NAME), as the "
                    "daemon does for a caller in a sandbox knod-cni registered: rules naming "
                    "k8s_namespaces, k8s_pods or k8s_annotations match only such a caller");
    cmd->add_option("--pod-uid", o->pod_uid, "the pod's UID (with --pod)");
    cmd->add_option("--annotation", o->annotations,
                    "a pod annotation KEY=VALUE (with --pod; keys under knod.io/, repeatable)");
    cmd->add_flag("--json", o->json, "print the decision as JSON");
    cmd->footer("Example:\n  knod-policy explain --policy "
                "/usr/share/doc/knod-policy/examples/policy.example.toml --user 1000 \\\n"
                "    --netdev knodsim0 --gpu sim0 --flow 'udp 10.99.0.1:* -> 10.99.0.2:5000' "
                "--bytes 16MiB\n"
                "The caller it evaluated (uid, groups, unit, executable) and the GPU's names are "
                "printed first.\nExit codes: 0 allowed, 1 denied, 2 bad usage or an invalid or "
                "unreadable policy.");

    return [cmd, o]() -> int {
        if (!cmd->parsed()) return -1;
        auto files = policy::expand_policy_paths(o->policy_files); // what the daemon reads
        auto load = policy::load_policy_files(files);
        if (!load.ok()) {
            std::cerr << load.errors_text() << "knod-policy explain: the policy is not valid\n";
            return exit_usage;
        }
        auto invoker = invoking_user();
        std::string who_from = o->user.empty() ? invoker.how : "--user";
        auto caller = lookup_caller(o->user.empty() ? invoker.uid : o->user);
        if (!caller) {
            std::cerr << "knod-policy explain: " << caller.error().message << "\n";
            return exit_usage;
        }
        auto groups = fill_groups(*caller, o->groups);
        if (!groups) {
            std::cerr << "knod-policy explain: --group: " << groups.error().message << "\n";
            return exit_usage;
        }
        policy::Request req;
        req.caller = *caller;
        req.caller.cgroup = o->cgroup;
        req.caller.unit = o->unit.empty() ? policy::system_unit_of(o->cgroup) : o->unit;
        req.caller.user_unit =
            o->user_unit.empty() ? policy::user_unit_of(o->cgroup) : o->user_unit;
        req.caller.executable = o->exe;
        req.caller.process_proven = !o->unproven;
        if (!o->pod.empty()) {
            auto slash = o->pod.find('/');
            if (slash == std::string::npos || slash == 0 || slash + 1 == o->pod.size()) {
                std::cerr << "knod-policy explain: --pod: NAMESPACE/NAME, e.g. ml-prod/infer-0\n";
                return exit_usage;
            }
            policy::PodIdentity pod{
                o->pod.substr(0, slash), o->pod.substr(slash + 1), o->pod_uid, {}};
            for (auto &a : o->annotations) {
                auto eq = a.find('=');
                if (eq == std::string::npos || !a.starts_with(policy::pod_annotation_prefix)) {
                    std::cerr << "knod-policy explain: --annotation: KEY=VALUE with KEY under "
                              << policy::pod_annotation_prefix << ", not " << quote_untrusted(a, 64)
                              << "\n";
                    return exit_usage;
                }
                pod.annotations[a.substr(0, eq)] = a.substr(eq + 1);
            }
            req.caller.pod = std::move(pod);
        } else if (!o->annotations.empty() || !o->pod_uid.empty()) {
            std::cerr << "knod-policy explain: --annotation and --pod-uid need --pod\n";
            return exit_usage;
        }
        req.netdev = o->netdev;
        auto gpu =
            resolve_gpu(o->gpus, o->host_root.empty() ? host::HostPaths{}
                                                      : host::HostPaths::under(o->host_root));
        req.gpu_names = gpu.names;
        auto mode = policy::parse_mode(o->mode);
        auto bytes = policy::parse_size(o->bytes);
        auto held = policy::parse_size(o->held_bytes);
        if (!mode || !bytes || !held) {
            std::cerr << "knod-policy explain: "
                      << (!mode ? "--mode must be rx-only, tx or rx-tx"
                                : "--bytes/--held-bytes must be sizes like 4096 or 64MiB")
                      << "\n";
            return exit_usage;
        }
        req.mode = *mode;
        req.region_bytes = *bytes;
        for (auto &f : o->flows) {
            auto spec = policy::parse_flow_spec(f);
            if (!spec) {
                std::cerr << "knod-policy explain: --flow: " << spec.error().message << "\n";
                return exit_usage;
            }
            req.flows.push_back(*spec);
        }
        return report(policy::decide(load.policy, req, {o->held_bindings, *held}), req.caller,
                      *groups, who_from, gpu, o->json);
    };
}

} // namespace knod::cli
