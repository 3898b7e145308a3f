// The hardware backends' view of the host inventory: GPUs and netdevs as the Driver interface
// names them (a GPU by PCI address, also by render node; a netdev by name). GPUs are listed once,
// at start (libdrm opens every render node to ask amdgpu; GPUs do not come and go under a
// running daemon); netdevs are asked for each time, since links do.
#pragma once

#include "daemon/driver/driver.h"
#include "host/paths.h"

namespace knod::driver {

class HardwareInventory {
  public:
    explicit HardwareInventory(host::HostPaths paths);
    const std::vector<GpuInfo> &gpus() const { return gpus_; }
    std::vector<NetdevInfo> netdevs() const; // every device but loopback
    Result<GpuInfo> gpu(const std::string &name) const;
    Result<NetdevInfo> netdev(const std::string &name) const;
    const host::HostPaths &paths() const { return paths_; }

  private:
    host::HostPaths paths_;
    std::vector<GpuInfo> gpus_;
};

} // namespace knod::driver
