// The sim backend's control half: a simulated NIC with a fixed number of RX queues and a
// simulated GPU, with the same bookkeeping a hardware backend does (one queue per binding,
// inactive until the key is presented). The data path (veth, XDP, AF_XDP) plugs in here.
#pragma once

#include "daemon/driver/driver.h"

#include <map>

namespace knod::driver {

struct SimConfig {
    std::string netdev = "knodsim0";
    std::uint32_t queues = 4;
    std::string gpu = "sim0";
    std::uint64_t vram_bytes = 1ull << 30;
};

class SimDriver : public Driver {
  public:
    explicit SimDriver(SimConfig config) : config_(std::move(config)) {}

    std::string name() const override { return "sim"; }
    RegionKind region_kind() const override { return RegionKind::memfd; }
    Result<GpuInfo> gpu(const std::string &name) const override;
    Result<NetdevInfo> netdev(const std::string &name) const override;
    std::vector<GpuInfo> gpus() const override;
    std::vector<NetdevInfo> netdevs() const override;

    Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) override;
    Result<void> activate(const std::string &id) override;
    void detach(const std::string &id) override;
    journal::Counters counters(const std::string &id) const override;

  private:
    struct Slot {
        BindingPlan plan;
        std::uint32_t queue = 0;
        bool active = false;
    };
    SimConfig config_;
    std::map<std::string, Slot> slots_;
};

} // namespace knod::driver
