#include "daemon/driver/selection.h"

#include "daemon/driver/knod_driver.h"
#include "host/gpu_inventory.h"
#include "host/netdev_genl.h"
#include "host/netdev_inventory.h"

namespace knod::driver {

DriverChoice choose_driver(const host::HostPaths &paths) {
    auto knod = knod_devices(paths);
    if (!knod.empty())
        return {"knod", "knod: " + std::to_string(knod.size()) + " device(s) under " + paths.sysfs +
                            "/class/knod (first: " + knod.front().name + ", " +
                            knod.front().netdev + " -> " + knod.front().gpu + ")"};
    std::string why = "no KNOD device under " + paths.sysfs + "/class/knod";

    auto genl = NetdevGenl::open();
    if (!genl) return {"none", why + "; devmem: " + genl.error().message};
    std::string nic;
    if (auto netdevs = host::list_netdevs(paths))
        for (auto &n : *netdevs)
            if (!n.pci.empty() && host::devmem_capable_driver(n.driver)) {
                nic = n.name + " (" + n.driver + ")";
                break;
            }
    if (nic.empty())
        return {"none", why + "; devmem: the kernel has the netdev family, but no NIC's driver "
                              "supports devmem TCP (gve, bnxt_en, mlx5_core, fbnic)"};
    auto gpus = host::list_gpus(paths);
    if (gpus.empty())
        return {"none", why + "; devmem: " + nic + " supports devmem TCP, but there is no GPU"};
    return {"devmem", why + "; devmem: " + nic + " supports devmem TCP, GPU " + gpus.front().pci};
}

} // namespace knod::driver
