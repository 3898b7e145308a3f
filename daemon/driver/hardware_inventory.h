// The hardware backends' view of the host inventory: GPUs and netdevs as the Driver interface
// names them (a GPU by PCI address, also by render node; a netdev by name).
#pragma once

#include "daemon/driver/driver.h"
#include "daemon/host/paths.h"

namespace knod::driver {

class HardwareInventory {
  public:
    explicit HardwareInventory(host::HostPaths paths) : paths_(std::move(paths)) {}
    std::vector<GpuInfo> gpus() const;
    std::vector<NetdevInfo> netdevs() const; // every device but loopback
    Result<GpuInfo> gpu(const std::string &name) const;
    Result<NetdevInfo> netdev(const std::string &name) const;
    const host::HostPaths &paths() const { return paths_; }

  private:
    host::HostPaths paths_;
};

} // namespace knod::driver
