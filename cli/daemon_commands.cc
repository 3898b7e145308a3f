// Commands that talk to knod-policyd over D-Bus: status, revoke, reload (bindings: bindings.cc).
#include "cli/commands.h"
#include "cli/daemon_call.h"
#include "client/client.h"

#include "knod/json.h"
#include "knod/untrusted.h"
#include <nlohmann/json.hpp>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <optional>

namespace knod::cli {
namespace {

// One line per copy sink: what it took, refused and lost, and whether it fails now (why).
void print_sinks(const nlohmann::json &sinks) {
    auto each = sinks.value("each", nlohmann::json::array());
    if (!each.is_array() || each.empty()) {
        std::cout << "sinks:    none\n";
        return;
    }
    for (auto &k : each) {
        if (!k.is_object()) continue;
        std::cout << "sink:     " << escape_untrusted(k.value("name", "?")) << ": "
                  << k.value("written", std::uint64_t{0}) << " written, "
                  << k.value("failed", std::uint64_t{0}) << " failed, "
                  << k.value("dropped", std::uint64_t{0}) << " dropped";
        if (auto h = k.find("heads_written");
            h != k.end() && h->is_number_unsigned() && k.value("name", "") == "journald")
            std::cout << "; " << h->get<std::uint64_t>()
                      << " chain head(s) sent, the newest for event "
                      << k.value("last_head_seq", std::int64_t{0})
                      << " (whether journald kept them: knod-policy audit verify)";
        if (k.value("failing", false))
            std::cout << " (FAILING: " << escape_untrusted(k.value("last_error", "")) << ")";
        else if (k.value("failed", std::uint64_t{0}) > 0)
            std::cout << " (works again; last error: "
                      << escape_untrusted(k.value("last_error", "")) << ")";
        std::cout << "\n";
    }
}

// systemd's fd store, where the daemon keeps bindings through a restart: what the notify socket
// did not take (PID 1 not reading it) ends at the next stop instead.
void print_fd_store(const nlohmann::json &fs) {
    if (!fs.value("enabled", false)) return;
    auto n = [&](const char *k) {
        auto it = fs.find(k);
        return it != fs.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
    };
    std::cout << "fd store: " << n("kept") << " handle(s) kept";
    if (n("not_kept") || n("remove_failed")) {
        std::cout << ", " << n("not_kept") << " NOT KEPT (those bindings end at the next stop), "
                  << n("remove_failed") << " removal(s) not sent";
        auto e = fs.find("last_error");
        if (e != fs.end() && e->is_string())
            std::cout << (fs.value("failing", false) ? " (FAILING: " : " (last error: ")
                      << escape_untrusted(e->get<std::string>()) << ")";
    }
    std::cout << "\n";
}

} // namespace

const char *const daemon_exit_codes =
    "Exit codes: 0 ok; 1 refused (not allowed, no such binding, invalid policy); 2 bad usage, or "
    "the bus or knod-policyd unreachable (the message names the bus address tried and which of "
    "the two is missing).";

void add_bus_options(CLI::App *cmd, BusOptions &o, bool json) {
    cmd->add_option("--bus-address", o.address,
                    "D-Bus address of the daemon's bus (default: the system bus; "
                    "DBUS_SYSTEM_BUS_ADDRESS is honoured)");
    if (json) cmd->add_flag("--json", o.json, "print JSON");
    cmd->footer(daemon_exit_codes);
}

int call_failed(const char *what, const Error &e, const std::string &address) {
    std::cerr << "knod-policy " << what << ": " << e.message;
    if (e.code != Errc::unavailable) {
        std::cerr << "\n";
        return exit_failed;
    }
    std::string tried = client::Client::address_tried(address);
    if (e.message.find(tried) == std::string::npos) std::cerr << " [bus: " << tried << "]";
    std::cerr << "\n";
    return exit_usage;
}

namespace {

// `status`: the daemon's properties, with the data-path and sink figures of its host report.
int run_status(client::Client &client, const BusOptions &o) {
    auto st = client.status();
    if (!st) return call_failed("status", st.error(), o.address);
    nlohmann::json datapath = nlohmann::json::object(), sinks = nlohmann::json::object();
    nlohmann::json fd_store = nlohmann::json::object();
    nlohmann::json notes = nlohmann::json::array();
    if (auto report = client.host_report(); report) {
        auto j = nlohmann::json::parse(*report, nullptr, false);
        if (j.is_object() && j.contains("datapath")) datapath = j["datapath"];
        if (j.is_object() && j.contains("sinks")) sinks = j["sinks"];
        if (j.is_object() && j.contains("fd_store") && j["fd_store"].is_object())
            fd_store = j["fd_store"];
        if (j.is_object() && j.contains("driver_notes") && j["driver_notes"].is_array())
            for (auto &n : j["driver_notes"])
                if (n.is_string()) notes.push_back(n);
    }
    if (o.json) {
        std::cout << knod::dump_json_escaped(
                         nlohmann::json{{"version", st->version},
                                        {"driver", st->driver},
                                        {"bindings", st->bindings},
                                        {"rules", st->rules},
                                        {"permissive", st->permissive},
                                        {"journal_available", st->journal_available},
                                        {"pending_journal_records", st->pending_journal_records},
                                        {"journal_problem", st->journal_problem},
                                        {"journal_write_failures", st->journal_write_failures},
                                        {"anchor_write_failures", st->anchor_write_failures},
                                        {"resource_failures", st->resource_failures},
                                        {"last_resource_failure", st->last_resource_failure},
                                        {"datapath", datapath},
                                        {"driver_notes", notes},
                                        {"sinks", sinks},
                                        {"fd_store", fd_store}},
                         2)
                  << "\n";
    } else {
        std::cout << "knod-policyd " << st->version << ", driver " << st->driver << "\n";
        for (auto &n : notes)
            std::cout << "  " << knod::escape_untrusted(n.get<std::string>()) << "\n";
        std::cout << "rules:    " << st->rules << (st->permissive ? " (PERMISSIVE)" : "") << "\n"
                  << "bindings: " << st->bindings << "\n"
                  << "journal:  "
                  << (!st->journal_available        ? "UNAVAILABLE (requests are refused)"
                      : st->journal_problem.empty() ? "ok"
                                                    : "DEGRADED");
        if (!st->journal_problem.empty())
            std::cout << ": " << knod::escape_untrusted(st->journal_problem);
        else if (st->pending_journal_records)
            std::cout << ", " << st->pending_journal_records << " record(s) waiting for the disk";
        std::cout << "\n";
        if (st->resource_failures)
            std::cout << "resources: " << st->resource_failures
                      << " call(s) refused for want of fds, memory or disk; the last: "
                      << knod::escape_untrusted(st->last_resource_failure) << "\n";
        if (!sinks.empty()) print_sinks(sinks);
        print_fd_store(fd_store);
        if (!datapath.empty()) {
            std::cout << "datapath:";
            for (auto &[k, v] : datapath.items())
                std::cout << " " << k << "=" << v;
            std::cout << "\n";
        }
    }
    return exit_ok;
}

// `revoke ID --reason TEXT`.
int run_revoke(client::Client &client, const BusOptions &o, const std::string &id,
               const std::string &reason) {
    auto r = client.revoke(id, reason);
    if (!r) return call_failed("revoke", r.error(), o.address);
    std::cout << "revoked " << id << "\n";
    return exit_ok;
}

// `reload`: the daemon re-reads its policy files.
int run_reload(client::Client &client, const BusOptions &o) {
    auto r = client.reload();
    if (!r) return call_failed("reload", r.error(), o.address);
    std::cout << "policy reloaded: " << r->first << " rule(s); " << r->second
              << " binding(s) revoked\n";
    return exit_ok;
}

} // namespace

Runner add_daemon_commands(CLI::App &app) {
    auto common = std::make_shared<BusOptions>();
    auto *status =
        app.add_subcommand("status", "Show the daemon's state: driver, rules, bindings, journal.");
    add_bus_options(status, *common, true);
    auto *revoke = app.add_subcommand("revoke", "Revoke a binding at once (admins).");
    add_bus_options(revoke, *common, false);
    auto id = std::make_shared<std::string>();
    auto reason = std::make_shared<std::string>();
    revoke->add_option("ID", *id, "binding id, as `bindings` shows it")->required();
    revoke->add_option("--reason", *reason, "why; recorded in the journal")->required();
    auto *reload = app.add_subcommand(
        "reload", "Make the daemon re-read its policy (admins). An invalid policy is refused and "
                  "the old one kept; bindings the new one forbids are revoked.");
    add_bus_options(reload, *common, false);

    return [=]() -> int {
        if (!status->parsed() && !revoke->parsed() && !reload->parsed()) return -1;
        auto client = client::Client::connect(common->address);
        const char *name = status->parsed() ? "status" : revoke->parsed() ? "revoke" : "reload";
        if (!client) return call_failed(name, client.error(), common->address);
        if (status->parsed()) return run_status(*client, *common);
        if (revoke->parsed()) return run_revoke(*client, *common, *id, *reason);
        return run_reload(*client, *common);
    };
}

} // namespace knod::cli
