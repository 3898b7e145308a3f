#include "daemon/driver/hardware_inventory.h"

#include "knod/untrusted.h"

#include "host/gpu_inventory.h"
#include "host/netdev_inventory.h"

#include <algorithm>

namespace knod::driver {

HardwareInventory::HardwareInventory(host::HostPaths paths) : paths_(std::move(paths)) {
    for (auto &g : host::list_gpus(paths_)) {
        GpuInfo i;
        i.name = g.pci;
        i.names = host::names_of(g); // the names `explain` resolves too
        i.vram_bytes = g.vram_bytes;
        i.pci = g.pci;
        gpus_.push_back(std::move(i));
    }
}

std::vector<NetdevInfo> HardwareInventory::netdevs() const {
    std::vector<NetdevInfo> out;
    auto list = host::list_netdevs(paths_);
    if (!list) return out;
    for (auto &n : *list)
        if (n.name != "lo") out.push_back({n.name, n.rx_queues, n.pci});
    return out;
}

Result<GpuInfo> HardwareInventory::gpu(const std::string &name) const {
    auto it = std::find_if(gpus_.begin(), gpus_.end(), [&](const GpuInfo &g) {
        return std::find(g.names.begin(), g.names.end(), name) != g.names.end();
    });
    if (it == gpus_.end())
        return make_error(Errc::invalid_argument, "gpu: no GPU named " + quote_untrusted(name) +
                                                      " (use a PCI address or render node)");
    return *it;
}

Result<NetdevInfo> HardwareInventory::netdev(const std::string &name) const {
    for (auto &n : netdevs())
        if (n.name == name) return n;
    return make_error(Errc::invalid_argument,
                      "netdev: no network device named " + quote_untrusted(name));
}

} // namespace knod::driver
