#include "daemon/driver/sim_driver.h"

namespace knod::driver {

Result<GpuInfo> SimDriver::gpu(const std::string &name) const {
    if (name != config_.gpu)
        return make_error(Errc::invalid_argument,
                          "gpu: no GPU named '" + name + "' (the sim has '" + config_.gpu + "')");
    return gpus().front();
}

Result<NetdevInfo> SimDriver::netdev(const std::string &name) const {
    if (name != config_.netdev)
        return make_error(Errc::invalid_argument, "netdev: no device named '" + name +
                                                      "' (the sim has '" + config_.netdev + "')");
    return netdevs().front();
}

std::vector<GpuInfo> SimDriver::gpus() const {
    return {{config_.gpu, {config_.gpu}, config_.vram_bytes}};
}

std::vector<NetdevInfo> SimDriver::netdevs() const {
    return {{config_.netdev, config_.queues}};
}

Result<std::vector<std::uint32_t>> SimDriver::attach(const BindingPlan &plan) {
    if (config_.queues < 2)
        return make_error(Errc::driver_failure, "netdev " + plan.netdev + " has no offload queue");
    // Queue 0 stays with the normal stack, as on a real NIC with steering rules. Bindings go to
    // the least loaded offload queue; the filter tags each packet with its binding, so bindings
    // sharing a queue are still told apart.
    std::map<std::uint32_t, std::size_t> load;
    for (std::uint32_t q = 1; q < config_.queues; ++q)
        load[q] = 0;
    for (auto &[id, slot] : slots_)
        ++load[slot.queue];
    std::uint32_t best = 1;
    for (auto &[q, n] : load)
        if (n < load[best]) best = q;
    slots_[plan.id] = Slot{plan, best, false};
    return std::vector<std::uint32_t>{best};
}

Result<void> SimDriver::activate(const std::string &id) {
    auto it = slots_.find(id);
    if (it == slots_.end())
        return make_error(Errc::driver_failure, "binding " + id + " is not attached");
    it->second.active = true;
    return {};
}

void SimDriver::detach(const std::string &id) {
    slots_.erase(id);
}

journal::Counters SimDriver::counters(const std::string &) const {
    return {};
}

} // namespace knod::driver
