// #33 item 7: key lifetimes run on CLOCK_BOOTTIME. The daemon's wall clock is stepped by an
// LD_PRELOAD shim (clock_shift.cc), as NTP or `date -s` would step it: a forward step must not
// end a key early, a backward one must not extend it. Before, both did (expiry compared the wall
// clock with a wall-clock deadline).
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

using namespace knod;
using namespace knod::test;

namespace {

const char *two_lifetimes = R"([[rule]]
name = "long"
any_caller = true
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000"]
iommu = "any"
key_lifetime = "1h"

[[rule]]
name = "short"
any_caller = true
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:6000"]
iommu = "any"
key_lifetime = "3s"
)";

std::int64_t real_now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// A daemon whose wall clock the test steps: offset() seconds ahead of (or behind) the host's.
class ClockSteps : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
        sb_ = std::make_unique<Sandbox>(two_lifetimes, std::vector<std::string>{}, 0, false);
        offset_file_ = sb_->dir() + "/clock-offset";
        fd_ = open(offset_file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        ASSERT_GE(fd_, 0);
        step(0);
        // Only the daemon gets the shim: it is set for the fork and exec of start_daemon().
        setenv("LD_PRELOAD", KNOD_CLOCK_SHIFT_LIB, 1);
        setenv("KNOD_TEST_CLOCK_OFFSET_FILE", offset_file_.c_str(), 1);
        sb_->start_daemon();
        unsetenv("LD_PRELOAD");
        unsetenv("KNOD_TEST_CLOCK_OFFSET_FILE");
    }
    void TearDown() override {
        sb_.reset();
        if (fd_ >= 0) close(fd_);
        if (region_ >= 0) close(region_);
    }
    void step(std::int64_t seconds) {
        ASSERT_EQ(pwrite(fd_, &seconds, sizeof seconds, 0), static_cast<ssize_t>(sizeof seconds));
    }
    Result<client::GrantedBinding> request(client::Client &c, int port) {
        return c.request_binding("knodsim0", "sim0", "rx-only", region_, 0, 4096,
                                 {"udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(port)});
    }
    std::string end_reason(const std::string &id) {
        return sb_->sql("SELECT ifnull(end_reason, 'open') FROM sessions WHERE id = '" + id + "'");
    }
    // Proves the daemon runs on the stepped clock: a refusal it journals now is dated so.
    bool daemon_clock_is_near(std::int64_t offset_s, client::Client &c) {
        (void)request(c, 7000); // no rule: denied, and journaled at the daemon's now
        std::string at = sb_->sql("SELECT max(at_us) FROM events WHERE kind = 'request-denied'");
        if (at.empty()) return false;
        std::int64_t skew = std::stoll(at) - real_now_us() - offset_s * 1'000'000;
        return skew > -600'000'000 && skew < 600'000'000; // within ten minutes of the step
    }

    std::unique_ptr<Sandbox> sb_;
    std::string offset_file_;
    int fd_ = -1;
    int region_ = make_region(4096);
};

} // namespace

TEST_F(ClockSteps, AForwardStepDoesNotEndAKeyEarly) {
    auto c = sb_->client();
    auto held = request(c, 5000); // an hour's key
    ASSERT_TRUE(held.ok()) << held.error().message;
    step(2 * 3600); // two hours forward
    ASSERT_TRUE(eventually([&] { return daemon_clock_is_near(2 * 3600, c); }))
        << "the shim did not step the daemon's clock";
    // A fence: a 3-second key granted after the step ends by expiry, so ticks ran after it.
    auto brief = request(c, 6000);
    ASSERT_TRUE(brief.ok()) << brief.error().message;
    EXPECT_TRUE(eventually([&] { return end_reason(brief->id) == "expire"; }))
        << end_reason(brief->id);
    EXPECT_EQ(end_reason(held->id), "open") << "an hour's key ended after seconds";
    auto state = c.state(held->id);
    ASSERT_TRUE(state.ok()) << state.error().message;
    EXPECT_EQ(*state, "granted");
}

TEST_F(ClockSteps, ABackwardStepDoesNotExtendAKey) {
    auto c = sb_->client();
    step(-3600); // an hour back, before the key is issued or after: neither may extend it
    ASSERT_TRUE(eventually([&] { return daemon_clock_is_near(-3600, c); }))
        << "the shim did not step the daemon's clock";
    auto brief = request(c, 6000);
    ASSERT_TRUE(brief.ok()) << brief.error().message;
    step(-7200);
    EXPECT_TRUE(eventually([&] { return end_reason(brief->id) == "expire"; }))
        << "a 3-second key outlived the step back: " << end_reason(brief->id);
}
