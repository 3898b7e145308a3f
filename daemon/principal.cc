#include "daemon/principal.h"

namespace knod::daemon {

PrincipalKey principal_key(uid_t uid, const std::string &pod_sandbox, bool in_host_netns) {
    if (!pod_sandbox.empty()) return {"pod:" + pod_sandbox, uid};
    return {in_host_netns ? "host" : "unplaced", uid};
}

std::string PrincipalKey::to_string() const {
    return "uid " + std::to_string(uid) + (domain == "host" ? "" : " in " + domain);
}

} // namespace knod::daemon
