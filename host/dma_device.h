// Whether the kernel may be asked to bind a dma-buf to a netdev's queues at all. bind-rx maps
// the dma-buf for the netdev's parent device; Linux 6.12 does so before it looks at anything
// else, and a netdev without a parent (veth, lo) or with one that cannot do DMA (netdevsim,
// virtio-net's virtio device) makes it log a kernel WARNING, which panics a host booted with
// panic_on_warn. Every devmem-capable driver (gve, bnxt_en, mlx5_core, fbnic) hangs its netdev
// directly off a PCI function, so that is the rule: the parent must be on the PCI bus.
// The parent is read from rtnetlink by ifindex (IFLA_PARENT_DEV_*), in the caller's network
// namespace, not from /sys, whose class/net shows the namespace that mounted it.
#pragma once

#include "knod/result.h"

#include <string>

namespace knod::driver {

struct NetdevParent {
    std::string netdev; // the netdev's own name
    std::string device; // the parent device ("0000:00:02.0", "netdevsim1", "virtio0"); empty: none
    std::string bus;    // its bus ("pci", "netdevsim", "virtio"); empty: none
};

// The netdev's parent device, or not_found when there is no netdev with that ifindex.
Result<NetdevParent> netdev_parent(int ifindex);

// Fails (driver_failure) unless the netdev's parent is a PCI function, with the reason and the fix.
Result<void> require_dma_device(int ifindex);

} // namespace knod::driver
