#include "cli/commands.h"
#include "cli/host_lint.h"
#include "host/devmem_readiness.h"
#include "policy/parser.h"

#include "knod/json.h"
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

namespace knod::cli {

Runner add_check(CLI::App &app) {
    auto *cmd = app.add_subcommand(
        "check", "Validate policy files. Without FILEs: /etc/knod/policy.toml and "
                 "/etc/knod/policy.d/*.toml, as the daemon reads them.");
    struct Options {
        std::vector<std::string> files;
        bool json = false;
        bool host = false, no_host = false; // neither: on when /etc/knod exists
        std::string host_root;
        std::string driver;
    };
    auto opt = std::make_shared<Options>();
    cmd->add_option("FILE", opt->files,
                    "policy files or directories, read as one policy in the order given, the "
                    "same files knod-policyd --policy reads: a directory with policy.toml or "
                    "policy.d/ is a policy root (policy.toml, then policy.d/*.toml), any other "
                    "its *.toml files; names starting with '.' are never read");
    cmd->add_flag("--json", opt->json, "print diagnostics as JSON");
    cmd->add_option("--driver", opt->driver,
                    "also warn about what this driver can never serve (devmem: flows that are "
                    "not TCP, port ranges)")
        ->check(CLI::IsMember({"devmem"}));
    cmd->add_flag("--no-host", opt->no_host, "leave out the host's warnings");
    cmd->add_flag("--host", opt->host,
                  "also warn about what the policy means on this host: users, groups, netdevs "
                  "and GPUs that do not exist here, rules this host's drivers can never serve "
                  "(default: on where /etc/knod exists)");
    cmd->add_option("--host-root", opt->host_root,
                    "with --host, read netdevs, GPUs and IOMMU groups from a fixture tree "
                    "(DIR/sys...), as doctor --host-root; users and groups still come from NSS");
    cmd->footer("Prints every problem as FILE:LINE:COL: error|warning: MESSAGE. A policy with no "
                "rules or no allow rule is warned about.\nExit codes: 0 valid (warnings "
                "allowed), 1 errors, 2 bad usage or unreadable files.");

    return [cmd, opt]() -> int {
        if (!cmd->parsed()) return -1;
        auto files = policy::expand_policy_paths(opt->files); // what the daemon reads
        if (files.empty()) {
            std::cerr << "knod-policy check: no policy files found (looked for "
                         "/etc/knod/policy.toml and /etc/knod/policy.d/*.toml)\n";
            return exit_usage;
        }
        for (auto &f : files) {
            if (access(f.c_str(), R_OK) != 0) {
                std::cerr << "knod-policy check: cannot read " << f << ": " << std::strerror(errno)
                          << "\n";
                return exit_usage;
            }
        }
        auto load = policy::load_policy_files(files);
        // A host the daemon runs on has /etc/knod; elsewhere (a policy repository) the host's
        // names mean nothing.
        bool host = !opt->no_host &&
                    (opt->host || !opt->host_root.empty() || access("/etc/knod", F_OK) == 0);
        if (load.ok()) {
            for (auto &d : grant_warnings(load.policy))
                load.diagnostics.push_back(std::move(d));
            if (host)
                for (auto &d :
                     host_warnings(load.policy, opt->host_root.empty()
                                                    ? host::HostPaths{}
                                                    : host::HostPaths::under(opt->host_root)))
                    load.diagnostics.push_back(std::move(d));
        }
        if (opt->driver == "devmem" && load.ok())
            for (auto &w : host::devmem_policy_warnings(load.policy))
                load.diagnostics.push_back(std::move(w));
        if (opt->json) {
            nlohmann::json out;
            out["valid"] = load.ok();
            out["host_checked"] = host && load.ok();
            out["files"] = files;
            out["rules"] = load.policy.rules.size();
            // What the journal names this policy by once the daemon loads it (audit policy).
            if (load.ok()) out["digest"] = load.policy.digest;
            // Each file's own SHA-256, as the daemon's policy-load events list them.
            out["file_digests"] = nlohmann::json::array();
            for (std::size_t i = 0; i < load.policy.files.size(); ++i)
                out["file_digests"].push_back(
                    {{"path", load.policy.files[i]},
                     {"sha256",
                      i < load.policy.file_digests.size() ? load.policy.file_digests[i] : ""}});
            out["diagnostics"] = nlohmann::json::array();
            for (auto &d : load.diagnostics)
                out["diagnostics"].push_back(
                    {{"severity", d.severity == policy::Severity::error ? "error" : "warning"},
                     {"file", d.where.file},
                     {"line", d.where.line},
                     {"column", d.where.column},
                     {"message", d.message}});
            std::cout << knod::dump_json_escaped(out, 2) << "\n";
        } else {
            for (auto &d : load.diagnostics)
                (d.severity == policy::Severity::error ? std::cerr : std::cout)
                    << d.to_string() << "\n";
            if (load.ok())
                std::cout << "ok: " << load.policy.rules.size() << " rule(s) in " << files.size()
                          << " file(s)"
                          << (load.policy.settings.permissive ? " (permissive mode)" : "") << "\n"
                          << "digest: " << load.policy.digest
                          << " (how the journal names it once the daemon loads it)\n";
            else
                std::cerr << load.error_count() << " error(s); the policy is not valid\n";
        }
        return load.ok() ? exit_ok : exit_failed;
    };
}

} // namespace knod::cli
