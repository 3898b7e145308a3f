// systemd's file-descriptor store (FileDescriptorStoreMax= in the unit): handles sent with
// FDSTORE=1 and FDNAME= outlive the process, and come back at the next start as LISTEN_FDS /
// LISTEN_FDNAMES. Without NOTIFY_SOCKET (not under systemd) it is off: nothing is stored.
// Every message sent while serving goes out without waiting (notify_nowait): PID 1 that does not
// read its notify socket (a long daemon-reload) must never stop the loop; what does not fit is
// not kept, counted and said (notify_stats), and the binding ends at the next stop as without
// systemd.
#pragma once

#include "daemon/handle_store.h"
#include "knod/result.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace knod::daemon {

class FdStore : public HandleStore {
  public:
    // Takes the fds systemd handed over (and unsets LISTEN_*, so children never see them).
    // `enabled`: store handles from now on (needs NOTIFY_SOCKET).
    static FdStore from_environment(bool enabled);
    FdStore() = default;
    FdStore(FdStore &&) = default;
    FdStore &operator=(FdStore &&) = default;
    ~FdStore() override;

    bool enabled() const { return enabled_; }
    // Whether systemd can be asked to keep fds at all: NOTIFY_SOCKET is set.
    static bool available();
    std::size_t received() const { return received_.size(); }

    bool store(const std::string &name, int fd) override;
    void remove(const std::string &name) override;
    std::optional<UniqueFd> take(const std::string &name) override;
    // Every handed-back fd nobody took, or took without storing it again (a binding that
    // could not be taken back): removed from systemd's store and closed. Returns how many names.
    std::size_t discard_untaken();
    // The last store or remove that systemd refused, for the log; empty when none.
    const std::string &last_error() const { return last_error_; }

  private:
    bool enabled_ = false;
    std::multimap<std::string, UniqueFd> received_;
    std::set<std::string> taken_; // taken at start, not stored again yet
    std::string last_error_;
};

// What the notify socket took and refused, process-wide (the socket is): the host report, the
// metrics and `knod-policy status` show it.
struct NotifyStats {
    bool enabled = false;            // bindings' handles go to the fd store
    std::uint64_t kept = 0;          // handles systemd's store was sent (FDSTORE=1)
    std::uint64_t not_kept = 0;      // handles that could not be sent: their binding ends at a stop
    std::uint64_t remove_failed = 0; // FDSTOREREMOVE not sent: the fd waits in the store until
                                     // the next start discards it
    std::uint64_t other_failed = 0;  // WATCHDOG=1, STOPPING=1 not sent
    bool failing = false;            // the last message was refused
    std::string last_error;          // why the last refused message was refused
};
NotifyStats notify_stats();
// notify_stats() as the host report and the metrics carry it.
nlohmann::json fd_store_json();

// Sends `msg` (and `fds`, SCM_RIGHTS) to $NOTIFY_SOCKET with MSG_DONTWAIT: a socket whose
// reader is behind fails at once (EAGAIN) instead of blocking. An error when NOTIFY_SOCKET is
// unset, names an address this cannot reach (only AF_UNIX paths and abstract names), or the
// send fails.
Result<void> notify_nowait(const std::string &msg, const int *fds = nullptr, std::size_t n = 0);

// WATCHDOG=1 without waiting, at most once per half of WATCHDOG_USEC (read at the first call;
// nothing when systemd set no watchdog for this process). Called from the loop's tick, so a
// stuck loop stops the pings.
void watchdog_tick(std::uint64_t now_monotonic_us);

// Whether `name` can be an FDNAME: 1-255 characters of [A-Za-z0-9_.:-].
bool valid_fd_name(const std::string &name);

} // namespace knod::daemon
