// The devmem guards of one daemon: one tc ingress guard (bpf::FlowFilter::attach_guard) per
// devmem NIC, shared by that NIC's bindings, each binding a slot whose flows and queue the guard
// checks. It counts each binding's packets and bytes (devmem bindings' RxBytes/RxPackets) and
// the foreign packets that landed on its queue (misrouted: dropped), and says which bindings
// drifted: foreign packets on their queue, RSS reaching it, or an ntuple rule that is not theirs
// steering to it (re-read every `recheck_us`).
#pragma once

#include "bpf/flow_filter.h"
#include "daemon/driver/driver.h"
#include "knod/result.h"
#include "policy/flow_spec.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace knod::driver {

// What a binding's drift report says when the guard dropped foreign packets on its queue.
std::string misrouted_note(std::uint64_t packets, std::uint32_t queue, const std::string &netdev);
// Why `netdev`'s guard cannot vouch for its bound queues (something else on its ingress could
// keep packets from it, or that cannot be read), or nothing when the guard is alone there.
std::optional<std::string> guard_blinded(const std::string &netdev);

class DevmemGuards {
  public:
    explicit DevmemGuards(std::string pin_root = "/sys/fs/bpf/knod")
        : pin_root_(std::move(pin_root)) {}

    // Guards `queue` of `netdev` for binding `id`: its flows are counted, anything else on the
    // queue is dropped as misrouted. `own_rules`: the binding's ntuple rules (not drift).
    Result<void> add(const std::string &id, const std::string &netdev, std::uint32_t queue,
                     const std::vector<policy::FlowSpec> &flows,
                     const std::vector<std::uint32_t> &own_rules);
    void set_own_rules(const std::string &id, const std::vector<std::uint32_t> &own_rules);
    // Stops guarding; the last binding of a NIC takes its guard off.
    void remove(const std::string &id);
    Counters counters(const std::string &id) const;
    // Per guarded NIC, what its guard dropped: NETDEV.guard.misrouted, .malformed, .fragments.
    void add_stats(std::map<std::string, std::uint64_t> &out) const;
    // Bindings that drifted since the last call, with what was seen. `now_us`: for the
    // periodic RSS / ntuple re-check.
    std::map<std::string, std::string> drifted(std::int64_t now_us);
    // The guard of a NIC (tests drive its test entry with BPF_PROG_TEST_RUN); null if none.
    const bpf::FlowFilter *guard(const std::string &netdev) const;

    static constexpr std::int64_t recheck_us = 10'000'000;

  private:
    struct Guarded {
        std::string netdev;
        std::uint32_t queue = 0;
        std::uint32_t slot = 0;
        std::vector<std::uint32_t> own_rules;
        bool reported = false;
    };
    std::string pin_root_;
    std::map<std::string, std::unique_ptr<bpf::FlowFilter>> guards_; // by netdev
    std::map<std::string, Guarded> bindings_;
    std::uint32_t next_slot_ = 1;
    std::int64_t last_recheck_us_ = 0;
};

} // namespace knod::driver
