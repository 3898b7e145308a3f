#include "daemon/flow_claims.h"

namespace knod::daemon {

void FlowClaims::claim(const std::string &netdev, const std::string &binding, uid_t owner,
                       std::vector<policy::FlowSpec> flows) {
    release(binding);
    by_netdev_[netdev][binding] = Claim{owner, std::move(flows)};
    where_[binding] = netdev;
}

void FlowClaims::release(const std::string &binding) {
    auto w = where_.find(binding);
    if (w == where_.end()) return;
    auto dev = by_netdev_.find(w->second);
    if (dev != by_netdev_.end()) {
        dev->second.erase(binding);
        if (dev->second.empty()) by_netdev_.erase(dev);
    }
    where_.erase(w);
}

std::optional<FlowConflict> FlowClaims::conflict(const std::string &netdev,
                                                 const std::vector<policy::FlowSpec> &flows) const {
    auto dev = by_netdev_.find(netdev);
    if (dev == by_netdev_.end()) return std::nullopt;
    for (auto &[binding, claim] : dev->second)
        for (auto &held : claim.flows)
            for (std::size_t i = 0; i < flows.size(); ++i)
                if (held.overlaps(flows[i])) return FlowConflict{binding, claim.owner, i, held};
    return std::nullopt;
}

} // namespace knod::daemon
