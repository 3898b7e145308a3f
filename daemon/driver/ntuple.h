// NIC flow steering (ethtool ntuple rules): the hardware analogue of the sim's tc steering. A
// devmem binding's queue must receive its flows and nothing else, so each flow becomes one
// RX classification rule that sends it to the binding's queue.
#pragma once

#include "knod/result.h"
#include "policy/flow_spec.h"

#include <linux/ethtool.h>

#include <cstdint>
#include <string>
#include <vector>

namespace knod::driver {

// The classification rule for one flow: exact ports or any, address prefixes as masks. Port
// ranges have no mask form the NICs accept, so they are refused. `family` picks IPv4 or IPv6
// for a flow that names neither (it needs one rule of each).
Result<ethtool_rx_flow_spec> to_rx_flow_spec(const policy::FlowSpec &flow, std::uint32_t queue,
                                             policy::Family family);

class FlowSteering {
  public:
    // Inserts one rule per flow on `ifname`; all or nothing. Returns the rules' locations.
    static Result<std::vector<std::uint32_t>> steer(const std::string &ifname,
                                                    const std::vector<policy::FlowSpec> &flows,
                                                    std::uint32_t queue);
    static void remove(const std::string &ifname, const std::vector<std::uint32_t> &locations);
    // Refuses a queue that RSS spreads other traffic onto: every flow hashed to it would land
    // in the binding's memory. A device without an RSS table (EOPNOTSUPP) spreads nothing.
    static Result<void> check_not_in_rss(const std::string &ifname, std::uint32_t queue);
    // The locations of every ntuple rule on `ifname` that steers to `queue` (whoever put it
    // there). A device without ntuple rules (EOPNOTSUPP) has none.
    static Result<std::vector<std::uint32_t>> rules_to_queue(const std::string &ifname,
                                                             std::uint32_t queue);
};

// Whether the RSS indirection table sends any hash bucket to `queue`.
bool rss_reaches(const std::vector<std::uint32_t> &table, std::uint32_t queue);

} // namespace knod::driver
