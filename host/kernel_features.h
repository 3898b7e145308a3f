// The kernel features knod-policy's drivers use, probed on the running kernel rather than read
// off its configuration (which may be absent, or say yes to what a hardened or vendor kernel
// refuses): BPF program and map types, the helpers the filters call, AF_XDP sockets, tc BPF, the
// netdev generic-netlink family. Each feature says which driver or guarantee needs it, what its
// absence costs, and the fix. `knod-policy doctor` reports them (kernel.feature.*); knod-policyd
// probes what its driver needs at start, degrades where a driver has another way, and refuses a
// driver only for what it cannot do without, naming the feature.
#pragma once

#include "host/report.h"

#include <string>
#include <vector>

namespace knod::host {

// One probe's answer on the running kernel.
struct FeatureProbe {
    enum class State { available, missing, unknown } state = State::unknown;
    // The kernel's own words when missing (the verifier's line, an errno), or why it could not
    // be asked (unknown: no privilege).
    std::string detail;

    bool available() const { return state == State::available; }
    bool missing() const { return state == State::missing; }
};

// Loads a small BPF program of `prog_type` that calls helper `helper_id` (r1 = the context,
// r2 = -8: a valid call of bpf_xdp_adjust_meta) and reads the verifier's answer: missing when it
// says this program type cannot use the helper or does not know it; available when the program
// loads or fails for any other reason (the call's arguments). libbpf's own probe misses the
// wording of Linux 6.x ("program of this type cannot use helper").
FeatureProbe probe_bpf_helper(int prog_type, int helper_id);
FeatureProbe probe_bpf_prog_type(int prog_type);
FeatureProbe probe_bpf_map_type(int map_type);
// socket(AF_XDP): CONFIG_XDP_SOCKETS.
FeatureProbe probe_af_xdp();
// A clsact qdisc with a direct-action BPF classifier (CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_BPF),
// tried on the loopback device of a network namespace of a thread's own, so nothing of the host
// is touched. Needs CAP_SYS_ADMIN for the namespace: unknown without it.
FeatureProbe probe_tc_bpf();
// The netdev generic-netlink family (Linux 6.3; bind-rx from 6.12): the devmem driver's interface.
FeatureProbe probe_netdev_genl();

struct KernelFeature {
    std::string id;        // "bpf.helper.xdp_adjust_meta": doctor's check is kernel.feature.ID
    std::string what;      // "bpf_xdp_adjust_meta in XDP programs"
    std::string needed_by; // which driver or path uses it
    std::string cost;      // what is unavailable without it
    std::string fix;
    // The check's status when missing: warn where a driver degrades or another driver remains,
    // fail where nothing of knod-policy's isolation can run.
    CheckStatus when_missing = CheckStatus::warn;
    FeatureProbe probe;
};

// Every feature, probed now. `with_namespaces`: also probe what needs a namespace of its own
// (tc BPF); the daemon, whose unit forbids namespaces, leaves it out.
std::vector<KernelFeature> probe_kernel_features(bool with_namespaces = true);
// The doctor's checks, one per feature.
std::vector<HostCheck> kernel_feature_checks(const std::vector<KernelFeature> &features);
// "FEATURE is missing on this kernel (DETAIL): COST" for a log line or an error.
std::string describe_missing(const KernelFeature &feature);

} // namespace knod::host
