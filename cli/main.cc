// knod-policy: the admin's and auditor's tool. Policy checks run locally on files; audit
// commands read journal files; daemon commands talk to knod-policyd over D-Bus.
#include "cli/commands.h"
#include "cli/terminal_output.h"

#include "knod/json.h"

#include <algorithm>
#include <iostream>
#include <string_view>
#include <vector>

int main(int argc, char **argv) {
    // Nothing another user put in the journal or the daemon's replies reaches the terminal raw.
    knod::cli::EscapeOutput safe_out(std::cout), safe_err(std::cerr);
    CLI::App app{
        "knod-policy: check and explain KNOD binding policy, audit the session journal, and "
        "manage knod-policyd.\n"
        "Run 'knod-policy COMMAND --help' for each command's options."};
    app.set_version_flag("--version", "knod-policy " KNOD_VERSION);
    app.require_subcommand(1);
    app.footer("Exit codes: 0 ok; 1 invalid policy, denied or refused request, failed "
               "verification (tampering); 2 bad usage, unreadable input, or the bus or "
               "knod-policyd unreachable. The same for every command.");
    std::vector<knod::cli::Runner> runners;
    runners.push_back(knod::cli::add_check(app));
    runners.push_back(knod::cli::add_explain(app));
    runners.push_back(knod::cli::add_audit(app));
    runners.push_back(knod::cli::add_daemon_commands(app));
    runners.push_back(knod::cli::add_bindings(app));
    runners.push_back(knod::cli::add_sim_send(app));
    runners.push_back(knod::cli::add_doctor(app));
    runners.push_back(knod::cli::add_metrics(app));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        int rc = app.exit(e);
        if (rc == 0) return 0;
        // `audit ... --json` answers in JSON even when the command line is wrong.
        std::vector<std::string_view> args(argv + 1, argv + argc);
        if (!args.empty() && args[0] == "audit" && std::ranges::count(args, "--json"))
            std::cout << knod::dump_json_escaped(nlohmann::json{{"error", e.what()}}) << "\n";
        return knod::cli::exit_usage;
    }
    // Each add_* returns a runner that does nothing unless its subcommand was chosen.
    for (auto &run : runners) {
        if (int rc = run(); rc >= 0) return rc;
    }
    return knod::cli::exit_usage;
}
