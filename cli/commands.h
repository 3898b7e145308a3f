// The knod-policy subcommands. Each registers itself on the app and runs when chosen;
// the exit code it returns is the process's.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace knod::cli {

using Runner = std::function<int()>;

// Exit codes scripts can rely on.
constexpr int exit_ok = 0;
constexpr int exit_failed = 1; // policy invalid, request denied, journal tampered
constexpr int exit_usage = 2;  // bad arguments, unreadable input, the bus or daemon unreachable

Runner add_check(CLI::App &app);
Runner add_explain(CLI::App &app);
Runner add_audit(CLI::App &app);
// `audit policy` (audit_policy.cc), under the audit command; returns -1 when not chosen.
Runner add_audit_policy(CLI::App &audit);
Runner add_daemon_commands(CLI::App &app);
Runner add_bindings(CLI::App &app);
Runner add_sim_send(CLI::App &app);
Runner add_doctor(CLI::App &app);
Runner add_metrics(CLI::App &app);

} // namespace knod::cli
