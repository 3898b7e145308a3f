// The devmem guard (tc ingress, issue 18) in the kernel, driven with BPF_PROG_TEST_RUN: crafted
// packets on a given RX queue in (the test entry reads it from cb[0]), verdict and per-binding
// counters out. A binding's own packet on its queue is counted; its own flow's malformed packets
// and first fragments there are dropped for it; anything else on a bound queue is dropped and
// counted as misrouted for the queue's binding; unbound queues are untouched.
// Needs root (CAP_BPF); skipped otherwise.
#include "bpf/flow_filter.h"
#include "bpf/packet_builder.h"

#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <unistd.h>

using namespace knod;
using namespace knod::bpf;

namespace {
constexpr std::uint8_t tcp = 6; // devmem receive is TCP only
}
using knod::bpf::packets::build_packet;
using knod::bpf::packets::PacketSpec;
using knod::bpf::packets::v4;
using knod::bpf::packets::v6;
using knod::bpf::packets::with;

namespace {

// dropped: one of the queue binding's own flows, malformed or a first fragment (what a NIC's
// ntuple rule matches by is intact): dropped and counted for it, not as drift.
enum class Want { counted, misrouted, dropped, untouched };

struct Case {
    const char *name;
    std::uint32_t queue;
    PacketSpec packet;
    Want want;
    std::uint32_t slot = 0; // whose counter moves
};

class DevmemGuardTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "BPF tests need root";
        auto f = FlowFilter::load();
        ASSERT_TRUE(f.ok()) << f.error().message;
        filter_ = std::move(*f);
        install(1, SlotState::active, 3, {"tcp 10.0.0.0/16:* -> 10.1.2.3:5000"});
        install(2, SlotState::active, 5, {"tcp [fd00::/8]:* -> [fd00::1]:443"});
        install(3, SlotState::inactive, 6, {"tcp 10.9.9.9:7 -> 10.1.2.3:7000"});
        install(4, SlotState::active, 7, {"tcp 10.0.0.5:1234 -> 10.1.2.3:6000"});
    }
    void install(std::uint32_t slot, SlotState state, std::uint32_t queue,
                 std::vector<const char *> flows) {
        std::vector<policy::FlowSpec> specs;
        for (auto *f : flows)
            specs.push_back(*policy::parse_flow_spec(f));
        ASSERT_TRUE(filter_->set_slot(slot, state, queue).ok());
        auto r = filter_->set_flows(slot, specs);
        ASSERT_TRUE(r.ok()) << r.error().message;
    }
    int run(std::uint32_t queue, const std::vector<std::uint8_t> &packet) {
        __sk_buff ctx{};
        ctx.cb[0] = queue;
        LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = packet.data(),
                    .data_size_in = static_cast<__u32>(packet.size()), .ctx_in = &ctx,
                    .ctx_size_in = sizeof ctx, .repeat = 1);
        int r = bpf_prog_test_run_opts(filter_->guard_test_program_fd(), &opts);
        EXPECT_EQ(r, 0) << "BPF_PROG_TEST_RUN failed: " << r;
        return static_cast<int>(opts.retval);
    }
    void check(const Case &c) {
        SCOPED_TRACE(c.name);
        std::vector<SlotCounters> before;
        for (std::uint32_t s = 0; s < 6; ++s)
            before.push_back(filter_->counters(s));
        auto packet = build_packet(c.packet);
        std::uint64_t st = filter_->stats().misrouted;
        int verdict = run(c.queue, packet);
        for (std::uint32_t s = 0; s < 6; ++s) {
            SlotCounters now = filter_->counters(s);
            bool mine = s == c.slot;
            EXPECT_EQ(now.packets - before[s].packets, mine && c.want == Want::counted ? 1u : 0u)
                << "slot " << s;
            EXPECT_EQ(now.bytes - before[s].bytes,
                      mine && c.want == Want::counted ? packet.size() : 0u)
                << "slot " << s;
            EXPECT_EQ(now.misrouted - before[s].misrouted,
                      mine && c.want == Want::misrouted ? 1u : 0u)
                << "slot " << s;
            EXPECT_EQ(now.drops - before[s].drops, mine && c.want == Want::dropped ? 1u : 0u)
                << "slot " << s;
        }
        EXPECT_EQ(filter_->stats().misrouted - st, c.want == Want::misrouted ? 1u : 0u);
        bool shot = c.want == Want::misrouted || c.want == Want::dropped;
        EXPECT_EQ(verdict, shot ? TC_ACT_SHOT : TC_ACT_OK);
    }

    std::unique_ptr<FlowFilter> filter_;
};

} // namespace

TEST_F(DevmemGuardTest, CraftedPacketsOnEachQueue) {
    const PacketSpec mine = v4("10.0.1.1", 999, "10.1.2.3", 5000, tcp);
    const PacketSpec mine6 = v6("fd00::5", 999, "fd00::1", 443);
    const Case cases[] = {
        {"on-queue match", 3, mine, Want::counted, 1},
        {"on-queue match at the /16 edge", 3, v4("10.0.255.255", 1, "10.1.2.3", 5000, tcp),
         Want::counted, 1},
        {"802.1Q tagged on its queue", 3, with(mine, [](auto &p) { p.vlans = {0x8100}; }),
         Want::counted, 1},
        {"802.1ad tagged on its queue", 3, with(mine, [](auto &p) { p.vlans = {0x88a8}; }),
         Want::counted, 1},
        {"IPv4 options on its queue", 3, with(mine, [](auto &p) { p.ipv4_ihl = 6; }), Want::counted,
         1},
        {"DF is not a fragment", 3, with(mine, [](auto &p) { p.ipv4_frag = 0x4000; }),
         Want::counted, 1},
        {"exact 5-tuple on its queue", 7, v4("10.0.0.5", 1234, "10.1.2.3", 6000, tcp),
         Want::counted, 4},
        {"IPv6 on its queue", 5, mine6, Want::counted, 2},
        {"IPv6 hop-by-hop on its queue", 5, with(mine6, [](auto &p) { p.ipv6_ext = {0}; }),
         Want::counted, 2},
        {"IPv6 VLAN on its queue", 5, with(mine6, [](auto &p) { p.vlans = {0x8100}; }),
         Want::counted, 2},
        // Misrouted: not the binding's, yet on its queue.
        {"another port on a bound queue", 3, v4("10.0.1.1", 999, "10.1.2.3", 5001, tcp),
         Want::misrouted, 1},
        {"another source on a bound queue", 3, v4("10.1.0.1", 999, "10.1.2.3", 5000, tcp),
         Want::misrouted, 1},
        {"UDP on a bound queue", 3, v4("10.0.1.1", 999, "10.1.2.3", 5000, 17), Want::misrouted, 1},
        {"binding 1's flow on binding 2's queue", 5, mine, Want::misrouted, 2},
        {"binding 2's flow on binding 1's queue", 3, mine6, Want::misrouted, 1},
        {"exact flow, other source port, on its queue", 7,
         v4("10.0.0.5", 1235, "10.1.2.3", 6000, tcp), Want::misrouted, 4},
        {"IPv4 first fragment of its flow", 3, with(mine, [](auto &p) { p.ipv4_frag = 0x2000; }),
         Want::dropped, 1},
        {"IPv4 first fragment of another flow", 3,
         with(v4("10.0.1.1", 999, "10.1.2.3", 5001, tcp), [](auto &p) { p.ipv4_frag = 0x2000; }),
         Want::misrouted, 1},
        {"IPv4 later fragment of its flow", 3, with(mine, [](auto &p) { p.ipv4_frag = 0x0010; }),
         Want::misrouted, 1},
        {"IPv6 fragment of its flow", 5, with(mine6, [](auto &p) { p.ipv6_ext = {44}; }),
         Want::misrouted, 2},
        // (A test run refuses an skb whose IPv4 header is cut short: EINVAL.)
        {"truncated TCP header of its flow", 3,
         with(mine, [](auto &p) { p.truncate = 14 + 20 + 10; }), Want::dropped, 1},
        {"truncated TCP header of another flow", 3,
         with(v4("10.1.0.1", 999, "10.1.2.3", 5000, tcp),
              [](auto &p) { p.truncate = 14 + 20 + 10; }),
         Want::misrouted, 1},
        {"its flow's first fragment on another binding's queue", 5,
         with(mine, [](auto &p) { p.ipv4_frag = 0x2000; }), Want::misrouted, 2},
        {"IPv4 ihl below 5", 3, with(mine, [](auto &p) { p.ipv4_ihl = 4; }), Want::misrouted, 1},
        {"ARP on a bound queue", 3, with(mine, [](auto &p) { p.ethertype = 0x0806; }),
         Want::misrouted, 1},
        {"inactive binding's flow on a bound queue", 3, v4("10.9.9.9", 7, "10.1.2.3", 7000, tcp),
         Want::misrouted, 1},
        // Unbound queues are the stack's: nothing counted, nothing dropped.
        {"its flow on queue 0", 0, mine, Want::untouched},
        {"its flow on an unbound queue", 2, mine, Want::untouched},
        {"foreign flow on an unbound queue", 1, v4("192.0.2.1", 1, "10.1.2.3", 80, tcp),
         Want::untouched},
        {"fragment on an unbound queue", 1, with(mine, [](auto &p) { p.ipv4_frag = 0x2000; }),
         Want::untouched},
        {"ARP on queue 0", 0, with(mine, [](auto &p) { p.ethertype = 0x0806; }), Want::untouched},
        {"an inactive binding's queue is not bound", 6, v4("192.0.2.1", 1, "10.1.2.3", 80, tcp),
         Want::untouched},
        {"queue unknown to the driver", 0xffffffffu, v4("192.0.2.1", 1, "10.1.2.3", 80, tcp),
         Want::untouched},
        {"queue past the index", 5000, v4("192.0.2.1", 1, "10.1.2.3", 80, tcp), Want::untouched},
    };
    for (auto &c : cases)
        check(c);
}

TEST_F(DevmemGuardTest, AQueueIsBoundOnlyWhileItsBindingIsActive) {
    const PacketSpec foreign = v4("192.0.2.1", 1, "10.1.2.3", 80, tcp);
    check({"bound", 3, foreign, Want::misrouted, 1});
    ASSERT_TRUE(filter_->set_slot(1, SlotState::inactive, 3).ok());
    check({"binding inactive: queue released", 3, foreign, Want::untouched});
    ASSERT_TRUE(filter_->set_slot(1, SlotState::active, 3).ok());
    check({"active again", 3, foreign, Want::misrouted, 1});
    ASSERT_TRUE(filter_->remove(1).ok());
    check({"removed", 3, foreign, Want::untouched});
    // Another binding takes the queue over.
    install(5, SlotState::active, 3, {"tcp 10.0.0.0/16:* -> 10.1.2.3:5000"});
    check({"new owner", 3, foreign, Want::misrouted, 5});
    check({"new owner's flow", 3, v4("10.0.1.1", 999, "10.1.2.3", 5000, tcp), Want::counted, 5});
}

// A NIC's ntuple rule matches a TCP flow by its addresses and ports only, so any packet that
// carries a binding's 4-tuple lands on its queue, whatever else is in it. A sender who knows (or
// spoofs) the tuple, with no sequence number and no connection, can make one with a bad TCP
// data offset: the guard must drop it (the stack would too), but it is the binding's own flow,
// not steering drift, and must not end the binding (one packet from off path would revoke any
// devmem binding).
TEST_F(DevmemGuardTest, AMalformedPacketOfItsOwnFlowIsDroppedWithoutDrift) {
    auto packet = build_packet(v4("10.0.0.5", 1234, "10.1.2.3", 6000, tcp));
    packet[14 + 20 + 12] = 0x40; // TCP data offset 4 (below the minimum 5)
    std::uint64_t misrouted = filter_->counters(4).misrouted;
    EXPECT_EQ(run(7, packet), TC_ACT_SHOT) << "a malformed packet reached the holder's socket";
    EXPECT_EQ(filter_->counters(4).misrouted, misrouted)
        << "the binding's own (malformed) packet counted as foreign: the daemon would end it as "
           "steering-drift";
    // The same over IPv6 (a NIC's TCP_V6_FLOW rule matches by the tuple alone too).
    auto packet6 = build_packet(v6("fd00::5", 999, "fd00::1", 443));
    packet6[14 + 40 + 12] = 0x40;
    misrouted = filter_->counters(2).misrouted;
    EXPECT_EQ(run(5, packet6), TC_ACT_SHOT);
    EXPECT_EQ(filter_->counters(2).misrouted, misrouted) << "IPv6: counted as foreign";
}

// A devmem NIC's packets reach tc ingress after GRO (header split keeps TCP GRO on): one skb
// there may carry several of the flow's packets. RxPackets counts the packets the NIC received
// (the segments GRO merged), not the skbs.
TEST_F(DevmemGuardTest, AGroAggregateCountsAsItsSegments) {
    auto packet = build_packet(v4("10.0.0.5", 1234, "10.1.2.3", 6000, tcp));
    __sk_buff ctx{};
    ctx.cb[0] = 7;
    ctx.gso_segs = 3;
    ctx.gso_size = 1000;
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = packet.data(),
                .data_size_in = static_cast<__u32>(packet.size()), .ctx_in = &ctx,
                .ctx_size_in = sizeof ctx, .repeat = 1);
    SlotCounters before = filter_->counters(4);
    ASSERT_EQ(bpf_prog_test_run_opts(filter_->guard_test_program_fd(), &opts), 0);
    EXPECT_EQ(static_cast<int>(opts.retval), TC_ACT_OK);
    EXPECT_EQ(filter_->counters(4).packets - before.packets, 3u)
        << "a GRO aggregate of 3 segments counted as one packet";
}
