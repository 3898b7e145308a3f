#include "daemon/driver/devmem_guards.h"

#include "daemon/driver/ntuple.h"

#include <algorithm>

namespace knod::driver {

Result<void> DevmemGuards::add(const std::string &id, const std::string &netdev,
                               std::uint32_t queue, const std::vector<policy::FlowSpec> &flows,
                               const std::vector<std::uint32_t> &own_rules) {
    if (queue >= KNOD_MAX_QUEUES)
        return make_error(Errc::driver_failure, "devmem guard: queue " + std::to_string(queue) +
                                                    " is past the guard's index");
    auto g = guards_.find(netdev);
    if (g == guards_.end()) {
        bpf::FilterOptions o;
        o.pin_root = pin_root_;
        // A crashed daemon's guard: its pins go, and attach_guard replaces its tc filter.
        (void)bpf::FlowFilter::remove_pinned(pin_root_, netdev);
        auto made = bpf::FlowFilter::attach_guard(netdev, o);
        if (!made) return std::move(made).error().context("devmem guard on " + netdev);
        g = guards_.emplace(netdev, std::move(*made)).first;
    }
    std::uint32_t slot = next_slot_++;
    if (next_slot_ >= KNOD_MAX_BINDINGS) next_slot_ = 1;
    auto &guard = *g->second;
    // Flows first, then the queue: a packet never meets an active slot without its rules.
    if (auto r = guard.set_flows(slot, flows); !r)
        return std::move(r).error().context("devmem guard");
    if (auto r = guard.set_slot(slot, bpf::SlotState::active, queue); !r) {
        (void)guard.remove(slot);
        return std::move(r).error().context("devmem guard");
    }
    bindings_[id] = Guarded{netdev, queue, slot, own_rules, false};
    return {};
}

void DevmemGuards::set_own_rules(const std::string &id, const std::vector<std::uint32_t> &rules) {
    auto it = bindings_.find(id);
    if (it != bindings_.end()) it->second.own_rules = rules;
}

void DevmemGuards::remove(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    std::string netdev = it->second.netdev;
    auto g = guards_.find(netdev);
    if (g != guards_.end()) (void)g->second->remove(it->second.slot);
    bindings_.erase(it);
    bool used = std::any_of(bindings_.begin(), bindings_.end(),
                            [&](auto &b) { return b.second.netdev == netdev; });
    if (!used && g != guards_.end()) guards_.erase(g); // detaches and unpins
}

Counters DevmemGuards::counters(const std::string &id) const {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return {};
    auto g = guards_.find(it->second.netdev);
    if (g == guards_.end()) return {};
    bpf::SlotCounters c = g->second->counters(it->second.slot);
    return {c.bytes, c.packets, c.misrouted};
}

std::map<std::string, std::string> DevmemGuards::drifted(std::int64_t now_us) {
    std::map<std::string, std::string> out;
    bool recheck = now_us - last_recheck_us_ >= recheck_us;
    if (recheck) last_recheck_us_ = now_us;
    for (auto &[id, b] : bindings_) {
        if (b.reported) continue;
        std::string where = "queue " + std::to_string(b.queue) + " of " + b.netdev;
        auto g = guards_.find(b.netdev);
        if (g != guards_.end()) {
            bpf::SlotCounters c = g->second->counters(b.slot);
            if (c.misrouted)
                out[id] = std::to_string(c.misrouted) + " foreign packet(s) landed on " + where +
                          " (the devmem guard dropped them)";
        }
        if (!out.count(id) && recheck) {
            if (auto rss = FlowSteering::check_not_in_rss(b.netdev, b.queue); !rss)
                out[id] = rss.error().message;
            else if (auto rules = FlowSteering::rules_to_queue(b.netdev, b.queue); !rules)
                out[id] = rules.error().message; // unreadable: fail closed
            else
                for (auto loc : *rules)
                    if (std::find(b.own_rules.begin(), b.own_rules.end(), loc) ==
                        b.own_rules.end()) {
                        out[id] = "ntuple rule " + std::to_string(loc) +
                                  ", not the binding's, steers to " + where;
                        break;
                    }
        }
        if (out.count(id)) b.reported = true;
    }
    return out;
}

const bpf::FlowFilter *DevmemGuards::guard(const std::string &netdev) const {
    auto g = guards_.find(netdev);
    return g == guards_.end() ? nullptr : g->second.get();
}

} // namespace knod::driver
