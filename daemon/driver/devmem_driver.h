// The devmem backend: the upstream device-memory TCP interface. A binding reserves one free RX
// queue at attach (one RSS does not spread other traffic onto); activation (after the holder's key)
// binds the holder's dma-buf to that queue with netdev bind-rx on a netlink socket of the binding's
// own, and steers exactly the binding's flows to it with ntuple rules. Detach removes the rules and
// closes the socket, which makes the kernel unbind.
#pragma once

#include "daemon/driver/devmem_guards.h"
#include "daemon/driver/driver.h"
#include "daemon/driver/hardware_inventory.h"
#include "host/dma_device.h"
#include "host/netdev_genl.h"

#include <functional>
#include <map>
#include <optional>

namespace knod::driver {

// The RX queue a new binding gets on `netdev`: the highest one that no dma-buf, io_uring or
// AF_XDP owns and `reserved` (our other bindings) does not hold; never queue 0. The error says
// whether the NIC has only one queue or all of them are taken.
Result<std::uint32_t> choose_rx_queue(const std::string &netdev,
                                      const std::vector<NetdevQueue> &queues,
                                      const std::function<bool(std::uint32_t)> &reserved);

// The request-time device check: a PCI parent (require_dma_device), then what bind-rx would
// refuse (header split on, hds-thresh 0, no XDP program: host::require_devmem_ready).
Result<void> require_devmem_device(int ifindex);

// devmem receive is TCP only: a granted UDP (or any-protocol) flow could never be delivered, so
// the backend refuses it (invalid_argument) with what to do instead.
Result<void> require_tcp_flows(const std::vector<policy::FlowSpec> &flows);
// InvalidArgument unless the plan's window is its whole region fd (offset 0, length its size):
// bind-rx has no window, the NIC may write anywhere in the dma-buf.
Result<void> require_whole_region(const BindingPlan &plan);

class DevmemDriver : public Driver {
  public:
    // Whether a netdev may carry a binding at all: require_devmem_device, asked at attach
    // (request time). Tests of queue reservation on veth pass one that lets it through; bind-rx
    // itself checks the DMA device again whatever this says.
    using DeviceCheck = std::function<Result<void>(int ifindex)>;
    // Fails when the kernel has no netdev family.
    // `pin_root`: where each NIC's devmem guard is pinned (the daemon's --bpf-pin-root).
    static Result<std::unique_ptr<DevmemDriver>> open(host::HostPaths paths,
                                                      DeviceCheck check = require_devmem_device,
                                                      std::string pin_root = "/sys/fs/bpf/knod");

    std::string name() const override { return "devmem"; }
    RegionKind region_kind() const override { return RegionKind::dma_buf; }
    Result<GpuInfo> gpu(const std::string &name) const override { return inventory_.gpu(name); }
    Result<NetdevInfo> netdev(const std::string &name) const override {
        return inventory_.netdev(name);
    }
    std::vector<GpuInfo> gpus() const override { return inventory_.gpus(); }
    std::vector<NetdevInfo> netdevs() const override { return inventory_.netdevs(); }

    Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) override;
    Result<void> activate(const std::string &id) override;
    void detach(const std::string &id) override;
    // A restart keeps an active binding's netlink socket in the fd store (the kernel binding
    // lives as long as any copy of it) and its ntuple rules on the NIC; the next start holds the
    // socket that came back instead of binding again.
    std::map<std::string, int> handles(const std::string &id) const override;
    std::optional<std::string> handoff(const std::string &id) const override;
    Result<std::vector<std::uint32_t>> readopt(const BindingPlan &plan, bool active,
                                               const std::string &handoff,
                                               std::map<std::string, UniqueFd> handles) override;
    // Removes the ntuple rules of a binding that was not taken back.
    void abandon(const std::string &netdev, const std::string &handoff) override;
    // From the binding's devmem guard: its packets and bytes on its queue, and as dropped the
    // foreign packets the guard dropped there.
    Counters counters(const std::string &id) const override { return guards_.counters(id); }
    // What bind-rx returned at activation (kept across a restart in the handoff record; a
    // record of an older daemon without it: none).
    std::optional<std::uint32_t> dmabuf_id(const std::string &id) const override;
    // The NIC's own counters of the binding's RX queue (qstats-get), where the driver keeps
    // them; nullopt otherwise. They count every packet the NIC put on the queue since the
    // driver started it, foreign ones included, so RxBytes/RxPackets stay the guard's (the
    // binding's flows only, since the binding began) and these are shown beside them.
    Result<std::optional<QueueStats>> queue_stats(const std::string &id);
    // For the host report: per bound RX queue, the NIC's qstats (NETDEV.rx-queue-N.nic_rx_bytes
    // and nic_rx_packets, where the driver keeps them), and per guarded NIC what its guard
    // dropped (NETDEV.guard.misrouted, .malformed, .fragments).
    std::map<std::string, std::uint64_t> stats() const override;
    // Foreign packets on a bound queue (the guard), or RSS / a foreign ntuple rule reaching it
    // (re-read every DevmemGuards::recheck_us).
    std::map<std::string, std::string> drifted() override;

  private:
    DevmemDriver(host::HostPaths paths, NetdevGenl probe, DeviceCheck check, std::string pin_root)
        : inventory_(std::move(paths)), probe_(std::move(probe)), check_(std::move(check)),
          guards_(std::move(pin_root)) {}

    struct Binding {
        BindingPlan plan;
        int ifindex = 0;
        std::uint32_t queue = 0;
        std::optional<NetdevGenl> socket; // set while active: its lifetime is the kernel binding
        std::vector<std::uint32_t> rules;
        UniqueFd kept; // taken back after a restart: the socket of the previous daemon's bind
        std::optional<std::uint32_t> dmabuf_id; // bind-rx's answer; set while active
    };

    HardwareInventory inventory_;
    mutable NetdevGenl probe_; // for queue-get and qstats-get; never binds
    DeviceCheck check_;
    std::map<std::string, Binding> bindings_;
    DevmemGuards guards_;
};

} // namespace knod::driver
