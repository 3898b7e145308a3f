// Network devices on the host: ifindex, state, RX queues, driver, parent PCI device. On the live
// machine rtnetlink (libnl-route) lists them in the daemon's namespace, and sysfs adds driver and
// parent; on fixture trees sysfs alone does (class/net/NAME).
#pragma once

#include "host/paths.h"
#include "knod/result.h"

#include <cstdint>
#include <string>
#include <vector>

namespace knod::host {

struct Netdev {
    std::string name;
    int ifindex = 0;
    std::string state; // operstate: "up", "down", "unknown", ...
    bool admin_up = false;
    // Active RX queues (the kernel's real_num_rx_queues: what queue-get lists and bind-rx
    // accepts), not the allocated count rtnetlink's IFLA_NUM_RX_QUEUES gives.
    std::uint32_t rx_queues = 0;
    std::uint32_t rx_queues_allocated = 0; // IFLA_NUM_RX_QUEUES; 0 where unknown (fixtures)
    // Where rx_queues came from: "sysfs" (queues/rx-N), "ethtool" (channels), or "allocated"
    // when neither was readable and the allocated count stands in for it.
    std::string rx_queues_source;
    std::string kind;   // rtnetlink link kind: "veth", "vlan"; empty for plain devices
    std::string driver; // "mlx5_core", "virtio_net"
    std::string pci;    // parent PCI function; empty for virtual devices
};

Result<std::vector<Netdev>> list_netdevs(const HostPaths &paths);

// Drivers that implement the queue management the kernel's devmem TCP needs (netdev bind-rx).
bool devmem_capable_driver(const std::string &driver);

} // namespace knod::host
