#include "daemon/rate_limiter.h"

#include <algorithm>

namespace knod::daemon {

RateLimiter::RateLimiter(double per_second, double burst, std::size_t max_keys)
    : per_second_(per_second), burst_(std::max(burst, 1.0)),
      max_keys_(std::max<std::size_t>(max_keys, 1)) {}

void RateLimiter::make_room(Clock::time_point now) {
    // A bucket that would be full by now is the same as no bucket.
    std::erase_if(buckets_, [&](auto &kv) {
        double elapsed = std::chrono::duration<double>(now - kv.second.last).count();
        return kv.second.tokens + elapsed * per_second_ >= burst_;
    });
    if (buckets_.size() < max_keys_) return;
    auto oldest = std::min_element(buckets_.begin(), buckets_.end(),
                                   [](auto &a, auto &b) { return a.second.last < b.second.last; });
    buckets_.erase(oldest);
}

bool RateLimiter::admit(const PrincipalKey &key, Clock::time_point now) {
    auto it = buckets_.find(key);
    if (it == buckets_.end()) {
        if (buckets_.size() >= max_keys_) make_room(now);
        it = buckets_.emplace(key, Bucket{burst_, now}).first;
    }
    Bucket &b = it->second;
    double elapsed = std::max(0.0, std::chrono::duration<double>(now - b.last).count());
    b.tokens = std::min(burst_, b.tokens + elapsed * per_second_);
    b.last = now;
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
}

} // namespace knod::daemon
