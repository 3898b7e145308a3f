// The devmem backend's choice of RX queue: never queue 0, never an owned or reserved one, and
// an error that tells a one-queue NIC (issue 17, item 6) from one whose queues are all taken.
#include "daemon/driver/devmem_driver.h"

#include <gtest/gtest.h>

using namespace knod;
using knod::driver::NetdevQueue;

namespace {

std::vector<NetdevQueue> rx_queues(std::uint32_t n) {
    std::vector<NetdevQueue> out;
    for (std::uint32_t i = 0; i < n; ++i) {
        out.push_back({i, NetdevQueue::Type::rx, 0, std::nullopt, false, false});
        out.push_back({i, NetdevQueue::Type::tx, 0, std::nullopt, false, false});
    }
    return out;
}

auto none = [](std::uint32_t) { return false; };

} // namespace

TEST(DevmemQueue, HighestFreeQueuePastZero) {
    auto q = rx_queues(4);
    auto c = driver::choose_rx_queue("eth0", q, none);
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(*c, 3u);
    q[6].xsk = true; // rx 3
    auto d = driver::choose_rx_queue("eth0", q, [](std::uint32_t id) { return id == 2; });
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(*d, 1u);
}

TEST(DevmemQueue, OneQueueNicIsNamedAsSuch) {
    auto c = driver::choose_rx_queue("eth1", rx_queues(1), none);
    ASSERT_FALSE(c);
    EXPECT_NE(c.error().message.find("eth1 has one RX queue"), std::string::npos)
        << c.error().message;
    EXPECT_EQ(c.error().message.find("bound to a dma-buf"), std::string::npos)
        << "nothing is bound: the NIC has one queue";
}

TEST(DevmemQueue, AllQueuesTakenSaysBy) {
    auto q = rx_queues(3);
    q[2].dmabuf = 7;      // rx 1
    q[4].io_uring = true; // rx 2
    auto c = driver::choose_rx_queue("eth2", q, none);
    ASSERT_FALSE(c);
    EXPECT_NE(c.error().message.find("no free RX queue"), std::string::npos) << c.error().message;
    EXPECT_NE(c.error().message.find("bound to a dma-buf"), std::string::npos);
}
