#include "daemon/driver/devmem_guards.h"

#include "daemon/driver/ntuple.h"

#include <algorithm>
#include <optional>
#include <set>

namespace knod::driver {

std::string misrouted_note(std::uint64_t packets, std::uint32_t queue, const std::string &netdev) {
    return std::to_string(packets) + " foreign packet(s) landed on queue " + std::to_string(queue) +
           " of " + netdev + " (the guard dropped them)";
}

std::optional<std::string> guard_blinded(const std::string &netdev) {
    auto beside = bpf::FlowFilter::beside_guard(netdev);
    if (!beside)
        return "cannot list what else runs on " + netdev + "'s ingress (" + beside.error().message +
               "), so the devmem guard cannot vouch for it";
    if (beside->empty()) return std::nullopt;
    std::string what;
    for (auto &b : *beside)
        what += (what.empty() ? "" : ", ") + b;
    return what + " on " + netdev +
           "'s ingress can keep packets from the devmem guard, so foreign traffic on its queues "
           "would go unseen";
}

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
        // Refused now rather than ended at the first re-check.
        if (auto blind = guard_blinded(netdev))
            return make_error(Errc::driver_failure,
                              "devmem: " + *blind + " (remove them, or use another NIC)");
        g = guards_.emplace(netdev, std::move(*made)).first;
    }
    // A slot no live binding holds: after a wrap, handing out a held one would replace that
    // binding's flows and queue (its own packets then count as misrouted).
    std::set<std::uint32_t> held;
    for (auto &[other, b] : bindings_)
        held.insert(b.slot);
    std::optional<std::uint32_t> free;
    for (std::uint32_t tries = 1; tries < KNOD_MAX_BINDINGS && !free; ++tries) {
        std::uint32_t candidate = next_slot_++;
        if (next_slot_ >= KNOD_MAX_BINDINGS) next_slot_ = 1;
        if (!held.count(candidate)) free = candidate;
    }
    if (!free)
        return make_error(Errc::driver_failure, "devmem guard: all " +
                                                    std::to_string(KNOD_MAX_BINDINGS - 1) +
                                                    " binding slots are in use");
    std::uint32_t slot = *free;
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
    return {c.bytes, c.packets, c.drops + c.misrouted}; // its own malformed ones, foreign ones
}

void DevmemGuards::add_stats(std::map<std::string, std::uint64_t> &out) const {
    for (auto &[netdev, guard] : guards_) {
        bpf::FilterStats f = guard->stats();
        out[netdev + ".guard.misrouted"] = f.misrouted;
        out[netdev + ".guard.malformed"] = f.malformed;
        out[netdev + ".guard.fragments"] = f.fragments;
    }
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
            if (c.misrouted) out[id] = misrouted_note(c.misrouted, b.queue, b.netdev);
        }
        if (!out.count(id) && recheck) {
            if (auto blind = guard_blinded(b.netdev))
                out[id] = *blind;
            else if (auto rss = FlowSteering::check_not_in_rss(b.netdev, b.queue); !rss)
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
