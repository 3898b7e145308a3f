// Resource exhaustion the daemon met while serving (its fd limit, memory, disk): counted, the
// last one kept for `status`, and logged, at most once per ten seconds with a count of those
// not logged (a caller that keeps calling at the fd limit must not flood the log). Process-wide:
// the failures come from wherever a syscall failed (caller identity, the driver, the journal's
// writer thread), and there is one daemon per process.
#pragma once

#include "knod/result.h"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace knod::daemon {

class ResourceFailures {
  public:
    static ResourceFailures &instance();

    // Counts and maybe logs `e` if it is Errc::out_of_resources; anything else is ignored.
    void note(const Error &e);
    std::uint64_t count() const;
    std::string last() const; // the last one's message, "" if none yet

  private:
    mutable std::mutex mu_;
    std::uint64_t count_ = 0;
    std::uint64_t unlogged_ = 0;
    std::string last_;
    std::chrono::steady_clock::time_point logged_{};
};

} // namespace knod::daemon
