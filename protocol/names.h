// The fixed D-Bus names (../shared/design.md) and the error names callers can branch on.
#pragma once

#include "knod/result.h"

#include <string>

namespace knod::bus {

inline constexpr const char *service_name = "org.knod.Policy1";
inline constexpr const char *manager_path = "/org/knod/Policy1";
inline constexpr const char *manager_interface = "org.knod.Policy1.Manager";
inline constexpr const char *bindings_prefix = "/org/knod/Policy1/bindings";
inline constexpr const char *binding_interface = "org.knod.Policy1.Binding";
inline constexpr const char *manage_action = "org.knod.policy1.manage";
// Where a pod's processes reach the daemon (peer-to-peer, no bus: knod-policyd --pod-socket),
// and the variable that names it elsewhere (a D-Bus address, "unix:path=..."). The client
// library's rule (docs/client-sdk.md): the variable, then the system bus if
// DBUS_SYSTEM_BUS_ADDRESS names one, then this socket if it exists and the system bus's does
// not (a pod, which has the one mounted and never the other), then the system bus.
inline constexpr const char *pod_socket_path = "/run/knod-policy/pod.sock";
inline constexpr const char *pod_address_env = "KNOD_POLICY_ADDRESS";
inline constexpr const char *system_bus_socket = "/run/dbus/system_bus_socket";

namespace error {
inline constexpr const char *denied = "org.knod.Policy1.Error.Denied";
inline constexpr const char *invalid_argument = "org.knod.Policy1.Error.InvalidArgument";
inline constexpr const char *no_such_binding = "org.knod.Policy1.Error.NoSuchBinding";
inline constexpr const char *quota_exceeded = "org.knod.Policy1.Error.QuotaExceeded";
inline constexpr const char *isolation_violation = "org.knod.Policy1.Error.IsolationViolation";
inline constexpr const char *driver_failure = "org.knod.Policy1.Error.DriverFailure";
inline constexpr const char *journal_unavailable = "org.knod.Policy1.Error.JournalUnavailable";
inline constexpr const char *invalid_policy = "org.knod.Policy1.Error.InvalidPolicy";
inline constexpr const char *flow_conflict = "org.knod.Policy1.Error.FlowConflict";
// A bound on the state the daemon keeps for one user (tracked connections, polkit questions in
// flight) or for everyone: docs/threat-model.md lists them.
inline constexpr const char *limits_exceeded = "org.knod.Policy1.Error.LimitsExceeded";
// The daemon ran out of a resource (fds, memory, disk) while serving the call; the message
// names which. Nothing was granted; the call may be retried once it is back.
inline constexpr const char *out_of_resources = "org.knod.Policy1.Error.OutOfResources";
inline constexpr const char *failed = "org.knod.Policy1.Error.Failed";
} // namespace error

// The D-Bus error name for an error code, and back (for clients).
const char *error_name(Errc code);
Errc error_code(const std::string &name);

} // namespace knod::bus
