// The backend for a host with nothing to drive: no KNOD device and no devmem-capable NIC, and
// the sim not asked for. The daemon still serves its status, the host report and the audit
// API; every RequestBinding is refused with DriverFailure saying why (and journaled), so a
// packaged service on such a host starts and stays up instead of failing into a restart loop.
#pragma once

#include "daemon/driver/driver.h"

namespace knod::driver {

class NoDriver : public Driver {
  public:
    // `why`: what --driver=auto found (one line a person can act on).
    explicit NoDriver(std::string why);
    std::string name() const override { return "none"; }
    RegionKind region_kind() const override { return RegionKind::dma_buf; }
    Result<GpuInfo> gpu(const std::string &name) const override;
    Result<NetdevInfo> netdev(const std::string &name) const override;
    std::vector<GpuInfo> gpus() const override { return {}; }
    std::vector<NetdevInfo> netdevs() const override { return {}; }
    Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) override;
    Result<void> activate(const std::string &id) override;
    void detach(const std::string &) override {}
    Counters counters(const std::string &) const override { return {}; }
    bool netdevs_are_links() const override { return false; }
    std::optional<std::string> unavailable() const override { return why_; }

  private:
    std::string why_;
};

} // namespace knod::driver
