// Which flows each live or in-flight binding holds, per network device, so that a request whose
// flows overlap another binding's is refused before anything is granted: flows are exclusive,
// and the first claimant keeps its traffic. The flow filter's "most specific wins" is only a
// second line behind this.
#pragma once

#include "policy/flow_spec.h"

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace knod::daemon {

struct FlowConflict {
    std::string binding; // the binding that holds the flow
    uid_t owner = 0;
    std::size_t requested = 0; // index into the requested flows
    policy::FlowSpec held;     // the holder's flow it overlaps
};

class FlowClaims {
  public:
    // Records `flows` as held by `binding` on `netdev`. Flows of one binding may overlap each
    // other (a flow listed twice is not a conflict with itself).
    void claim(const std::string &netdev, const std::string &binding, uid_t owner,
               std::vector<policy::FlowSpec> flows);
    void release(const std::string &binding);
    // The first held flow on `netdev` that some packet could match together with one of
    // `flows`. At worst O(flows held on that device); a flow with few destination ports is
    // compared only with held flows on those ports and with held flows of wide port ranges.
    std::optional<FlowConflict> conflict(const std::string &netdev,
                                         const std::vector<policy::FlowSpec> &flows) const;
    std::size_t size() const { return where_.size(); }

  private:
    struct Held {
        std::string binding;
        uid_t owner;
        policy::FlowSpec flow;
    };
    struct Device {
        // Flows of at most `narrow` destination ports, filed under each of their ports.
        std::unordered_map<std::uint16_t, std::vector<Held>> by_port;
        std::vector<Held> wide; // the rest
        std::size_t bindings = 0;
    };
    static constexpr int narrow = 16;
    static bool is_narrow(const policy::PortRange &r) { return r.hi - r.lo < narrow; }

    std::map<std::string, Device> devices_;
    std::map<std::string, std::pair<std::string, std::vector<policy::FlowSpec>>>
        where_; // binding -> netdev, flows
};

} // namespace knod::daemon
