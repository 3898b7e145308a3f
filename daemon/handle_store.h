// Where a binding's kernel handles are kept so that they outlive the daemon's process: systemd's
// file-descriptor store (daemon/fd_store.h). The core knows only this interface.
#pragma once

#include "knod/unique_fd.h"

#include <optional>
#include <string>

namespace knod::daemon {

class HandleStore {
  public:
    virtual ~HandleStore() = default;
    // Keeps a copy of `fd` under `name` ([A-Za-z0-9_.:-], at most 255 characters); false when
    // it could not.
    virtual bool store(const std::string &name, int fd) = 0;
    // Forgets what is kept under `name` (the binding ended).
    virtual void remove(const std::string &name) = 0;
    // A handle the previous daemon kept, handed back at start; nullopt when none came back.
    virtual std::optional<UniqueFd> take(const std::string &name) = 0;
};

} // namespace knod::daemon
