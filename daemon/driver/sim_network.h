// The sim's network: a veth pair whose "NIC" end stays in the daemon's namespace, carrying the
// real flow filter, and whose "wire" end lives in a namespace of the sim's own, where traffic is
// sent from. A tc program on the wire end's egress steers each binding's packets to its RX
// queue, as ntuple rules would on a real NIC, and everything else to queue 0, as RSS would; the
// devmem guard on the NIC end's tc ingress drops and counts whatever the filter passed that
// landed on a bound queue anyway (steering drift), as it does on a devmem NIC.
#pragma once

#include "bpf/flow_filter.h"
#include "knod/result.h"

#include <memory>
#include <string>

namespace knod::driver {

struct SimNetworkConfig {
    std::string netns = "knod-sim";
    std::string nic = "knodsim0";
    std::string wire = "knodsim0w";
    std::uint32_t queues = 4;
    // Both ends of the pair. 3,500: the largest round figure XDP on a veth takes without
    // multi-buffer (one 4 KiB page less XDP's headroom and the skb's tail, about 3,506), so a
    // datagram is one AF_XDP frame; knod.distributed's 3,472-byte chunks fit with their IPv4 and
    // UDP headers.
    std::uint32_t mtu = 3500;
    std::string nic_address = "10.99.0.2";
    std::string wire_address = "10.99.0.1";
    int prefix_length = 24;
    bpf::FilterOptions filter;
};

class SimNetwork {
  public:
    // Builds the namespace, the pair and the filter. Leftovers of a previous run with the same
    // names (a crash) are removed first.
    static Result<std::unique_ptr<SimNetwork>> create(const SimNetworkConfig &config);
    // Removes what create() makes; safe on a half-built or absent network.
    static void remove(const SimNetworkConfig &config);
    ~SimNetwork();

    bpf::FlowFilter &filter() { return *filter_; }
    const SimNetworkConfig &config() const { return config_; }

  private:
    explicit SimNetwork(SimNetworkConfig c) : config_(std::move(c)) {}
    SimNetworkConfig config_;
    std::unique_ptr<bpf::FlowFilter> filter_;
};

// Runs `ip` with the arguments; returns its output or an error with what it printed.
Result<std::string> run_ip(const std::vector<std::string> &args);

} // namespace knod::driver
