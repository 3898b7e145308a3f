// Keeps refusals from growing the journal without bound: per (uid, kind of refusal, scope: the
// pod the caller is in, so that one pod's refusals never hide another's), the first
// refusal is journaled in full and opens a window; refusals inside the window are only counted,
// and when it closes (at the daemon's tick) one record carries the count. While refusals keep
// coming, each closed window with a count opens the next, so a (uid, kind) writes at most one
// record per window however fast it is refused. The map is bounded; uids beyond the bound share
// one overflow entry per kind and scope (a pod's root can use thousands of uids; its overflow
// stays its pod's).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace knod::daemon {

class RefusalCoalescer {
  public:
    RefusalCoalescer(std::int64_t window_us, std::size_t max_keys = 4096);

    // True when this refusal should be journaled now, in full; otherwise it was counted.
    // `scope`: the caller's pod as the journal names it (detail.pod's JSON), empty for none.
    bool admit(std::uint32_t uid, const std::string &kind, std::int64_t now_us,
               const std::string &scope = "");

    struct Summary {
        std::optional<std::uint32_t> uid; // none: the overflow entry (many uids)
        std::string kind;
        std::string scope;       // admit's scope (empty: no pod, or the overflow entry)
        std::uint64_t count = 0; // refusals not journaled one by one
        std::int64_t since_us = 0;
        std::int64_t until_us = 0;
    };
    // Closes the windows that have ended by `now_us`; one summary for each that counted any.
    std::vector<Summary> close(std::int64_t now_us);
    // Closes every window now (the daemon stops).
    std::vector<Summary> close_all(std::int64_t now_us);
    std::int64_t window_us() const { return window_us_; }
    std::size_t size() const { return windows_.size(); }

  private:
    struct Window {
        std::int64_t since_us;
        std::int64_t until_us;
        std::uint64_t count;
    };
    using Key = std::tuple<std::int64_t, std::string, std::string>; // uid (-1: overflow), kind,
                                                                    // scope
    std::vector<Summary> close_if(std::int64_t now_us, bool all);

    std::int64_t window_us_;
    std::size_t max_keys_;
    std::map<Key, Window> windows_;
};

} // namespace knod::daemon
