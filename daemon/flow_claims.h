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
    // `flows`; O(flows held on that device).
    std::optional<FlowConflict> conflict(const std::string &netdev,
                                         const std::vector<policy::FlowSpec> &flows) const;
    std::size_t size() const { return where_.size(); }

  private:
    struct Claim {
        uid_t owner;
        std::vector<policy::FlowSpec> flows;
    };
    std::map<std::string, std::map<std::string, Claim>> by_netdev_;
    std::map<std::string, std::string> where_; // binding -> netdev
};

} // namespace knod::daemon
