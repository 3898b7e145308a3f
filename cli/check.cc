#include "cli/commands.h"
#include "daemon/host/devmem_readiness.h"
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
        std::string driver;
    };
    auto opt = std::make_shared<Options>();
    cmd->add_option("FILE", opt->files,
                    "policy files or directories (their *.toml files, in lexical order), read as "
                    "one policy in the order given");
    cmd->add_flag("--json", opt->json, "print diagnostics as JSON");
    cmd->add_option("--driver", opt->driver,
                    "also warn about what this driver can never serve (devmem: flows that are "
                    "not TCP, port ranges)")
        ->check(CLI::IsMember({"devmem"}));
    cmd->footer("Prints every problem as FILE:LINE:COL: error|warning: MESSAGE. Exit 0 when the "
                "policy is valid (warnings allowed), 1 when it has errors.");

    return [cmd, opt]() -> int {
        if (!cmd->parsed()) return -1;
        auto files = opt->files.empty() ? policy::default_policy_files()
                                        : policy::expand_policy_paths(opt->files);
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
        if (opt->driver == "devmem" && load.ok())
            for (auto &w : host::devmem_policy_warnings(load.policy))
                load.diagnostics.push_back(std::move(w));
        if (opt->json) {
            nlohmann::json out;
            out["valid"] = load.ok();
            out["files"] = files;
            out["rules"] = load.policy.rules.size();
            // What the journal names this policy by once the daemon loads it (audit policy).
            if (load.ok()) out["digest"] = load.policy.digest;
            out["diagnostics"] = nlohmann::json::array();
            for (auto &d : load.diagnostics)
                out["diagnostics"].push_back(
                    {{"severity", d.severity == policy::Severity::error ? "error" : "warning"},
                     {"file", d.where.file},
                     {"line", d.where.line},
                     {"column", d.where.column},
                     {"message", d.message}});
            std::cout << knod::dump_json(out, 2) << "\n";
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
