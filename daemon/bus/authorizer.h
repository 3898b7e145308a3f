// Who may do what. Any local user may request and release its own bindings; the auditor group
// reads everything; admin calls (revoke, reload) need root, the policy's admin group, or the
// polkit action org.knod.policy1.manage. Polkit unreachable means denied. A container's
// process (Credentials::contained) is never an auditor or admin: without a user namespace its
// uids and gids are the host's numbers, and polkit, which judges by uid, would take its root
// for the host's. A group setting names
// a group (resolved through NSS) or, when no group has that name, a numeric gid; the caller is
// in it when its process holds that gid.
#pragma once

#include "daemon/peer.h"
#include "policy/policy.h"

#include <sys/types.h>
#include <systemd/sd-bus.h>

#include "knod/result.h"

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace knod::bus {

// Who is on the other end of a connection. `gids` are the process's (effective and
// supplementary: see daemon/peer.h), never the user database's.
struct Credentials {
    uid_t uid = 0;
    pid_t pid = 0;
    std::vector<gid_t> gids;
    std::string sender;
    std::optional<std::vector<gid_t>> bus_gids; // UnixGroupIDs, when the bus sent them
    // A pidfd of the process that made the connection: the bus's ProcessFD, or one the client
    // attested (AttestProcess). Empty: the connection is known by its pid only.
    daemon::ProvenProcess process;
    // The bus sent a pidfd of the connecting process, and that process has exited: the
    // connection can never be proven (AttestProcess is refused).
    bool connector_gone = false;
    // From daemon::Peer: root with root's rights (Peer::host_root), and a container's process
    // (Peer::contained: in a registered pod, or in a pid, user or cgroup namespace not the
    // daemon's). Unknown (the process could not be read) counts as contained.
    bool host_root = false;    // Peer::host_root: root's rights (proven)
    bool root_in_host = false; // Peer::root_in_host: root's exemptions
    bool contained = true;
    std::optional<policy::PodIdentity> pod;
    std::string pod_sandbox;
    std::string domain; // Peer::domain; empty: unidentified, owns nothing
    // Peer::principal: whom its rate bucket and per-user bounds count (a uid in its domain).
    daemon::PrincipalKey principal;
    // The start time of the process first read at `pid` (daemon::Peer::start_time): a later
    // call finding another process there is refused (its connection's maker is gone).
    std::uint64_t start_time = 0;
    // Its executable and cgroup as first read (daemon::Peer): a pod-socket holder that comes
    // back after a restart must still be the program that was granted.
    std::string executable;
    std::string cgroup;
    // Called over the pod socket (daemon/bus/pod_socket.h): always a pod's process, never a
    // host principal, and host-only methods are refused. `netns`: where it was admitted from.
    bool pod_socket = false;
    daemon::NamespaceId netns;
};

class Authorizer {
  public:
    // At most `per_uid` polkit questions in flight for one uid, `total` in all.
    Authorizer(sd_bus *bus, std::size_t per_uid, std::size_t total);
    ~Authorizer();
    Authorizer(const Authorizer &) = delete;
    Authorizer &operator=(const Authorizer &) = delete;

    bool is_auditor(const Credentials &c, const policy::Settings &s) const;
    // Calls `done` with the answer: at once for root and the admin group, otherwise when
    // polkit answers (asynchronously: the daemon serves others meanwhile; no answer within
    // 5 s, or no polkit on the bus, means no). LimitsExceeded, and `done` never called, when
    // polkit would be asked but the caller's uid (or everyone) has as many questions in flight as
    // the bounds allow. Questions still open when the authorizer goes are answered by no one.
    Result<void> check_admin(const Credentials &c, const policy::Settings &s,
                             std::function<void(bool)> done) const;
    // Polkit questions that could not be sent or came back as a bus error (logged).
    std::uint64_t failed_questions() const;

    // Shared with the questions in flight, which may outlive the authorizer (the bus frees
    // them, and calls nobody once `alive` is false).
    struct InFlight {
        bool alive = true;
        std::size_t total = 0;
        std::map<daemon::PrincipalKey, std::size_t> per_uid;
        std::uint64_t failed = 0;
    };

  private:
    bool in_group(const Credentials &c, const std::string &group) const;
    void ask_polkit(const Credentials &c, std::function<void(bool)> done) const;
    sd_bus *bus_;
    std::size_t per_uid_, total_;
    std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

} // namespace knod::bus
