// Who is calling, as the bus and the kernel vouch for it. The bus gives uid and pid; we open a
// pidfd for the pid at once and read the process's identity from /proc: start time and uid
// before and after everything else, then poll the pidfd. A pid is not reused while its process
// lives, so if the process behind the pidfd has not exited and nothing changed, everything read
// was about it. None of this needs a privilege (no signal is sent): the hardened unit has no
// CAP_KILL. The start time names the process later, so a recycled pid never passes for it.
//
// Groups are the process's own (what it could use on a file), never the user database's: the
// bus's UnixGroupIDs when it sends them, otherwise /proc/PID/status (Gid: effective, Groups:).
#pragma once

#include "daemon/keys/key_authority.h"
#include "knod/result.h"
#include "knod/unique_fd.h"
#include "policy/engine.h"

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace knod::daemon {

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

    keys::Holder holder() const { return {pid, start_time}; }
    policy::Caller caller() const; // for the policy engine, with names from NSS
};

// `bus_gids`: the supplementary groups the bus vouched for, or nullopt when it sent none (then
// /proc/PID/status gives them). The process's effective gid is added either way.
Result<Peer> identify_peer(uid_t uid, pid_t pid, std::optional<std::vector<gid_t>> bus_gids,
                           std::string bus_name, const std::string &proc_root = "/proc");

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
