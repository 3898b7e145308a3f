// The flow filter's loader: loads flow_filter.bpf.c, attaches it to one interface (native XDP,
// falling back to generic), pins it under /sys/fs/bpf/knod/<ifname>/, and maintains its rules.
// Rule changes are double-buffered, so a packet sees the old rule set or the new one.
#pragma once

#include "bpf/exact_table.h"
#include "bpf/rule_compiler.h"
#include "knod/result.h"

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

struct flow_filter_bpf;
struct bpf_map;

namespace knod::bpf {

enum class SlotState : std::uint32_t {
    free = KNOD_SLOT_FREE,
    inactive = KNOD_SLOT_INACTIVE,
    active = KNOD_SLOT_ACTIVE
};

struct SlotCounters {
    std::uint64_t packets = 0;
    std::uint64_t bytes = 0;
    std::uint64_t drops = 0;
    std::uint64_t misrouted = 0; // the devmem guard: foreign packets on the binding's queue
};

struct FilterStats {
    // Offloaded packets are the slots' own counters; the hot path counts nothing twice.
    std::uint64_t passed = 0, dropped = 0, malformed = 0, fragments = 0, binding_drops = 0;
    std::uint64_t redecided = 0; // the rules changed while a packet was decided: decided again
    std::uint64_t raced = 0;     // ... and changed again: dropped (fail closed)
    std::uint64_t misrouted = 0; // the devmem guard: foreign packets on bound queues, dropped
};

// Where the sim's guard checks a packet the XDP filter passed (guard_passed_traffic).
enum class SimGuardPath {
    // knod_sim_guard at tc ingress, the devmem guard's own place, handed the RX queue in XDP
    // metadata: needs bpf_xdp_adjust_meta in XDP programs, which some kernels refuse.
    tc,
    // the same check inside the XDP filter, where the RX queue is known: any kernel.
    xdp,
};
const char *to_string(SimGuardPath path);

struct FilterOptions {
    std::string pin_root = "/sys/fs/bpf/knod";
    bool drop_unmatched = false;
    bool allow_generic = true; // fall back to generic XDP when native is refused
    SimGuardPath sim_guard = SimGuardPath::xdp;
};

class FlowFilter {
  public:
    // Loads the programs and their maps without attaching them (for BPF_PROG_TEST_RUN): the XDP
    // filter, the steering program, the devmem guard and its test entry, and the sim's tc guard
    // where options.sim_guard is tc. Each program is loaded only where it is used: attach() loads
    // the XDP filter and steering (and the tc guard on that path), attach_guard() the devmem
    // guard alone, so a program this kernel refuses takes down only what needs it. A refusal
    // names the program and the kernel's reason (the verifier's last word).
    static Result<std::unique_ptr<FlowFilter>> load(const FilterOptions &options = {});
    // Loads, attaches to `ifname` and pins. Refuses an interface that already has an XDP program.
    static Result<std::unique_ptr<FlowFilter>> attach(const std::string &ifname,
                                                      const FilterOptions &options = {});
    // Loads and attaches the devmem guard instead (tc ingress, clsact; see flow_filter.bpf.c):
    // same rules, slots and counters; an active slot's queue is a bound queue. Pins the maps.
    static Result<std::unique_ptr<FlowFilter>> attach_guard(const std::string &ifname,
                                                            const FilterOptions &options = {});
    // Runs the devmem guard behind this XDP filter, on the same interface's tc ingress (the sim's
    // model of a devmem NIC): the filter records each passed packet's RX queue in its metadata
    // and the guard (knod_sim_guard) drops and counts, as misrouted, a passed packet that landed
    // on an active binding's queue. Only after attach().
    Result<void> guard_passed_traffic();
    // Whether a devmem guard (ours: its fixed tc handle and priority) is attached to `ifname`.
    static bool guard_attached(const std::string &ifname);
    // What else sees `ifname`'s ingress packets before or beside the guard and could keep them
    // from it (a tc filter that ends classification, a tcx program): one line each, empty when
    // the guard is alone (rtnetlink RTM_GETTFILTER dump of clsact ingress; BPF_TCX_INGRESS
    // query). An error when the kernel cannot be asked: the guard cannot vouch for its queue.
    static Result<std::vector<std::string>> beside_guard(const std::string &ifname);
    // Removes pinned filters whose interface is not in `keep`, detaching their programs.
    // Returns the interfaces it cleaned up. Mounts bpffs first if needed.
    static Result<std::vector<std::string>> reconcile(const std::string &pin_root,
                                                      const std::set<std::string> &keep);
    // Removes the filter pinned for one interface (a crash's leftover), and nothing else under
    // `pin_root`. Returns whether there was one.
    static Result<bool> remove_pinned(const std::string &pin_root, const std::string &ifname);
    static Result<void> ensure_bpffs(const std::string &pin_root);

    ~FlowFilter(); // detaches and unpins
    FlowFilter(const FlowFilter &) = delete;
    FlowFilter &operator=(const FlowFilter &) = delete;

    Result<void> set_slot(std::uint32_t slot, SlotState state, std::uint32_t queue);
    // Replaces a binding's flows (empty removes them) and publishes the new rule set at once, at
    // the cost of this binding's flows (RuleSet). A refusal (an exact flow another binding holds,
    // over KNOD_BUCKET_RULES on one prefix, an exact table full) changes nothing, kernel included.
    Result<void> set_flows(std::uint32_t slot, const std::vector<policy::FlowSpec> &flows);
    // Frees a slot: state first (its packets stop matching), then its rules and counters.
    Result<void> remove(std::uint32_t slot);
    Result<void> set_unmatched_drop(bool drop);

    SlotCounters counters(std::uint32_t slot) const;
    FilterStats stats() const;

    int program_fd() const;
    int steer_program_fd() const;      // the tc program for the sim's wire end
    int guard_program_fd() const;      // the devmem guard (tc ingress)
    int guard_test_program_fd() const; // the same guard, RX queue from cb[0] (BPF_PROG_TEST_RUN)
    int xsks_fd() const;
    const std::string &mode() const { return mode_; } // native, generic, tc (the guard), or none
    const std::string &mode_note() const { return mode_note_; } // why generic, if it is
    const std::string &pin_dir() const { return pin_dir_; }

    SimGuardPath sim_guard() const { return sim_guard_; }

  private:
    // The programs of flow_filter.bpf.c, as a set of bits: what one load asks the kernel for.
    enum Program : unsigned {
        xdp_filter = 1u << 0,
        steer = 1u << 1,
        devmem_guard = 1u << 2,
        devmem_guard_test = 1u << 3,
        sim_tc_guard = 1u << 4,
    };
    static Result<std::unique_ptr<FlowFilter>> load_programs(const FilterOptions &options,
                                                             unsigned programs);
    FlowFilter() = default;
    // Writes what changed since the idle generation was last written (this change's keys and
    // buckets and the one before), then flips the config to it.
    Result<void> publish();
    // Brings generation `gen` of an exact table's userspace copy to the rule set: its dirty keys
    // only. Returns the buckets to write.
    template <typename Family>
    Result<std::vector<std::uint32_t>> update_exact(ExactTable<Family> &table, std::uint32_t gen);
    template <typename Family>
    Result<void> write_exact(bpf_map *map, const ExactTable<Family> &table, std::uint32_t gen,
                             const std::vector<std::uint32_t> &buckets, bool &unsynced);
    Result<void> write_buckets(std::uint32_t gen);
    Result<void> write_config();
    // Before any write a decision already under way might read: see knod_config.
    Result<void> bump_epoch();
    void detach();

    flow_filter_bpf *skel_ = nullptr;
    int link_fd_ = -1;
    int guard_ifindex_ = -1;                          // where the devmem guard is attached
    std::map<std::uint32_t, std::uint32_t> queue_of_; // active slot -> its bound queue
    std::string ifname_;
    std::string pin_dir_;
    std::string mode_ = "none";
    std::string mode_note_;
    SimGuardPath sim_guard_ = SimGuardPath::xdp;
    // Every binding's flows, compiled and kept up to date one binding at a time.
    RuleSet rules_;
    // Per generation: the exact keys and prefix buckets changed since it was last written.
    std::array<std::set<std::string>, 2> dirty_exact_;
    std::array<std::set<Destination>, 2> dirty_buckets_;
    // Each generation of the exact tables as the kernel holds it, and whether a failed write
    // left the kernel's copy unknown (the next publish then rewrites every bucket).
    std::array<std::unique_ptr<Exact4Table>, 2> exact4_;
    std::array<std::unique_ptr<Exact6Table>, 2> exact6_;
    std::array<bool, 2> exact4_unsynced_{}, exact6_unsynced_{};
    knod_config config_{};
};

} // namespace knod::bpf
