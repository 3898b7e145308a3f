// The knod backend: the KNOD patch's control interface under /sys/class/knod. The patch's ABI is
// not final (v3, under review); this is the interface as this project reads it, kept in one
// place so that it changes in one place (docs/drivers.md):
//
//   /sys/class/knod/knodN/netdev      the NIC it offloads ("eth2")
//   /sys/class/knod/knodN/gpu         the GPU's PCI address
//   /sys/class/knod/knodN/rx_queues   offload queues, numbered 1..N-1 (0 stays with the kernel)
//   /sys/class/knod/knodN/bind        write "ID QUEUE FD OFFSET LENGTH FLOW[;FLOW...]": the
//                                     module takes the dma-buf FD from the writer's fd table
//                                     and steers exactly those flows to QUEUE
//   /sys/class/knod/knodN/unbind      write "ID"
//   /sys/class/knod/knodN/stats       read "ID RX_BYTES RX_PACKETS DROPPED" lines
#pragma once

#include "daemon/driver/driver.h"
#include "daemon/driver/hardware_inventory.h"

#include <map>

namespace knod::driver {

struct KnodDevice {
    std::string name;   // "knod0"
    std::string netdev; // "eth2"
    std::string gpu;    // "0000:03:00.0"
    std::uint32_t rx_queues = 0;
};

// Every KNOD device under SYSFS/class/knod.
std::vector<KnodDevice> knod_devices(const host::HostPaths &paths);

class KnodDriver : public Driver {
  public:
    // Fails when /sys/class/knod lists no device.
    static Result<std::unique_ptr<KnodDriver>> open(host::HostPaths paths);

    std::string name() const override { return "knod"; }
    RegionKind region_kind() const override { return RegionKind::dma_buf; }
    Result<GpuInfo> gpu(const std::string &name) const override;
    Result<NetdevInfo> netdev(const std::string &name) const override;
    std::vector<GpuInfo> gpus() const override;
    std::vector<NetdevInfo> netdevs() const override;

    Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) override;
    Result<void> activate(const std::string &id) override;
    void detach(const std::string &id) override;
    Counters counters(const std::string &id) const override;

  private:
    KnodDriver(host::HostPaths paths, std::vector<KnodDevice> devices)
        : inventory_(std::move(paths)), devices_(std::move(devices)) {}
    const KnodDevice *device_for(const std::string &netdev, const std::string &gpu) const;
    Result<void> write_control(const KnodDevice &d, const char *file,
                               const std::string &line) const;

    struct Binding {
        BindingPlan plan;
        const KnodDevice *device = nullptr;
        std::uint32_t queue = 0;
        bool active = false;
    };

    HardwareInventory inventory_;
    std::vector<KnodDevice> devices_;
    std::map<std::string, Binding> bindings_;
};

} // namespace knod::driver
