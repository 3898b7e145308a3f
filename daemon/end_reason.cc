#include "daemon/end_reason.h"

namespace knod::daemon {

const char *to_string(EndReason r) {
    switch (r) {
    case EndReason::release:
        return "release";
    case EndReason::revoke:
        return "revoke";
    case EndReason::expire:
        return "expire";
    case EndReason::process_exit:
        return "process-exit";
    case EndReason::disconnect:
        return "disconnect";
    case EndReason::policy_reload:
        return "policy-reload";
    case EndReason::daemon_stop:
        return "daemon-stop";
    case EndReason::daemon_restart:
        return "daemon-restart";
    case EndReason::steering_drift:
        return "steering-drift";
    case EndReason::link_down:
        return "link-down";
    case EndReason::link_removed:
        return "link-removed";
    case EndReason::pod_deleted:
        return "pod-deleted";
    }
    return "unknown";
}

bool is_revocation(EndReason r) {
    switch (r) {
    case EndReason::revoke:
    case EndReason::policy_reload:
    case EndReason::expire:
    case EndReason::steering_drift:
    case EndReason::link_down:
    case EndReason::link_removed:
    case EndReason::pod_deleted:
        return true;
    default:
        return false;
    }
}

} // namespace knod::daemon
