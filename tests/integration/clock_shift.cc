// An LD_PRELOAD shim that steps the wall clock of the process it is loaded into, for tests of
// what a clock step (NTP, an admin's `date -s`) does to the daemon: CLOCK_REALTIME (and its
// coarse variant, gettimeofday(2), time(2)) read the real clock plus an offset in seconds, an
// int64 at the start of the file named by KNOD_TEST_CLOCK_OFFSET_FILE, mapped shared so the
// test moves the clock by writing the file. CLOCK_MONOTONIC and CLOCK_BOOTTIME are untouched, as
// in a real step. No file, or an unreadable one: no offset.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace {

std::atomic<const volatile std::int64_t *> offset_map{nullptr};
std::atomic<bool> tried{false};

std::int64_t offset_s() {
    if (!tried.exchange(true)) {
        if (const char *path = std::getenv("KNOD_TEST_CLOCK_OFFSET_FILE")) {
            int fd = ::open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = ::mmap(nullptr, sizeof(std::int64_t), PROT_READ, MAP_SHARED, fd, 0);
                ::close(fd);
                if (p != MAP_FAILED) offset_map = static_cast<const volatile std::int64_t *>(p);
            }
        }
    }
    const volatile std::int64_t *m = offset_map.load();
    return m ? *m : 0;
}

int real_clock_gettime(clockid_t id, struct timespec *ts) {
    return static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
}

bool is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

} // namespace

extern "C" {

int clock_gettime(clockid_t id, struct timespec *ts) noexcept {
    int r = real_clock_gettime(id, ts);
    if (r == 0 && is_wall(id)) ts->tv_sec += offset_s();
    return r;
}

int gettimeofday(struct timeval *tv, void *) noexcept {
    struct timespec ts {};
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) noexcept {
    struct timespec ts {};
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}

} // extern "C"
