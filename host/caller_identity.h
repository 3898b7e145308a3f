// What this host lets knod-policyd prove about a caller's process (docs/threat-model.md,
// "Caller identity"): a pidfd from the bus (ProcessFD), a client's attestation (a socketpair end,
// SO_PEERPIDFD), or nothing but a pid. `knod-policy doctor` reports it as `caller.identity`;
// `check --host` warns about rules that could never grant on a host without either.
#pragma once

#include "host/report.h"

#include <optional>

namespace knod::host {

// SO_PEERPIDFD (Linux 6.5): a pidfd of a unix socket's peer. Not in Debian 12's headers; the
// number is the kernel's ABI.
inline constexpr int so_peerpidfd = 77;

// Whether the running kernel answers SO_PEERPIDFD (Linux 6.5 and later) on a socketpair of
// this process: without it neither the bus nor a client can hand the daemon a caller's pidfd.
bool kernel_has_peer_pidfd();

// The `caller.identity` check. `bus_sends_pidfd`: whether the bus answered
// GetConnectionCredentials with ProcessFD (nullopt: the bus could not be asked).
HostCheck caller_identity_check(bool kernel_peer_pidfd, std::optional<bool> bus_sends_pidfd);

} // namespace knod::host
