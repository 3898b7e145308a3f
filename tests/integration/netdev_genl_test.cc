// The devmem TCP interface against the live kernel: the netdev family resolves, queue-get reads
// a veth's queues in a namespace the test makes, and bind-rx on veth and lo fails with the
// kernel's reason. Also the rtnetlink inventory on the same veth. The namespace is removed even
// when a test fails.
#include "daemon/driver/devmem_driver.h"
#include "daemon/driver/netdev_genl.h"
#include "daemon/driver/ntuple.h"
#include "daemon/host/netdev_inventory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cstdlib>
#include <iostream>
#include <string>

using namespace knod;
using namespace knod::driver;

namespace {

int sh(const std::string &cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str());
}

// A network namespace with a 4-queue veth pair, entered by the calling thread for the
// lifetime of the object.
class TestNamespace {
  public:
    TestNamespace() : name_("knod-genl-" + std::to_string(getpid())) {
        sh("ip netns del " + name_);
        ok_ = sh("ip netns add " + name_) == 0 &&
              sh("ip -n " + name_ +
                 " link add knodq0 numrxqueues 4 numtxqueues 4 type veth peer name knodq1 "
                 "numrxqueues 4 numtxqueues 4") == 0 &&
              sh("ip -n " + name_ + " link set knodq0 up") == 0 &&
              sh("ip -n " + name_ + " link set knodq1 up") == 0 &&
              sh("ip -n " + name_ + " link set lo up") == 0;
        home_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        int fd = open(("/run/netns/" + name_).c_str(), O_RDONLY | O_CLOEXEC);
        ok_ = ok_ && fd >= 0 && home_ >= 0 && setns(fd, CLONE_NEWNET) == 0;
        if (fd >= 0) close(fd);
    }
    ~TestNamespace() {
        if (home_ >= 0) {
            setns(home_, CLONE_NEWNET);
            close(home_);
        }
        sh("ip netns del " + name_);
    }
    bool ok() const { return ok_; }

  private:
    std::string name_;
    int home_ = -1;
    bool ok_ = false;
};

// Not a dma-buf: the kernel must refuse before or at the fd, and say why.
int memfd() {
    int fd = memfd_create("knod-not-a-dmabuf", MFD_CLOEXEC);
    if (fd >= 0) (void)!ftruncate(fd, 1 << 20);
    return fd;
}

} // namespace

TEST(NetdevGenl, FamilyResolves) {
    auto nl = NetdevGenl::open();
    ASSERT_TRUE(nl) << nl.error().message;
    EXPECT_GT(nl->family(), 0);
}

TEST(NetdevGenl, QueueGetListsVethQueuesInATestNamespace) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto nl = NetdevGenl::open();
    ASSERT_TRUE(nl) << nl.error().message;
    int ifindex = static_cast<int>(if_nametoindex("knodq0"));
    ASSERT_GT(ifindex, 0);
    auto queues = nl->queues(ifindex);
    ASSERT_TRUE(queues) << queues.error().message;
    int rx = 0, tx = 0;
    for (auto &q : *queues) {
        (q.type == NetdevQueue::Type::rx ? rx : tx)++;
        EXPECT_FALSE(q.owned()) << "queue " << q.id << " of a fresh veth is owned";
    }
    EXPECT_EQ(rx, 4);
    EXPECT_EQ(tx, 4);

    auto dev = nl->device(ifindex);
    ASSERT_TRUE(dev) << dev.error().message;
    EXPECT_EQ(dev->ifindex, ifindex);
    EXPECT_NE(dev->xdp_features, 0u) << "veth supports at least basic XDP";
}

TEST(NetdevGenl, BindRxOnVethFailsWithTheKernelsReason) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto nl = NetdevGenl::open();
    ASSERT_TRUE(nl) << nl.error().message;
    int fd = memfd();
    ASSERT_GE(fd, 0);
    auto r = nl->bind_rx(static_cast<int>(if_nametoindex("knodq0")), {1}, fd);
    close(fd);
    ASSERT_FALSE(r);
    std::cout << "# veth: " << r.error().message << "\n";
    EXPECT_EQ(r.error().code, Errc::driver_failure);
    EXPECT_NE(r.error().message.find(
                  "netdev bind-rx: Operation not supported (kernel: bad attribute ifindex)"),
              std::string::npos)
        << r.error().message;

    // The socket stays usable after an error: the next request gets its own answer.
    auto queues = nl->queues(static_cast<int>(if_nametoindex("knodq0")));
    ASSERT_TRUE(queues) << queues.error().message;
    EXPECT_EQ(queues->size(), 8u);
}

TEST(NetdevGenl, BindRxOnLoopbackFails) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto nl = NetdevGenl::open();
    ASSERT_TRUE(nl) << nl.error().message;
    int fd = memfd();
    auto r = nl->bind_rx(static_cast<int>(if_nametoindex("lo")), {0}, fd);
    close(fd);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("Operation not supported"), std::string::npos)
        << r.error().message;
}

TEST(NetdevGenl, BindRxOnAMissingDeviceNamesIt) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto nl = NetdevGenl::open();
    ASSERT_TRUE(nl) << nl.error().message;
    int fd = memfd();
    auto r = nl->bind_rx(999999, {0}, fd);
    close(fd);
    ASSERT_FALSE(r);
    std::cout << "# missing device: " << r.error().message << "\n";
    EXPECT_NE(r.error().message.find("netdev bind-rx"), std::string::npos) << r.error().message;
}

TEST(NetdevInventory, RtnetlinkSeesTheVethWithItsQueues) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto list = host::list_netdevs(host::HostPaths{});
    ASSERT_TRUE(list) << list.error().message;
    const host::Netdev *veth = nullptr;
    for (auto &n : *list)
        if (n.name == "knodq0") veth = &n;
    ASSERT_NE(veth, nullptr);
    EXPECT_EQ(veth->ifindex, static_cast<int>(if_nametoindex("knodq0")));
    EXPECT_EQ(veth->rx_queues, 4u);
    EXPECT_EQ(veth->kind, "veth");
    EXPECT_TRUE(veth->admin_up);
    EXPECT_TRUE(veth->pci.empty()) << "a veth has no PCI parent";
}

TEST(DevmemDriver, ReservesAFreeQueueAndActivationFailsClosedOnVeth) {
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    auto d = DevmemDriver::open(host::HostPaths{});
    ASSERT_TRUE(d) << d.error().message;
    auto names = (*d)->netdevs();
    EXPECT_TRUE(
        std::any_of(names.begin(), names.end(), [](auto &n) { return n.name == "knodq0"; }));
    BindingPlan plan;
    plan.id = "b1";
    plan.netdev = "knodq0";
    plan.flows = {*policy::parse_flow_spec("udp 10.0.0.0/8:* -> 10.0.0.2:5000")};
    plan.region_fd = memfd();
    auto q = (*d)->attach(plan);
    ASSERT_TRUE(q) << q.error().message;
    EXPECT_EQ(*q, std::vector<std::uint32_t>{3}) << "the highest free RX queue of four";
    plan.id = "b2";
    auto q2 = (*d)->attach(plan);
    ASSERT_TRUE(q2);
    EXPECT_EQ(*q2, std::vector<std::uint32_t>{2}) << "queue 3 is b1's";
    auto on = (*d)->activate("b1");
    ASSERT_FALSE(on);
    EXPECT_EQ(on.error().code, Errc::driver_failure);
    EXPECT_NE(on.error().message.find("no queue management for devmem TCP"), std::string::npos)
        << on.error().message;
    (*d)->detach("b1");
    (*d)->detach("b2");
    close(plan.region_fd);

    plan.flows = {*policy::parse_flow_spec("udp 10.0.0.0/8:* -> 10.0.0.2:5000-5001")};
    auto ranged = (*d)->attach(plan);
    ASSERT_FALSE(ranged) << "a port range has no ntuple form";
    EXPECT_NE(ranged.error().message.find("port range"), std::string::npos);
}

TEST(FlowSteering, RulesCarryPrefixMasksAndExactPorts) {
    auto v4 = to_rx_flow_spec(*policy::parse_flow_spec("udp 10.20.0.0/16:* -> 10.20.1.10:5000"), 5,
                              policy::Family::ipv4);
    ASSERT_TRUE(v4) << v4.error().message;
    EXPECT_EQ(v4->flow_type, static_cast<__u32>(UDP_V4_FLOW));
    EXPECT_EQ(v4->ring_cookie, 5u);
    EXPECT_EQ(ntohl(v4->h_u.udp_ip4_spec.ip4src), 0x0a140000u);
    EXPECT_EQ(ntohl(v4->m_u.udp_ip4_spec.ip4src), 0xffff0000u);
    EXPECT_EQ(ntohl(v4->m_u.udp_ip4_spec.ip4dst), 0xffffffffu);
    EXPECT_EQ(ntohs(v4->h_u.udp_ip4_spec.pdst), 5000);
    EXPECT_EQ(v4->m_u.udp_ip4_spec.psrc, 0) << "any source port";
    auto any = to_rx_flow_spec(*policy::parse_flow_spec("any * -> *"), 1, policy::Family::ipv6);
    ASSERT_TRUE(any);
    EXPECT_EQ(any->flow_type, static_cast<__u32>(IPV6_USER_FLOW));
}

TEST(FlowSteering, RssTableDecidesWhetherAQueueIsPrivate) {
    EXPECT_TRUE(rss_reaches({0, 1, 2, 3, 0, 1, 2, 3}, 3));
    EXPECT_FALSE(rss_reaches({0, 1, 2, 0, 1, 2}, 3)) << "ethtool -X DEV equal 3";
    EXPECT_FALSE(rss_reaches({}, 0));
    // veth has no RSS table: nothing spreads onto its queues.
    TestNamespace ns;
    ASSERT_TRUE(ns.ok());
    EXPECT_TRUE(FlowSteering::check_not_in_rss("knodq0", 3));
    auto missing = FlowSteering::check_not_in_rss("knod-nonexistent", 1);
    ASSERT_FALSE(missing) << "an unreadable table fails closed";
    EXPECT_NE(missing.error().message.find("cannot read the RSS table"), std::string::npos);
}
