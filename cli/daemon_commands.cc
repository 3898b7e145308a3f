// Commands that talk to knod-policyd over D-Bus: status, bindings, revoke, reload.
#include "cli/commands.h"
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
        if (k.value("failing", false))
            std::cout << " (FAILING: " << escape_untrusted(k.value("last_error", "")) << ")";
        else if (k.value("failed", std::uint64_t{0}) > 0)
            std::cout << " (works again; last error: "
                      << escape_untrusted(k.value("last_error", "")) << ")";
        std::cout << "\n";
    }
}

struct Common {
    std::string address;
    bool json = false;
};

void add_common(CLI::App *cmd, Common &c, bool json) {
    cmd->add_option("--bus-address", c.address,
                    "D-Bus address of the daemon's bus (default: the system bus; "
                    "DBUS_SYSTEM_BUS_ADDRESS is honoured)");
    if (json) cmd->add_flag("--json", c.json, "print JSON");
}

int failed(const char *what, const Error &e) {
    std::cerr << "knod-policy " << what << ": " << e.message << "\n";
    return e.code == Errc::unavailable ? exit_usage : exit_failed;
}

} // namespace

Runner add_daemon_commands(CLI::App &app) {
    auto common = std::make_shared<Common>();
    auto *status =
        app.add_subcommand("status", "Show the daemon's state: driver, rules, bindings, journal.");
    add_common(status, *common, true);
    auto *bindings = app.add_subcommand(
        "bindings", "List bindings: your own, or all of them for auditors and admins.");
    add_common(bindings, *common, true);
    auto *revoke = app.add_subcommand("revoke", "Revoke a binding at once (admins).");
    add_common(revoke, *common, false);
    auto id = std::make_shared<std::string>();
    auto reason = std::make_shared<std::string>();
    revoke->add_option("ID", *id, "binding id, as `bindings` shows it")->required();
    revoke->add_option("--reason", *reason, "why; recorded in the journal")->required();
    auto *reload = app.add_subcommand(
        "reload", "Make the daemon re-read its policy (admins). An invalid policy is refused and "
                  "the old one kept; bindings the new one forbids are revoked.");
    add_common(reload, *common, false);

    return [=]() -> int {
        if (!status->parsed() && !bindings->parsed() && !revoke->parsed() && !reload->parsed())
            return -1;
        auto client = client::Client::connect(common->address);
        if (!client) return failed("connect", client.error());
        if (status->parsed()) {
            auto st = client->status();
            if (!st) return failed("status", st.error());
            nlohmann::json datapath = nlohmann::json::object(), sinks = nlohmann::json::object();
            if (auto report = client->host_report(); report) {
                auto j = nlohmann::json::parse(*report, nullptr, false);
                if (j.is_object() && j.contains("datapath")) datapath = j["datapath"];
                if (j.is_object() && j.contains("sinks")) sinks = j["sinks"];
            }
            if (common->json) {
                std::cout << knod::dump_json(
                                 nlohmann::json{
                                     {"version", st->version},
                                     {"driver", st->driver},
                                     {"bindings", st->bindings},
                                     {"rules", st->rules},
                                     {"permissive", st->permissive},
                                     {"journal_available", st->journal_available},
                                     {"pending_journal_records", st->pending_journal_records},
                                     {"datapath", datapath},
                                     {"sinks", sinks}},
                                 2)
                          << "\n";
            } else {
                std::cout << "knod-policyd " << st->version << ", driver " << st->driver << "\n"
                          << "rules:    " << st->rules << (st->permissive ? " (PERMISSIVE)" : "")
                          << "\n"
                          << "bindings: " << st->bindings << "\n"
                          << "journal:  "
                          << (st->journal_available ? "ok" : "UNAVAILABLE (requests are refused)");
                if (st->pending_journal_records)
                    std::cout << ", " << st->pending_journal_records
                              << " record(s) waiting for the disk";
                std::cout << "\n";
                if (!sinks.empty()) print_sinks(sinks);
                if (!datapath.empty()) {
                    std::cout << "datapath:";
                    for (auto &[k, v] : datapath.items())
                        std::cout << " " << k << "=" << v;
                    std::cout << "\n";
                }
            }
            return exit_ok;
        }
        if (bindings->parsed()) {
            auto list = client->list();
            if (!list) return failed("bindings", list.error());
            // Details per binding; one that ended meanwhile is shown without them.
            std::vector<std::optional<client::BindingDetails>> details;
            for (auto &b : *list) {
                auto d = client->details(b.id);
                details.push_back(d ? std::optional(*d) : std::nullopt);
            }
            if (common->json) {
                nlohmann::json out = nlohmann::json::array();
                for (std::size_t i = 0; i < list->size(); ++i) {
                    auto &b = (*list)[i];
                    nlohmann::json j{
                        {"id", b.id},   {"path", b.path}, {"netdev", b.netdev},
                        {"gpu", b.gpu}, {"mode", b.mode}, {"state", b.state},
                        {"uid", b.uid}, {"pid", b.pid},   {"region_bytes", b.region_bytes}};
                    if (auto &d = details[i]) {
                        j["rule"] = d->rule;
                        j["flows"] = d->flows;
                        j["created_us"] = d->created_us;
                        j["expires_us"] = d->expires_us;
                        j["rx_bytes"] = d->rx_bytes;
                        j["rx_packets"] = d->rx_packets;
                        j["dropped_packets"] = d->dropped_packets;
                    }
                    out.push_back(std::move(j));
                }
                std::cout << knod::dump_json(out, 2) << "\n";
            } else if (list->empty()) {
                std::cout << "no bindings\n";
            } else {
                auto now_us = static_cast<std::uint64_t>(
                    std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count());
                auto expires_in = [&](std::uint64_t us) {
                    if (us <= now_us) return std::string("now");
                    std::uint64_t s = (us - now_us) / 1000000;
                    return s >= 3600 ? std::to_string(s / 3600) + "h" +
                                           std::to_string(s % 3600 / 60) + "m"
                                     : std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
                };
                std::cout << std::left << std::setw(18) << "ID" << std::setw(10) << "NETDEV"
                          << std::setw(8) << "GPU" << std::setw(8) << "STATE" << std::setw(7)
                          << "UID" << std::setw(8) << "PID" << std::setw(10) << "REGION"
                          << std::setw(14) << "RULE" << std::setw(9) << "EXPIRES"
                          << "RX BYTES/PACKETS\n";
                for (std::size_t i = 0; i < list->size(); ++i) {
                    auto &b = (*list)[i];
                    auto &d = details[i];
                    std::cout << std::setw(18) << b.id << std::setw(10) << b.netdev << std::setw(8)
                              << b.gpu << std::setw(8) << b.state << std::setw(7) << b.uid
                              << std::setw(8) << b.pid << std::setw(10) << b.region_bytes
                              << std::setw(14) << (d ? d->rule : "-") << std::setw(9)
                              << (d ? expires_in(d->expires_us) : "-")
                              << (d ? std::to_string(d->rx_bytes) + "/" +
                                          std::to_string(d->rx_packets)
                                    : "-")
                              << "\n";
                    if (d)
                        for (auto &f : d->flows)
                            std::cout << "    flow " << f << "\n";
                }
            }
            return exit_ok;
        }
        if (revoke->parsed()) {
            auto r = client->revoke(*id, *reason);
            if (!r) return failed("revoke", r.error());
            std::cout << "revoked " << *id << "\n";
            return exit_ok;
        }
        auto r = client->reload();
        if (!r) return failed("reload", r.error());
        std::cout << "policy reloaded: " << r->first << " rule(s); " << r->second
                  << " binding(s) revoked\n";
        return exit_ok;
    };
}

} // namespace knod::cli
