#include "daemon/flow_claims.h"

#include <algorithm>

namespace knod::daemon {

void FlowClaims::claim(const std::string &netdev, const std::string &binding, uid_t owner,
                       std::vector<policy::FlowSpec> flows) {
    release(binding);
    Device &dev = devices_[netdev];
    dev.bindings += 1;
    for (auto &f : flows) {
        Held h{binding, owner, f};
        if (!is_narrow(f.dst.ports)) {
            dev.wide.push_back(std::move(h));
            continue;
        }
        for (unsigned p = f.dst.ports.lo; p <= f.dst.ports.hi; ++p)
            dev.by_port[static_cast<std::uint16_t>(p)].push_back(h);
    }
    where_[binding] = {netdev, std::move(flows)};
}

void FlowClaims::release(const std::string &binding) {
    auto w = where_.find(binding);
    if (w == where_.end()) return;
    auto dev = devices_.find(w->second.first);
    if (dev != devices_.end()) {
        auto mine = [&](const Held &h) { return h.binding == binding; };
        for (auto &f : w->second.second) {
            if (!is_narrow(f.dst.ports)) continue;
            for (unsigned p = f.dst.ports.lo; p <= f.dst.ports.hi; ++p) {
                auto bucket = dev->second.by_port.find(static_cast<std::uint16_t>(p));
                if (bucket == dev->second.by_port.end()) continue;
                std::erase_if(bucket->second, mine);
                if (bucket->second.empty()) dev->second.by_port.erase(bucket);
            }
        }
        std::erase_if(dev->second.wide, mine);
        if (--dev->second.bindings == 0) devices_.erase(dev);
    }
    where_.erase(w);
}

std::optional<FlowConflict> FlowClaims::conflict(const std::string &netdev,
                                                 const std::vector<policy::FlowSpec> &flows) const {
    auto dev = devices_.find(netdev);
    if (dev == devices_.end()) return std::nullopt;
    const Device &d = dev->second;
    for (std::size_t i = 0; i < flows.size(); ++i) {
        const policy::FlowSpec &f = flows[i];
        auto check = [&](const std::vector<Held> &held) -> std::optional<FlowConflict> {
            for (auto &h : held)
                if (h.flow.overlaps(f)) return FlowConflict{h.binding, h.owner, i, h.flow};
            return std::nullopt;
        };
        if (auto c = check(d.wide)) return c;
        if (is_narrow(f.dst.ports)) {
            for (unsigned p = f.dst.ports.lo; p <= f.dst.ports.hi; ++p)
                if (auto bucket = d.by_port.find(static_cast<std::uint16_t>(p));
                    bucket != d.by_port.end())
                    if (auto c = check(bucket->second)) return c;
        } else {
            for (auto &[port, held] : d.by_port)
                if (f.dst.ports.lo <= port && port <= f.dst.ports.hi)
                    if (auto c = check(held)) return c;
        }
    }
    return std::nullopt;
}

} // namespace knod::daemon
