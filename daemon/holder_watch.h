// Watches the processes that hold bindings: one pidfd per holder process (pid and start time),
// however many bindings it holds, so a process with 10,000 bindings costs one fd here, not
// 10,000. When a holder exits, each of its bindings is reported once.
#pragma once

#include "daemon/driver/event_loop.h"
#include "knod/unique_fd.h"

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace knod::daemon {

class HolderWatch {
  public:
    // `exited` runs on the loop for every binding of a holder whose process exited.
    HolderWatch(driver::EventLoop &loop, std::function<void(const std::string &id)> exited);
    ~HolderWatch();
    HolderWatch(const HolderWatch &) = delete;
    HolderWatch &operator=(const HolderWatch &) = delete;

    // Adds binding `id` to its holder's watch; the first binding of a holder needs its pidfd
    // (null: the holder is not watched, as when the pidfd could not be opened).
    void add(const std::string &id, pid_t pid, std::uint64_t start_time,
             const std::shared_ptr<UniqueFd> &pidfd);
    // Takes binding `id` off its holder's watch; the holder's last binding ends the watch.
    void remove(const std::string &id, pid_t pid, std::uint64_t start_time);
    std::size_t holders() const { return holders_.size(); }

  private:
    using Holder = std::pair<pid_t, std::uint64_t>;
    struct Watch {
        std::shared_ptr<UniqueFd> pidfd;
        std::set<std::string> bindings;
    };
    void fired(const Holder &holder);

    driver::EventLoop &loop_;
    std::function<void(const std::string &)> exited_;
    std::map<Holder, Watch> holders_;
};

} // namespace knod::daemon
