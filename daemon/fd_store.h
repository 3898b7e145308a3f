// systemd's file-descriptor store (FileDescriptorStoreMax= in the unit): handles sent with
// FDSTORE=1 and FDNAME= outlive the process, and come back at the next start as LISTEN_FDS /
// LISTEN_FDNAMES. Without NOTIFY_SOCKET (not under systemd) it is off: nothing is stored.
#pragma once

#include "daemon/handle_store.h"
#include "knod/result.h"

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

// Whether `name` can be an FDNAME: 1-255 characters of [A-Za-z0-9_.:-].
bool valid_fd_name(const std::string &name);

} // namespace knod::daemon
