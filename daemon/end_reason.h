// Why a binding ended. The journal and the signals carry the text (to_string); the daemon
// compares the enum.
#pragma once

namespace knod::daemon {

enum class EndReason {
    release,        // its owner (or an admin) released it
    revoke,         // an admin revoked it
    expire,         // its key ran out
    process_exit,   // the holder's process exited
    disconnect,     // the holder's bus connection closed
    policy_reload,  // the policy now in force no longer grants it
    daemon_stop,    // the daemon stopped (SIGTERM, lost the bus)
    daemon_restart, // left open by a daemon that did not stop cleanly, closed at the next start
    // The devmem guard saw foreign packets on the binding's queue, or RSS / an ntuple rule now
    // reaches it: the NIC would put other traffic in the holder's memory.
    steering_drift,
    link_down,    // its netdev went down
    link_removed, // its netdev went away
    pod_deleted,  // its holder's pod sandbox was deleted (the CNI plugin's DEL)
};

// The journaled text: "release", "process-exit", "steering-drift", ...
const char *to_string(EndReason r);

// Whether the daemon ended it against the holder's will (the holder hears BindingRevoked), as
// opposed to the holder releasing it or leaving (BindingReleased).
bool is_revocation(EndReason r);

} // namespace knod::daemon
