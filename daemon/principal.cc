#include "daemon/principal.h"

namespace knod::daemon {

PrincipalKey principal_key(uid_t uid, const std::string &pod_sandbox) {
    return {pod_sandbox.empty() ? std::string("host") : "pod:" + pod_sandbox, uid};
}

std::string PrincipalKey::to_string() const {
    return "uid " + std::to_string(uid) + (domain == "host" ? "" : " in " + domain);
}

} // namespace knod::daemon
