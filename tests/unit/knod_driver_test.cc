// The knod backend on a copy of the MI250X fixture machine: inventory from /sys/class/knod,
// queue choice, and the lines it writes to bind and unbind. The copy is removed afterwards.
#include "daemon/driver/knod_driver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace knod;
using namespace knod::driver;
namespace fs = std::filesystem;

namespace {

class KnodFixture : public ::testing::Test {
  protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() / ("knod-fixture-" + std::to_string(getpid()));
        fs::remove_all(root_);
        fs::copy(KNOD_SOURCE_DIR "/tests/data/hosts/mi250x-cx6", root_,
                 fs::copy_options::recursive | fs::copy_options::copy_symlinks);
        paths_ = host::HostPaths::under(root_.string());
    }
    void TearDown() override { fs::remove_all(root_); }
    std::string control(const char *file) {
        std::ifstream in(root_ / "sys/class/knod/knod0" / file);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    BindingPlan plan(const std::string &id) {
        BindingPlan p;
        p.id = id;
        p.netdev = "eth2";
        p.gpu = "/dev/dri/renderD128";
        p.flows = {*policy::parse_flow_spec("udp 10.20.0.0/16:* -> 10.20.1.10:5000")};
        p.region_fd = 7;
        p.offset = 4096;
        p.length = 1 << 20;
        return p;
    }
    fs::path root_;
    host::HostPaths paths_;
};

} // namespace

TEST_F(KnodFixture, InventoryComesFromSysClassKnod) {
    auto d = KnodDriver::open(paths_);
    ASSERT_TRUE(d) << d.error().message;
    auto netdevs = (*d)->netdevs();
    ASSERT_EQ(netdevs.size(), 1u) << "eth3 has no KNOD device";
    EXPECT_EQ(netdevs[0].name, "eth2");
    EXPECT_EQ(netdevs[0].rx_queues, 8u);
    EXPECT_EQ(netdevs[0].pci, "0000:04:00.0");
    auto gpu = (*d)->gpu("/dev/dri/renderD128");
    ASSERT_TRUE(gpu) << gpu.error().message;
    EXPECT_EQ(gpu->pci, "0000:03:00.0");
    EXPECT_EQ(gpu->vram_bytes, 68702699520ull);
    EXPECT_FALSE((*d)->netdev("eth3"));
    EXPECT_EQ((*d)->region_kind(), RegionKind::dma_buf);
}

TEST_F(KnodFixture, BindWritesTheControlLineOnlyAfterActivation) {
    auto d = KnodDriver::open(paths_);
    ASSERT_TRUE(d) << d.error().message;
    auto q = (*d)->attach(plan("b1"));
    ASSERT_TRUE(q) << q.error().message;
    EXPECT_EQ(*q, std::vector<std::uint32_t>{7}) << "the highest offload queue";
    EXPECT_EQ(control("bind"), "") << "nothing reaches the module before the key";
    ASSERT_TRUE((*d)->activate("b1"));
    EXPECT_EQ(control("bind"), "b1 7 7 4096 1048576 udp 10.20.0.0/16:* -> 10.20.1.10:5000\n");
    auto q2 = (*d)->attach(plan("b2"));
    ASSERT_TRUE(q2);
    EXPECT_EQ(*q2, std::vector<std::uint32_t>{6});

    std::ofstream(root_ / "sys/class/knod/knod0/stats") << "b2 1 1 0\nb1 4096 4 1\n";
    auto c = (*d)->counters("b1");
    EXPECT_EQ(c.rx_bytes, 4096u);
    EXPECT_EQ(c.rx_packets, 4u);
    EXPECT_EQ(c.dropped_packets, 1u);

    (*d)->detach("b1");
    (*d)->detach("b2"); // never activated: nothing to unbind
    EXPECT_EQ(control("unbind"), "b1\n");
}

TEST_F(KnodFixture, RefusesAPairTheModuleDoesNotOffer) {
    auto d = KnodDriver::open(paths_);
    ASSERT_TRUE(d);
    auto p = plan("b1");
    p.netdev = "eth3";
    auto q = (*d)->attach(p);
    ASSERT_FALSE(q);
    EXPECT_NE(q.error().message.find("not paired"), std::string::npos) << q.error().message;
}

TEST_F(KnodFixture, RunsOutOfQueues) {
    auto d = KnodDriver::open(paths_);
    ASSERT_TRUE(d);
    for (int i = 1; i <= 7; ++i)
        ASSERT_TRUE((*d)->attach(plan("b" + std::to_string(i))));
    auto q = (*d)->attach(plan("b8"));
    ASSERT_FALSE(q);
    EXPECT_NE(q.error().message.find("every offload queue"), std::string::npos);
}

TEST(KnodDriver, OpenFailsWithoutDevices) {
    auto d = KnodDriver::open(host::HostPaths::under(KNOD_SOURCE_DIR "/tests/data/hosts/identity"));
    ASSERT_FALSE(d);
    EXPECT_EQ(d.error().code, Errc::unavailable);
}
