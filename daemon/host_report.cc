#include "daemon/host_report.h"

#include "daemon/fd_store.h"

#include "host/report.h"
#include "knod/json.h"

#include <nlohmann/json.hpp>

namespace knod::daemon {

std::string host_report_json(const BindingManager &manager) {
    const auto &d = manager.driver();
    nlohmann::json j{{"driver", d.name()}};
    j["netdevs"] = nlohmann::json::array();
    for (auto &n : d.netdevs())
        j["netdevs"].push_back({{"name", n.name}, {"rx_queues", n.rx_queues}});
    j["gpus"] = nlohmann::json::array();
    for (auto &g : d.gpus())
        j["gpus"].push_back({{"name", g.name}, {"names", g.names}, {"vram_bytes", g.vram_bytes}});
    j["datapath"] = d.stats();
    j["driver_notes"] = d.notes();
    // Inventory and isolation checks, as `knod-policy doctor --json` prints them.
    if (auto host = host::build_report(manager.host_paths()))
        j["host"] = host->to_json();
    else
        j["host"] = {{"error", host.error().message}};
    auto st = manager.status();
    nlohmann::json each = nlohmann::json::array();
    std::uint64_t failed = 0;
    for (auto &k : st.sink_stats) {
        failed += k.failed;
        each.push_back({{"name", k.name},
                        {"written", k.written},
                        {"failed", k.failed},
                        {"dropped", k.dropped},
                        {"failing", k.failing},
                        {"last_error", k.last_error},
                        {"heads_written", k.heads_written},
                        {"last_head_seq", k.last_head_seq}});
    }
    j["sinks"] = {
        {"names", st.sinks}, {"dropped", st.sink_dropped}, {"failed", failed}, {"each", each}};
    j["fd_store"] = fd_store_json();
    j["journal"] = {{"available", st.journal_available},
                    {"pending_records", st.pending_records},
                    {"dropped_records", st.journal_dropped}};
    return knod::dump_json(j);
}

} // namespace knod::daemon
