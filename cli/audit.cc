#include "cli/commands.h"
#include "daemon/journal/verify.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <iostream>

namespace knod::cli {
namespace {

constexpr const char *default_db = "/var/lib/knod-policy/journal.db";

int verify(const std::string &db, bool json) {
    bool tty = !json && isatty(STDERR_FILENO);
    auto progress = [tty](std::int64_t done, std::int64_t total) {
        if (!tty || total == 0) return;
        std::cerr << "\rverifying: " << done << "/" << total << " events (" << (done * 100 / total)
                  << "%)" << std::flush;
    };
    auto report = journal::verify_chain(db, progress);
    if (tty) std::cerr << "\n";
    if (!report) {
        std::cerr << "knod-policy audit verify: " << report.error().message << "\n";
        return exit_usage;
    }
    if (json) {
        std::cout << nlohmann::json{{"ok", report->ok},
                                    {"events_checked", report->events_checked},
                                    {"total_events", report->total_events},
                                    {"first_bad_event", report->first_bad_seq},
                                    {"problem", report->problem},
                                    {"head_hash", report->head_hash}}
                         .dump(2)
                  << "\n";
    } else if (report->ok) {
        std::cout << "ok: " << report->events_checked << " event(s) chain correctly; head "
                  << report->head_hash << "\n";
    } else {
        std::cout << "FAILED: first bad event " << report->first_bad_seq << ": " << report->problem
                  << "\n"
                  << report->events_checked << " event(s) before it chain correctly\n";
    }
    return report->ok ? exit_ok : exit_failed;
}

} // namespace

Runner add_audit(CLI::App &app) {
    auto *audit = app.add_subcommand("audit", "Read the session journal.");
    audit->require_subcommand(1);
    auto *cmd = audit->add_subcommand(
        "verify", "Check the journal's hash chain: finds any edited, deleted, inserted or "
                  "reordered event.");
    auto db = std::make_shared<std::string>(default_db);
    auto json = std::make_shared<bool>(false);
    cmd->add_option("--db", *db, "journal database file (opened read-only)")->capture_default_str();
    cmd->add_flag("--json", *json, "print the result as JSON");
    cmd->footer("Exit 0 when the chain is intact, 1 naming the first bad event, 2 when the file "
                "cannot be read.");
    return [cmd, db, json]() -> int {
        if (!cmd->parsed()) return -1;
        return verify(*db, *json);
    };
}

} // namespace knod::cli
