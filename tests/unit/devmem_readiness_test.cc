// The devmem pre-checks (issue 18): the kernel's answers parsed from crafted netlink messages
// (ethtool rings-get replies of 6.12 and 6.13+ kernels, rtnetlink IFLA_XDP), each problem judged
// with its fix, and the backend's TCP-only rule.
#include "daemon/driver/devmem_driver.h"
#include "host/devmem_readiness.h"
#include "policy/parser.h"

#include <gtest/gtest.h>
#include <linux/ethtool_netlink.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netlink/attr.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>

#include <memory>

using namespace knod;
using namespace knod::host;

namespace {

using MsgPtr = std::unique_ptr<nl_msg, decltype(&nlmsg_free)>;

// A rings-get reply as the kernel builds it: header nest, ring sizes, then the optional
// attributes (the kernel leaves tcp-data-split out when the driver reports none).
MsgPtr rings_reply(std::optional<std::uint8_t> split, std::optional<std::uint32_t> hds) {
    MsgPtr m(nlmsg_alloc(), nlmsg_free);
    genlmsg_put(m.get(), 0, 0, 20, 0, 0, ETHTOOL_MSG_RINGS_GET_REPLY, 1);
    nlattr *h = nla_nest_start(m.get(), ETHTOOL_A_RINGS_HEADER);
    nla_put_u32(m.get(), ETHTOOL_A_HEADER_DEV_INDEX, 2);
    nla_put_string(m.get(), ETHTOOL_A_HEADER_DEV_NAME, "eth2");
    nla_nest_end(m.get(), h);
    nla_put_u32(m.get(), ETHTOOL_A_RINGS_RX_MAX, 4096);
    nla_put_u32(m.get(), ETHTOOL_A_RINGS_RX, 256);
    if (split) nla_put_u8(m.get(), 11 /* ETHTOOL_A_RINGS_TCP_DATA_SPLIT */, *split);
    if (hds) nla_put_u32(m.get(), 17 /* ETHTOOL_A_RINGS_HDS_THRESH */, *hds);
    return m;
}

MsgPtr link_reply(std::optional<std::uint8_t> attached, std::uint32_t prog_id, int id_attr) {
    MsgPtr m(nlmsg_alloc_simple(RTM_NEWLINK, 0), nlmsg_free);
    ifinfomsg ifi{};
    ifi.ifi_index = 2;
    nlmsg_append(m.get(), &ifi, sizeof ifi, NLMSG_ALIGNTO);
    nla_put_string(m.get(), IFLA_IFNAME, "eth2");
    if (attached) {
        nlattr *x = nla_nest_start(m.get(), IFLA_XDP);
        nla_put_u8(m.get(), IFLA_XDP_ATTACHED, *attached);
        if (prog_id) nla_put_u32(m.get(), id_attr, prog_id);
        nla_nest_end(m.get(), x);
    }
    return m;
}

DevmemFacts ready() {
    DevmemFacts f;
    f.netdev = "eth2";
    f.rx_queues = 8;
    f.split = HeaderSplit{2, std::nullopt};
    f.xdp = XdpAttachment{};
    f.rss = std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
    return f;
}

bool has(const std::vector<DevmemProblem> &ps, const std::string &check, const std::string &text,
         const std::string &fix) {
    for (auto &p : ps)
        if (p.check == check && p.message.find(text) != std::string::npos &&
            p.fix.find(fix) != std::string::npos)
            return true;
    return false;
}

} // namespace

TEST(DevmemReadiness, RingsRepliesOfEachKernel) {
    auto on = rings_reply(2, 0);
    auto r = parse_rings_reply(nlmsg_hdr(on.get()));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(r->tcp_data_split, std::optional<std::uint8_t>(2));
    EXPECT_EQ(r->hds_thresh, std::optional<std::uint32_t>(0));
    // 6.12: no hds-thresh at all (unknown, not wrong); a driver without header split: no
    // tcp-data-split either (e1000e).
    auto old = rings_reply(std::nullopt, std::nullopt);
    r = parse_rings_reply(nlmsg_hdr(old.get()));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_FALSE(r->tcp_data_split);
    EXPECT_FALSE(r->hds_thresh);
}

TEST(DevmemReadiness, XdpAttachmentAndItsProgram) {
    auto none = link_reply(XDP_ATTACHED_NONE, 0, IFLA_XDP_PROG_ID);
    auto x = parse_link_xdp(nlmsg_hdr(none.get()));
    ASSERT_TRUE(x) << x.error().message;
    EXPECT_FALSE(x->attached());
    auto gen = link_reply(XDP_ATTACHED_SKB, 42, IFLA_XDP_PROG_ID);
    x = parse_link_xdp(nlmsg_hdr(gen.get()));
    ASSERT_TRUE(x);
    EXPECT_TRUE(x->attached());
    EXPECT_EQ(x->prog_id, 42u);
    // Several modes at once: the kernel gives per-mode ids only.
    auto multi = link_reply(XDP_ATTACHED_MULTI, 7, IFLA_XDP_DRV_PROG_ID);
    x = parse_link_xdp(nlmsg_hdr(multi.get()));
    ASSERT_TRUE(x);
    EXPECT_EQ(x->prog_id, 7u);
    auto no_xdp = link_reply(std::nullopt, 0, 0);
    x = parse_link_xdp(nlmsg_hdr(no_xdp.get()));
    ASSERT_TRUE(x);
    EXPECT_FALSE(x->attached());
}

TEST(DevmemReadiness, AReadyNicHasNoProblem) {
    auto f = ready();
    EXPECT_TRUE(devmem_problems(f).empty());
    EXPECT_EQ(queues_outside_rss(f), (std::vector<std::uint32_t>{6, 7}));
    f.rss.reset(); // no RSS table: nothing spreads
    EXPECT_TRUE(devmem_problems(f).empty());
    EXPECT_EQ(queues_outside_rss(f).size(), 7u);
}

TEST(DevmemReadiness, EachProblemNamesItsFix) {
    auto f = ready();
    f.split = HeaderSplit{1, std::nullopt};
    auto p = devmem_problems(f);
    EXPECT_TRUE(has(p, "header-split", "is off", "ethtool -G eth2 tcp-data-split on"));
    EXPECT_TRUE(p[0].refuses_bind);

    f = ready();
    f.split = HeaderSplit{std::nullopt, std::nullopt};
    EXPECT_TRUE(has(devmem_problems(f), "header-split", "reports no header split", "gve"));

    f = ready();
    f.split = HeaderSplit{2, 256};
    EXPECT_TRUE(
        has(devmem_problems(f), "hds-thresh", "hds-thresh is 256", "ethtool -G eth2 hds-thresh 0"));

    f = ready();
    f.split.reset();
    f.split_error = "ethtool rings-get: Operation not supported";
    EXPECT_TRUE(has(devmem_problems(f), "header-split", "Operation not supported", ""));

    f = ready();
    f.xdp = XdpAttachment{XDP_ATTACHED_SKB, 42, "knod_flow_filte"};
    p = devmem_problems(f);
    EXPECT_TRUE(has(p, "xdp", "generic, program id 42 ('knod_flow_filte'), knod's own flow filter",
                    "ip link set dev eth2 xdp off"))
        << (p.empty() ? "" : p[0].message);

    f = ready();
    f.rx_queues = 1;
    f.rss = std::vector<std::uint32_t>{0, 0};
    p = devmem_problems(f);
    EXPECT_TRUE(has(p, "queues", "one active RX queue", "ethtool -L eth2 combined"));
    EXPECT_FALSE(p[0].refuses_bind) << "the queue choice says so itself";

    f = ready();
    f.rss = std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT_TRUE(has(devmem_problems(f), "rss", "every RX queue past 0", "ethtool -X eth2 equal 7"));

    f = ready();
    f.rss.reset();
    f.rss_error = "cannot read the RSS table of eth2: Operation not permitted";
    EXPECT_TRUE(has(devmem_problems(f), "rss", "Operation not permitted", ""));
}

TEST(DevmemReadiness, TheBackendServesTcpFlowsOnly) {
    auto tcp = *policy::parse_flow_spec("tcp 10.0.0.0/8:* -> 10.0.0.2:5000");
    auto udp = *policy::parse_flow_spec("udp 10.0.0.0/8:* -> 10.0.0.2:5000");
    auto any = *policy::parse_flow_spec("any * -> 10.0.0.2");
    EXPECT_TRUE(driver::require_tcp_flows({tcp}));
    for (auto &f : {udp, any}) {
        auto r = driver::require_tcp_flows({tcp, f});
        ASSERT_FALSE(r) << f.to_string();
        EXPECT_EQ(r.error().code, Errc::invalid_argument);
        EXPECT_NE(r.error().message.find("devmem receives TCP only"), std::string::npos)
            << r.error().message;
        EXPECT_NE(r.error().message.find(f.to_string()), std::string::npos);
    }
}

TEST(DevmemReadiness, CheckSaysWhichRulesDevmemCanNeverServe) {
    auto load = policy::parse_policy_text(R"([[rule]]
name = "tcp-only"
any_caller = true
max_region = "1MiB"
flows = ["tcp * -> *:5000"]

[[rule]]
name = "udp-only"
any_caller = true
max_region = "1MiB"
flows = ["udp * -> *:5000", "any * -> 10.0.0.1:7"]

[[rule]]
name = "mixed"
any_caller = true
max_region = "1MiB"
flows = ["tcp * -> *:5000", "tcp * -> *:6000-6100", "udp * -> *:7000"]

[[rule]]
name = "deny"
any_caller = true
action = "deny"
flows = ["udp * -> *:9"]
)",
                                          "/etc/knod/policy.toml");
    ASSERT_TRUE(load.ok()) << load.errors_text();
    auto w = devmem_policy_warnings(load.policy);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[0].severity, policy::Severity::warning);
    EXPECT_NE(w[0].message.find("rule 'udp-only' can never be served by the devmem driver"),
              std::string::npos)
        << w[0].message;
    EXPECT_NE(w[0].message.find("not TCP"), std::string::npos);
    EXPECT_EQ(w[0].where.line, 7) << "points at the rule";
    EXPECT_NE(w[1].message.find("rule 'mixed' has flows the devmem driver never serves"),
              std::string::npos)
        << w[1].message;
    EXPECT_NE(w[1].message.find("6000-6100: a port range"), std::string::npos) << w[1].message;
    EXPECT_EQ(w[1].message.find("*:5000:"), std::string::npos) << "the TCP flow is servable";
}

// Issue 18: the doctor names each RX queue a dma-buf, io_uring zero-copy receive or AF_XDP
// holds, from a queue-get answer (no io_uring zcrx NIC exists on these machines).
TEST(DevmemReadiness, HeldQueuesAreNamedWithTheirHolder) {
    using driver::NetdevQueue;
    std::vector<NetdevQueue> q;
    for (std::uint32_t i = 0; i < 5; ++i) {
        q.push_back({i, NetdevQueue::Type::rx, 0, std::nullopt, false, false});
        q.push_back({i, NetdevQueue::Type::tx, 0, std::nullopt, false, false});
    }
    EXPECT_TRUE(held_rx_queues(q).empty());
    q[8].dmabuf = 7;      // rx 4
    q[6].io_uring = true; // rx 3
    q[2].xsk = true;      // rx 1
    q[5].xsk = true;      // tx 2: not an RX queue
    auto held = held_rx_queues(q);
    ASSERT_EQ(held.size(), 3u);
    EXPECT_EQ(held[0], "queue 1 is held by an AF_XDP socket");
    EXPECT_EQ(held[1], "queue 3 is held by io_uring zero-copy receive");
    EXPECT_EQ(held[2], "queue 4 is held by a devmem dma-buf (binding 7)");
}

namespace {

// A qstats-get reply as the kernel builds it (queue scope); `wide` sends the counters as u64.
std::unique_ptr<nl_msg, decltype(&nlmsg_free)> qstats_reply(std::uint32_t type, std::uint32_t id,
                                                            std::uint64_t packets,
                                                            std::uint64_t bytes, bool wide) {
    std::unique_ptr<nl_msg, decltype(&nlmsg_free)> m(nlmsg_alloc(), nlmsg_free);
    genlmsg_put(m.get(), 0, 0, 30, 0, 0, 12, 1);
    nla_put_u32(m.get(), 1, 2); // ifindex
    nla_put_u32(m.get(), 2, type);
    nla_put_u32(m.get(), 3, id);
    if (wide) {
        nla_put_u64(m.get(), 8, packets);
        nla_put_u64(m.get(), 9, bytes);
    } else {
        nla_put_u32(m.get(), 8, static_cast<std::uint32_t>(packets));
        nla_put_u32(m.get(), 9, static_cast<std::uint32_t>(bytes));
    }
    return m;
}

} // namespace

// Issue 18: the bound queue's hardware counters, from crafted qstats-get replies.
TEST(DevmemQstats, ParsesRxQueueRepliesOfEitherWidth) {
    auto narrow = qstats_reply(0, 3, 41, 5000, false);
    auto s = driver::parse_qstats_reply(nlmsg_hdr(narrow.get()));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->queue, 3u);
    EXPECT_EQ(s->rx_packets, 41u);
    EXPECT_EQ(s->rx_bytes, 5000u);
    auto wide = qstats_reply(0, 2, 1ull << 33, 1ull << 40, true);
    auto w = driver::parse_qstats_reply(nlmsg_hdr(wide.get()));
    ASSERT_TRUE(w);
    EXPECT_EQ(w->rx_packets, 1ull << 33);
    EXPECT_EQ(w->rx_bytes, 1ull << 40);
    auto tx = qstats_reply(1, 3, 1, 1, false); // a TX queue's: not an RX queue's stats
    EXPECT_FALSE(driver::parse_qstats_reply(nlmsg_hdr(tx.get())));
}

TEST(DevmemQstats, DeviceScopeReplyIsNoQueue) {
    std::unique_ptr<nl_msg, decltype(&nlmsg_free)> m(nlmsg_alloc(), nlmsg_free);
    genlmsg_put(m.get(), 0, 0, 30, 0, 0, 12, 1);
    nla_put_u32(m.get(), 1, 2);
    nla_put_u64(m.get(), 8, 7);
    EXPECT_FALSE(driver::parse_qstats_reply(nlmsg_hdr(m.get())));
}

// The live kernel: lo keeps no per-queue stats; the answer (EOPNOTSUPP or an empty dump) is
// "none", not an error.
TEST(DevmemQstats, LiveLoopbackHasNoQueueStatsAndThatIsNotAnError) {
    auto genl = driver::NetdevGenl::open();
    if (!genl) GTEST_SKIP() << genl.error().message;
    auto s = genl->rx_queue_stats(1, 0);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_FALSE(s->has_value());
}

// A reply whose IFLA_XDP attributes are shorter than their type (a u8 or u32 with no payload) is
// refused, not read past the attribute into whatever follows (here: the next attribute's header
// would be taken for a program id, or a mode).
TEST(DevmemReadiness, ShortXdpAttributesAreRefused) {
    for (int attr : {IFLA_XDP_ATTACHED, IFLA_XDP_PROG_ID, IFLA_XDP_DRV_PROG_ID}) {
        SCOPED_TRACE(attr);
        MsgPtr m(nlmsg_alloc_simple(RTM_NEWLINK, 0), nlmsg_free);
        ifinfomsg ifi{};
        ifi.ifi_index = 2;
        nlmsg_append(m.get(), &ifi, sizeof ifi, NLMSG_ALIGNTO);
        nlattr *x = nla_nest_start(m.get(), IFLA_XDP);
        nla_put(m.get(), attr, 0, nullptr); // the attribute's header only
        nla_put_u32(m.get(), IFLA_XDP_FLAGS, 0x01020304);
        nla_nest_end(m.get(), x);
        nla_put_string(m.get(), IFLA_IFNAME, "eth2");
        auto r = parse_link_xdp(nlmsg_hdr(m.get()));
        ASSERT_FALSE(r) << "parsed mode " << int(r->mode) << ", program id " << r->prog_id;
        EXPECT_EQ(r.error().code, Errc::corrupt);
    }
}

// A qstats reply whose queue id or type has no payload is no queue's stats: the parser must not
// take the next attribute's header for the id.
TEST(DevmemQstats, ShortQueueAttributesAreNoQueue) {
    for (int attr : {2 /* queue type */, 3 /* queue id */}) {
        SCOPED_TRACE(attr);
        std::unique_ptr<nl_msg, decltype(&nlmsg_free)> m(nlmsg_alloc(), nlmsg_free);
        genlmsg_put(m.get(), 0, 0, 30, 0, 0, 12, 1);
        nla_put_u32(m.get(), 1, 2);
        if (attr == 2) nla_put(m.get(), 2, 0, nullptr);
        nla_put_u32(m.get(), 3, 3); // queue id (for attr 3: a short one follows, taken last)
        if (attr == 3) nla_put(m.get(), 3, 0, nullptr);
        if (attr == 3) nla_put_u32(m.get(), 2, 0);
        nla_put_u32(m.get(), 8, 41);
        auto s = driver::parse_qstats_reply(nlmsg_hdr(m.get()));
        EXPECT_FALSE(s) << "stats for queue " << s->queue;
    }
}
