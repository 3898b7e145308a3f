// CLOCK_BOOTTIME as a std::chrono clock: it never jumps (a wall-clock step by NTP or `date -s`
// does not move it) and, unlike CLOCK_MONOTONIC, it counts time spent suspended, so a key
// lifetime of an hour is an hour however the host spends it. Durations run on it; the wall clock
// is only for what the journal and the API record.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace knod {

struct BootClock {
    using duration = std::chrono::microseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<BootClock>;
    static constexpr bool is_steady = true;

    static time_point now() noexcept {
        struct timespec ts {};
        ::clock_gettime(CLOCK_BOOTTIME, &ts);
        return time_point(duration(std::int64_t{ts.tv_sec} * 1'000'000 + ts.tv_nsec / 1000));
    }
};

} // namespace knod
