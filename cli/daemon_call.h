// What the commands that talk to knod-policyd share: the bus option, and one mapping of their
// failures to exit codes (an unreachable bus or daemon is 2 and names the bus tried; a refusal by
// the daemon or the bus policy is 1).
#pragma once

#include "knod/result.h"

#include <CLI/CLI.hpp>

#include <string>

namespace knod::cli {

struct BusOptions {
    std::string address;
    bool json = false;
};

void add_bus_options(CLI::App *cmd, BusOptions &o, bool json);

// Prints "knod-policy WHAT: message" (with the bus address tried when the daemon or the bus was
// unreachable) and returns the exit code.
int call_failed(const char *what, const Error &e, const std::string &address);

// The --help footer of every daemon command.
extern const char *const daemon_exit_codes;

} // namespace knod::cli
