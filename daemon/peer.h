// Who is calling, as the bus and the kernel vouch for it. The bus gives uid and pid; we open a
// pidfd for the pid at once and read the process's identity from /proc: start time and uid
// before and after everything else, then poll the pidfd. A pid is not reused while its process
// lives, so if the process behind the pidfd has not exited and nothing changed, everything read
// was about it. None of this needs a privilege (no signal is sent): the hardened unit has no
// CAP_KILL. The start time names the process later, so a recycled pid never passes for it.
//
// Groups are the process's own (what it could use on a file), never the user database's: the
// bus's UnixGroupIDs when it sends them, otherwise /proc/PID/status (Gid: effective, Groups:).
//
// The pid itself is the weak point (issue #32): dbus-daemon 1.14 took it at connect(2), and the
// process that connected may have exited and its pid gone to another. So a caller is `proven`
// only when a pidfd of the very process that connected is at hand, the bus's (ProcessFD) or
// one the client attested (daemon/process_attestation.h), and that process is still running;
// everything read from /proc is then about it. Otherwise the caller is known by its pid only:
// its unit, cgroup and executable may be another process's, and the policy engine does not let
// them grant anything (policy::Caller::process_proven), and its groups are the bus's alone.
#pragma once

#include "daemon/keys/key_authority.h"
#include "daemon/pod_registry.h"
#include "daemon/principal.h"
#include "knod/result.h"
#include "knod/unique_fd.h"
#include "policy/engine.h"

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace knod::daemon {

// How the daemon knows that the process behind the bus's pid is the one that connected.
enum class ProcessProof {
    pid_only,  // nothing but the pid: units, cgroups and executables prove nothing
    attested,  // the client passed a socketpair end it made (AttestProcess)
    bus_pidfd, // the bus sent a pidfd of the connecting process (ProcessFD)
};
const char *to_string(ProcessProof p);
// "pid-only", "attested" or "bus-pidfd"; anything else is pid_only (the weakest).
ProcessProof parse_process_proof(std::string_view text);

// A pidfd of the process that made a connection, and how the daemon came by it.
struct ProvenProcess {
    std::shared_ptr<UniqueFd> pidfd;
    ProcessProof proof = ProcessProof::pid_only;
    pid_t pid = 0; // where the process was when it proved itself; it keeps it while it runs
};

struct Peer {
    uid_t uid = 0;
    pid_t pid = 0;
    std::uint64_t start_time = 0; // clock ticks after boot, /proc/PID/stat field 22
    std::string bus_name;         // unique name (":1.42"), empty outside the bus
    std::vector<gid_t> gids;      // effective and supplementary, of the process
    bool gids_from_bus = false;   // the bus sent UnixGroupIDs (else /proc/PID/status)
    std::shared_ptr<UniqueFd> pidfd;
    std::string executable;
    std::string cgroup;
    std::string unit;      // the system manager's unit (policy::system_unit_of)
    std::string user_unit; // the user manager's unit (policy::user_unit_of)
    ProcessProof process_proof = ProcessProof::pid_only;
    // Its network namespace (the pod registry's key), and whether its pid, user and cgroup
    // namespaces are the daemon's own. identify_peer reads them (false where they could not be
    // read); a Peer the daemon makes itself (a signal's sender, a test's caller) is the host's.
    NamespaceId netns;
    bool host_namespaces = true;
    bool host_netns = true; // its network namespace is the daemon's
    std::string namespaces; // its pid, user and cgroup namespaces' inodes, as one key
    // The registered pod whose sandbox's network namespace it is in (set by whoever holds the
    // registry: the bus adaptor, from BindingManager::pods()).
    // Only a proven process (process_proof) is given its pod's identity; an unproven one in a
    // pod's network namespace has `pod_sandbox` alone (its bounds are that pod's) and matches
    // no allow rule (policy::Caller::pod_unproven).
    std::optional<policy::PodIdentity> pod;
    std::string pod_sandbox; // that sandbox's container id

    // uid 0 in the daemon's pid, user and cgroup namespaces and in no pod: exempt from what
    // protects the daemon's load (rate limit, bounds on remembered connections and
    // subscriptions, refusals coalesced). A container's root without a user namespace has uid 0
    // too, and is not this. Read off the process at the caller's pid: for a caller not proven
    // (docs/threat-model.md, "Caller identity") that may be another process since.
    bool root_in_host() const;
    // The host's root with root's rights (auditor, admin): root_in_host, and its process
    // proven (the bus's pidfd, or attested), so that no recycled pid lends them.
    bool host_root() const;
    // The caller's domain: a bindings' owner is a uid in a domain. "pod:SANDBOX" in a
    // registered pod, "unproven-pod:SANDBOX" for an unproven process in one (it owns nothing:
    // the pid may be another's since), "host" in the daemon's pid, user and cgroup namespaces,
    // else "ns:PID/USER/CGROUP" (inodes): a container's uid 1000 is not the host's, nor
    // another's.
    std::string domain() const;
    // What its quotas, rate bucket and per-user bounds are counted for.
    PrincipalKey principal() const { return principal_key(uid, pod_sandbox, host_netns); }
    // In the daemon's network namespace or a registered pod's: only such a caller can receive
    // what it could bind, and only it matches allow rules (policy::Caller::placed).
    bool placed() const { return pod.has_value() || (host_netns && pod_sandbox.empty()); }
    // In a registered pod, or in a pid, user or cgroup namespace not the daemon's.
    bool contained() const { return !pod_sandbox.empty() || !host_namespaces; }

    keys::Holder holder() const { return {pid, start_time}; }
    policy::Caller caller() const; // for the policy engine, with names from NSS
};

// `bus_gids`: the supplementary groups the bus vouched for, or nullopt when it sent none.
// `proven`: the connection's proven process, if any. Proven, the process is read through its
// pidfd (the pid cannot change hands while it runs); its groups are the bus's, or without them
// /proc/PID/status's. Proven but exited: Errc::denied (a connection speaks
// only for the process that proved itself on it). Unproven: the bus's groups only, none
// without them. Errc::denied too when the caller is gone or changed while being read.
Result<Peer> identify_peer(uid_t uid, pid_t pid, std::optional<std::vector<gid_t>> bus_gids,
                           std::string bus_name, const ProvenProcess &proven = {},
                           const std::string &proc_root = "/proc");

// The groups line of /proc/PID/status and its effective gid, as a set ("Gid:" and "Groups:").
std::vector<gid_t> groups_from_status(const std::string &status);

// The start time of a live process, or an error if it is gone.
Result<std::uint64_t> process_start_time(pid_t pid, const std::string &proc_root = "/proc");

// Whether the process behind `pidfd` is still running: a pidfd polls readable once it has
// exited (a zombie counts as exited). Needs no privilege over the process.
bool still_running(int pidfd);

// A pidfd for the process `pid` started at `start_time`, or Errc::not_found when that process
// has exited (its pid may since name another). A daemon restart re-finds its holders this way.
Result<std::shared_ptr<UniqueFd>> pin_process(pid_t pid, std::uint64_t start_time,
                                              const std::string &proc_root = "/proc");

} // namespace knod::daemon
