#include "daemon/rate_limiter.h"
#include "daemon/refusal_coalescer.h"

#include <gtest/gtest.h>

using namespace knod::daemon;
using Clock = RateLimiter::Clock;
using namespace std::chrono_literals;

namespace {
PrincipalKey host(std::uint32_t uid) {
    return principal_key(uid, "");
}
} // namespace

TEST(RateLimiter, ABurstThenTheRate) {
    RateLimiter limiter(10, 20);
    Clock::time_point t0{};
    int admitted = 0;
    for (int i = 0; i < 100; ++i)
        admitted += limiter.admit(host(7), t0);
    EXPECT_EQ(admitted, 20);
    EXPECT_FALSE(limiter.admit(host(7), t0 + 50ms)) << "half a token";
    EXPECT_TRUE(limiter.admit(host(7), t0 + 100ms)) << "one token a tenth of a second";
    EXPECT_FALSE(limiter.admit(host(7), t0 + 100ms));
    // After a long pause the bucket is full again, never fuller.
    admitted = 0;
    for (int i = 0; i < 100; ++i)
        admitted += limiter.admit(host(7), t0 + 1h);
    EXPECT_EQ(admitted, 20);
}

TEST(RateLimiter, EachKeyHasItsOwnBucket) {
    RateLimiter limiter(1, 3);
    Clock::time_point t0{};
    for (int i = 0; i < 10; ++i)
        (void)limiter.admit(host(65534), t0);
    EXPECT_FALSE(limiter.admit(host(65534), t0));
    EXPECT_TRUE(limiter.admit(host(1000), t0)) << "another uid is not throttled by the first";
}

TEST(RateLimiter, TheMapIsBoundedAndForgetsIdleBucketsFirst) {
    RateLimiter limiter(1, 2, 8);
    Clock::time_point t0{};
    for (int i = 0; i < 2; ++i)
        (void)limiter.admit(host(1), t0); // uid 1 is empty now
    for (std::uint32_t k = 100; k < 1100; ++k)
        (void)limiter.admit(host(k), t0 + 10s); // each of these is left with one token
    EXPECT_LE(limiter.size(), 8u);
    // Full of empty buckets: the one unused longest goes, a throttled key that keeps calling
    // keeps its empty bucket.
    RateLimiter busy(1, 2, 2);
    for (int i = 0; i < 2; ++i)
        (void)busy.admit(host(1), t0);
    for (int i = 0; i < 2; ++i)
        (void)busy.admit(host(2), t0 + 1ms);
    EXPECT_FALSE(busy.admit(host(1), t0 + 2ms));
    EXPECT_TRUE(busy.admit(host(3), t0 + 3ms));
    EXPECT_EQ(busy.size(), 2u);
    EXPECT_FALSE(busy.admit(host(1), t0 + 3ms)) << "uid 1 was not given a fresh bucket";
}

// Issue #51, failure 3: a pod's uid 1000 is not the host's uid 1000, nor another pod's: it
// cannot spend the host user's bucket (nor the other way round).
TEST(RateLimiter, AUidInAPodHasABucketOfItsOwn) {
    RateLimiter limiter(1, 3);
    Clock::time_point t0{};
    for (int i = 0; i < 10; ++i)
        (void)limiter.admit(principal_key(1000, "sandbox-a"), t0);
    EXPECT_FALSE(limiter.admit(principal_key(1000, "sandbox-a"), t0));
    EXPECT_TRUE(limiter.admit(host(1000), t0)) << "the host's uid 1000 is another principal";
    EXPECT_TRUE(limiter.admit(principal_key(1000, "sandbox-b"), t0)) << "so is another pod's";
}

// The attack review of #51: a pod's process that makes a network namespace of its own is in no
// registered pod any more, but it must not spend the host user's bucket either.
TEST(RateLimiter, AnUnplacedCallerDoesNotSpendTheHostUsersBucket) {
    RateLimiter limiter(1, 3);
    Clock::time_point t0{};
    for (int i = 0; i < 10; ++i)
        (void)limiter.admit(principal_key(1000, "", false), t0);
    EXPECT_FALSE(limiter.admit(principal_key(1000, "", false), t0));
    EXPECT_TRUE(limiter.admit(host(1000), t0)) << "the host's uid 1000 is another principal";
    EXPECT_EQ(principal_key(1000, "", false).to_string(), "uid 1000 in unplaced");
}

TEST(RefusalCoalescer, OneRecordPerWindowWithTheCount) {
    RefusalCoalescer c(1'000'000);
    EXPECT_TRUE(c.admit(65534, "request-denied", 0)) << "the first is journaled in full";
    for (int i = 1; i <= 999; ++i)
        EXPECT_FALSE(c.admit(65534, "request-denied", i * 100));
    EXPECT_TRUE(c.admit(65534, "activate-refused", 500)) << "another kind has its own window";
    EXPECT_TRUE(c.admit(1000, "request-denied", 500)) << "another uid has its own window";
    EXPECT_TRUE(c.close(999'999).empty()) << "nothing closes early";
    auto s = c.close(1'000'000);
    ASSERT_EQ(s.size(), 1u) << "windows that counted nothing close silently";
    EXPECT_EQ(s[0].uid, 65534u);
    EXPECT_EQ(s[0].kind, "request-denied");
    EXPECT_EQ(s[0].count, 999u);
    EXPECT_EQ(s[0].since_us, 0);
    EXPECT_EQ(s[0].until_us, 1'000'000);
    // Still refused: the next window counts at once, without another full record.
    EXPECT_FALSE(c.admit(65534, "request-denied", 1'000'001));
    EXPECT_TRUE(c.close(1'500'000).empty());
    s = c.close(2'000'000);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].count, 1u);
    // A quiet window ends the run: the next refusal is journaled in full again.
    EXPECT_TRUE(c.close(3'000'000).empty());
    EXPECT_EQ(c.size(), 0u);
    EXPECT_TRUE(c.admit(65534, "request-denied", 3'000'001));
}

// A container's root is uid 0 in every pod: one pod's refusals must not be counted as (and
// hide) another's, so each pod has windows of its own and its summaries name it.
TEST(RefusalCoalescer, EachPodHasItsOwnWindows) {
    RefusalCoalescer c(1'000'000);
    const std::string a = R"({"namespace":"team-a","name":"p"})";
    const std::string b = R"({"namespace":"team-b","name":"q"})";
    EXPECT_TRUE(c.admit(0, "request-denied", 0, a));
    EXPECT_TRUE(c.admit(0, "request-denied", 1, b)) << "another pod's first is in full too";
    EXPECT_TRUE(c.admit(0, "request-denied", 2)) << "and so is the same uid outside any pod";
    for (int i = 0; i < 5; ++i)
        EXPECT_FALSE(c.admit(0, "request-denied", 10 + i, b));
    auto s = c.close(1'000'002); // every window has ended
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].scope, b);
    EXPECT_EQ(s[0].count, 5u);
}

TEST(RefusalCoalescer, RecordsPerKeyStayWithinOnePerWindowUnderAFlood) {
    const std::int64_t window = 1'000'000;
    RefusalCoalescer c(window);
    std::uint64_t refused = 0, counted = 0;
    int records = 0;
    // 10 s of a refusal every 100 us, with a tick every 250 ms.
    for (std::int64_t now = 0; now < 10 * window; now += 100) {
        ++refused;
        records += c.admit(65534, "activate-refused", now);
        if (now % 250'000 == 0)
            for (auto &s : c.close(now)) {
                ++records;
                counted += s.count;
            }
    }
    for (auto &s : c.close_all(10 * window)) {
        ++records;
        counted += s.count;
    }
    EXPECT_LE(records, 11) << "one per window, plus the last one closed at the end";
    EXPECT_EQ(counted + 1, refused) << "every refusal is journaled or counted";
}

TEST(RefusalCoalescer, ManyUidsShareAnOverflowWindow) {
    RefusalCoalescer c(1'000'000, 4);
    int full = 0;
    for (std::uint32_t uid = 1; uid <= 100; ++uid)
        full += c.admit(uid, "rate-limited", 0);
    EXPECT_EQ(full, 4);
    EXPECT_LE(c.size(), 5u);
    auto s = c.close(1'000'000);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_FALSE(s[0].uid) << "the overflow entry names no uid";
    EXPECT_EQ(s[0].count, 96u);
}

// The attack review of #51: a pod's root with thousands of uids fills the map; another pod's
// refusals then still count as that pod's, never in the first pod's overflow or a shared one.
TEST(RefusalCoalescer, OnePodsManyUidsNeverFoldAnotherPodsRefusals) {
    RefusalCoalescer c(1'000'000, 4);
    for (std::uint32_t uid = 1; uid <= 100; ++uid)
        (void)c.admit(uid, "request-denied", 0, "pod-a");
    EXPECT_FALSE(c.admit(7, "request-denied", 0, "pod-b")) << "counted: the map is full";
    auto s = c.close(1'000'000);
    std::uint64_t a = 0, b = 0;
    for (auto &w : s)
        (w.scope == "pod-a" ? a : w.scope == "pod-b" ? b : a) += w.uid ? 0 : w.count;
    EXPECT_EQ(a, 96u);
    EXPECT_EQ(b, 1u) << "pod-b's refusal is its own";
}
