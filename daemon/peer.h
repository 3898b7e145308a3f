// Who is calling, as the bus and the kernel vouch for it. The bus gives uid and pid; we open a
// pidfd for the pid at once, then check that the process behind it still has that uid, and
// record its start time so that a recycled pid never passes for it later.
#pragma once

#include "daemon/keys/key_authority.h"
#include "knod/result.h"
#include "knod/unique_fd.h"
#include "policy/engine.h"

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace knod::daemon {

struct Peer {
    uid_t uid = 0;
    pid_t pid = 0;
    std::uint64_t start_time = 0; // clock ticks after boot, /proc/PID/stat field 22
    std::string bus_name;         // unique name (":1.42"), empty outside the bus
    std::vector<gid_t> gids;      // primary and supplementary
    std::shared_ptr<UniqueFd> pidfd;
    std::string executable;
    std::string cgroup;
    std::string unit;

    keys::Holder holder() const { return {pid, start_time}; }
    policy::Caller caller() const; // for the policy engine, with names from NSS
};

// `gids` may be empty, in which case the uid's groups come from NSS.
Result<Peer> identify_peer(uid_t uid, pid_t pid, std::vector<gid_t> gids, std::string bus_name,
                           const std::string &proc_root = "/proc");

// The start time of a live process, or an error if it is gone.
Result<std::uint64_t> process_start_time(pid_t pid, const std::string &proc_root = "/proc");

} // namespace knod::daemon
