// Token buckets keyed by principal (a uid in its domain, PrincipalKey): each user may make
// `per_second` calls a second on average, with bursts of `burst`, however many connections it
// opens; a pod's uid 1000 has a bucket of its own, not the host user's. The map is bounded: when
// full, full (idle) buckets go first, then the longest unused, which only gives a fresh bucket to a
// uid that has been quiet longest (and having more uids than the bound takes root to arrange).
#pragma once

#include "daemon/principal.h"

#include <chrono>
#include <cstdint>
#include <map>

namespace knod::daemon {

class RateLimiter {
  public:
    using Clock = std::chrono::steady_clock;
    RateLimiter(double per_second, double burst, std::size_t max_keys = 4096);

    // Takes one token for `key`; false when there is none (the call is refused).
    bool admit(const PrincipalKey &key, Clock::time_point now);
    std::size_t size() const { return buckets_.size(); }
    double per_second() const { return per_second_; }
    double burst() const { return burst_; }

  private:
    struct Bucket {
        double tokens;
        Clock::time_point last;
    };
    void make_room(Clock::time_point now);

    double per_second_;
    double burst_;
    std::size_t max_keys_;
    std::map<PrincipalKey, Bucket> buckets_;
};

} // namespace knod::daemon
