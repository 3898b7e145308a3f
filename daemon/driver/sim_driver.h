// The sim backend: a simulated NIC and GPU with the same bookkeeping a hardware backend does
// (queues, bindings inactive until the key is presented), and a real data path: the flow filter
// on a veth pair, AF_XDP sockets per queue, and payloads copied into the holder's memfd, the
// simulated VRAM. The region is a ring: byte i of a binding's stream lands at
// offset + (i mod length); RxBytes says how far the stream has gone.
#pragma once

#include "daemon/driver/driver.h"
#include "daemon/driver/event_loop.h"
#include "daemon/driver/sim_network.h"
#include "daemon/driver/xsk_queue.h"
#include "knod/file_lock.h"

#include <map>
#include <optional>
#include <set>
#include <vector>

namespace knod::driver {

struct SimConfig {
    std::string netdev = "knodsim0";
    std::uint32_t queues = 4;
    std::string gpu = "sim0";
    std::uint64_t vram_bytes = 1ull << 30;
    bool datapath = true; // off: control half only (no namespace, no BPF)
    std::string netns = "knod-sim";
    std::string pin_root = "/sys/fs/bpf/knod";
    bool drop_unmatched = false;
    // Where the guard checks what the filter passed onto a bound queue: "tc" (at tc ingress,
    // handed the RX queue in XDP metadata, as on a devmem NIC), "xdp" (inside the filter), or
    // "auto" (tc where the kernel lets XDP programs call bpf_xdp_adjust_meta, else xdp).
    std::string guard = "auto";
    // Where the per-netdev lock lives (sim-NETDEV.lock): two daemons never build, reconcile or
    // tear down the same sim network. Not an option of the daemon: two daemons given different
    // directories would not see each other's lock.
    std::string lock_dir = "/run/knod-policy";
};

class SimDriver : public Driver {
  public:
    SimDriver(SimConfig config, EventLoop *loop);
    ~SimDriver() override;
    // Builds the sim network when the data path is on. Separate from the constructor so that
    // failures carry their reason.
    Result<void> start();
    // Why the filter runs in generic XDP, when it does; empty for native.
    std::string datapath_note() const;
    // Where the guard runs, and why there when the kernel chose it.
    std::vector<std::string> notes() const override { return notes_; }

    std::string name() const override { return "sim"; }
    RegionKind region_kind() const override { return RegionKind::memfd; }
    Result<GpuInfo> gpu(const std::string &name) const override;
    Result<NetdevInfo> netdev(const std::string &name) const override;
    std::vector<GpuInfo> gpus() const override;
    std::vector<NetdevInfo> netdevs() const override;

    Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) override;
    Result<void> activate(const std::string &id) override;
    void detach(const std::string &id) override;
    Counters counters(const std::string &id) const override;
    Result<UniqueFd> rx_notifier(const std::string &id) override;
    // The sim's network is rebuilt at every start (it is the daemon's own simulated NIC), so a
    // binding is taken back by installing it afresh, active if it was, with its stream position
    // (the ring continues where it stopped). Its only kernel handle is the region fd.
    std::optional<std::string> handoff(const std::string &id) const override;
    Result<std::vector<std::uint32_t>> readopt(const BindingPlan &plan, bool active,
                                               const std::string &handoff,
                                               std::map<std::string, UniqueFd> handles) override;

    // Filter-wide counts: unmatched traffic passed or dropped, malformed, fragments, and frames
    // that reached a socket but no active binding.
    std::map<std::string, std::uint64_t> stats() const override;
    // Active bindings whose queue the guard found foreign packets on (each reported once): the
    // sim's steering put traffic that is not theirs on their queue (see SimNetwork).
    std::map<std::string, std::string> drifted() override;
    Result<void> set_unmatched_drop(bool drop) override;
    bool netdevs_are_links() const override { return network_ != nullptr; }

  private:
    struct Slot {
        BindingPlan plan;
        std::uint32_t slot = 0; // the filter's binding slot
        std::uint32_t queue = 0;
        bool active = false;
        std::uint64_t rx_bytes = 0;
        std::uint64_t rx_packets = 0;
        bool drift_reported = false;
        UniqueFd notifier; // the write end of the holder's pipe (rx_notifier), if it asked for one
    };
    // A drained batch: each claimed frame's payload is kept (it stays in the UMEM until the
    // batch is handed back to the kernel), then flush_batch() writes each binding's run of
    // payloads with one pwritev and wakes each holder once, with its total.
    struct Pending {
        Slot *slot;
        std::span<const std::uint8_t> payload;
    };
    void receive(XskQueue &q);
    void flush_batch();
    void write_run(Slot &s, const Pending *run, std::size_t n);
    bool deliver(Slot &s, std::span<const std::uint8_t> payload);
    void notify(Slot &s);
    Result<void> open_queue(std::uint32_t queue);
    void park_queue_if_idle(std::uint32_t queue);

    // The kernel features the data path cannot run without, probed before anything is built;
    // and where the guard will run.
    Result<bpf::SimGuardPath> check_kernel();

    SimConfig config_;
    EventLoop *loop_;
    std::vector<std::string> notes_;
    std::optional<FileLock> netdev_lock_; // held while network_ lives (declared first: freed last)
    std::unique_ptr<SimNetwork> network_;
    std::map<std::string, Slot> slots_;
    // The bindings on each offload queue, so a received frame and the queue choice look only at
    // one queue's bindings, not all of them.
    std::map<std::uint32_t, std::set<Slot *>> on_queue_;
    std::set<std::uint32_t> free_slots_;
    std::uint32_t next_slot_ = 1;
    std::map<std::uint32_t, std::unique_ptr<XskQueue>> xsks_;
    std::uint64_t undeliverable_ = 0; // frames on a queue that no active binding claimed
    std::uint64_t delivered_ = 0;     // payloads copied into regions, all bindings
    std::vector<Pending> pending_;    // the batch being drained (empty between batches)
    std::vector<Slot *> touched_;     // the bindings the batch wrote to, each once
};

} // namespace knod::driver
