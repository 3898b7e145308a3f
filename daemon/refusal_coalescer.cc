#include "daemon/refusal_coalescer.h"

#include <algorithm>

namespace knod::daemon {

RefusalCoalescer::RefusalCoalescer(std::int64_t window_us, std::size_t max_keys)
    : window_us_(std::max<std::int64_t>(window_us, 1)),
      max_keys_(std::max<std::size_t>(max_keys, 1)) {}

bool RefusalCoalescer::admit(std::uint32_t uid, const std::string &kind, std::int64_t now_us,
                             const std::string &scope) {
    Key key{uid, kind, scope};
    auto it = windows_.find(key);
    if (it == windows_.end() && windows_.size() >= max_keys_) {
        // Too many uids at once: they share one window per kind and pod, journaled only as a
        // count (one pod's thousands of uids never fold another pod's refusals into theirs;
        // the pods are bounded by the registry).
        auto [over, fresh] =
            windows_.try_emplace(Key{-1, kind, scope}, Window{now_us, now_us + window_us_, 0});
        over->second.count += 1;
        return false;
    }
    if (it == windows_.end()) {
        windows_.emplace(key, Window{now_us, now_us + window_us_, 0});
        return true;
    }
    it->second.count += 1;
    return false;
}

std::vector<RefusalCoalescer::Summary> RefusalCoalescer::close_if(std::int64_t now_us, bool all) {
    std::vector<Summary> out;
    for (auto it = windows_.begin(); it != windows_.end();) {
        Window &w = it->second;
        if (!all && now_us < w.until_us) {
            ++it;
            continue;
        }
        if (w.count == 0) {
            it = windows_.erase(it);
            continue;
        }
        Summary s;
        if (std::get<0>(it->first) >= 0) s.uid = static_cast<std::uint32_t>(std::get<0>(it->first));
        s.kind = std::get<1>(it->first);
        s.scope = std::get<2>(it->first);
        s.count = w.count;
        s.since_us = w.since_us;
        s.until_us = std::min(now_us, w.until_us);
        out.push_back(std::move(s));
        if (all) {
            it = windows_.erase(it);
            continue;
        }
        // Still being refused: the next window starts counting at once, with no full record.
        w = Window{now_us, now_us + window_us_, 0};
        ++it;
    }
    return out;
}

std::vector<RefusalCoalescer::Summary> RefusalCoalescer::close(std::int64_t now_us) {
    return close_if(now_us, false);
}

std::vector<RefusalCoalescer::Summary> RefusalCoalescer::close_all(std::int64_t now_us) {
    return close_if(now_us, true);
}

} // namespace knod::daemon
