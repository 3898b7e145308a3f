// The flow filter in the kernel, driven with BPF_PROG_TEST_RUN: crafted packets in, verdict and
// counters out. Needs root (CAP_BPF); skipped otherwise.
#include "bpf/flow_filter.h"
#include "bpf/packet_builder.h"

#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace knod;
using namespace knod::bpf;
using knod::bpf::packets::build_packet;
using knod::bpf::packets::PacketSpec;
using knod::bpf::packets::v4;
using knod::bpf::packets::v6;
using knod::bpf::packets::with;

namespace {

policy::FlowSpec spec(const char *text) {
    return *policy::parse_flow_spec(text);
}

int run(const FlowFilter &f, const std::vector<std::uint8_t> &packet) {
    std::vector<std::uint8_t> out(packet.size() + 256);
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = packet.data(), .data_out = out.data(),
                .data_size_in = static_cast<__u32>(packet.size()),
                .data_size_out = static_cast<__u32>(out.size()), .repeat = 1);
    int r = bpf_prog_test_run_opts(f.program_fd(), &opts);
    EXPECT_EQ(r, 0) << "BPF_PROG_TEST_RUN failed";
    return static_cast<int>(opts.retval);
}

enum class Want { offload, binding_drop, pass, drop };
enum class Why { none, malformed, fragment };

struct Case {
    const char *name;
    PacketSpec packet;
    Want want;
    std::uint32_t slot = 0; // for offload / binding_drop
    Why why = Why::none;
};

class FlowFilterTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "BPF tests need root";
        auto f = FlowFilter::load();
        ASSERT_TRUE(f.ok()) << f.error().message;
        filter_ = std::move(*f);
        install(1, SlotState::active, {"udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100"});
        install(2, SlotState::active, {"tcp [fd00::/8]:* -> [fd00::1]:443"});
        install(3, SlotState::inactive, {"udp 10.9.9.9:7 -> 10.1.2.3:7000"});
        install(4, SlotState::active, {"udp 10.0.0.5:1234 -> 10.1.2.3:6000"});
        install(5, SlotState::active, {"udp 10.0.5.0/24:* -> 10.1.2.3:5000-5100"});
        install(6, SlotState::active, {"udp * -> 10.1.2.0/24:8000"});
        install(7, SlotState::active, {"any * -> [fd00::2]:9000"});
        install(8, SlotState::active, {"udp 192.168.0.1:* -> 0.0.0.0/0:53"});
    }
    void install(std::uint32_t slot, SlotState state, std::vector<const char *> flows) {
        std::vector<policy::FlowSpec> specs;
        for (auto *f : flows)
            specs.push_back(spec(f));
        ASSERT_TRUE(filter_->set_slot(slot, state, 0).ok());
        auto r = filter_->set_flows(slot, specs);
        ASSERT_TRUE(r.ok()) << r.error().message;
    }
    void check(const Case &c) {
        SCOPED_TRACE(c.name);
        std::vector<SlotCounters> before;
        for (std::uint32_t s = 0; s < 10; ++s)
            before.push_back(filter_->counters(s));
        FilterStats st = filter_->stats();
        int verdict = run(*filter_, build_packet(c.packet));
        FilterStats after = filter_->stats();
        for (std::uint32_t s = 0; s < 10; ++s) {
            SlotCounters now = filter_->counters(s);
            bool mine = s == c.slot;
            EXPECT_EQ(now.packets - before[s].packets, mine && c.want == Want::offload ? 1u : 0u)
                << "slot " << s;
            EXPECT_EQ(now.drops - before[s].drops, mine && c.want == Want::binding_drop ? 1u : 0u)
                << "slot " << s;
        }
        switch (c.want) {
        case Want::offload:
            // No AF_XDP socket in a test run: the redirect falls back to a drop, never the stack.
            EXPECT_EQ(verdict, XDP_DROP);
            break;
        case Want::binding_drop:
            EXPECT_EQ(verdict, XDP_DROP);
            break;
        case Want::pass:
            EXPECT_EQ(verdict, XDP_PASS);
            break;
        case Want::drop:
            EXPECT_EQ(verdict, XDP_DROP);
            break;
        }
        EXPECT_EQ(after.malformed - st.malformed, c.why == Why::malformed ? 1u : 0u);
        EXPECT_EQ(after.fragments - st.fragments, c.why == Why::fragment ? 1u : 0u);
    }

    std::unique_ptr<FlowFilter> filter_;
};

} // namespace

TEST_F(FlowFilterTest, CraftedPackets) {
    const PacketSpec base = v4("10.0.1.1", 999, "10.1.2.3", 5000);
    const Case cases[] = {
        {"v4 udp inside prefix and range", base, Want::offload, 1},
        {"upper port edge 5100", v4("10.0.1.1", 999, "10.1.2.3", 5100), Want::offload, 1},
        {"lower port edge 5000 from .0.0", v4("10.0.0.0", 1, "10.1.2.3", 5000), Want::offload, 1},
        {"port 5101 just outside", v4("10.0.1.1", 999, "10.1.2.3", 5101), Want::pass},
        {"port 4999 just outside", v4("10.0.1.1", 999, "10.1.2.3", 4999), Want::pass},
        {"source outside /16", v4("10.1.0.1", 999, "10.1.2.3", 5000), Want::pass},
        {"source at the /16 top edge", v4("10.0.255.255", 999, "10.1.2.3", 5000), Want::offload, 1},
        {"overlap: more specific /24 wins", v4("10.0.5.7", 999, "10.1.2.3", 5000), Want::offload,
         5},
        {"overlap: just below the /24", v4("10.0.4.255", 999, "10.1.2.3", 5000), Want::offload, 1},
        {"overlap: just above the /24", v4("10.0.6.0", 999, "10.1.2.3", 5000), Want::offload, 1},
        {"tcp where udp is granted", v4("10.0.1.1", 999, "10.1.2.3", 5000, 6), Want::pass},
        {"exact 5-tuple", v4("10.0.0.5", 1234, "10.1.2.3", 6000), Want::offload, 4},
        {"exact with another source port", v4("10.0.0.5", 1235, "10.1.2.3", 6000), Want::pass},
        {"exact with another source host", v4("10.0.0.6", 1234, "10.1.2.3", 6000), Want::pass},
        {"inactive binding is dropped", v4("10.9.9.9", 7, "10.1.2.3", 7000), Want::binding_drop, 3},
        {"802.1Q tagged", with(base, [](auto &p) { p.vlans = {0x8100}; }), Want::offload, 1},
        {"802.1ad tagged", with(base, [](auto &p) { p.vlans = {0x88a8}; }), Want::offload, 1},
        {"IPv4 options (ihl 6)", with(base, [](auto &p) { p.ipv4_ihl = 6; }), Want::offload, 1},
        {"IPv4 first fragment (MF)", with(base, [](auto &p) { p.ipv4_frag = 0x2000; }), Want::pass,
         0, Why::fragment},
        {"IPv4 non-first fragment", with(base, [](auto &p) { p.ipv4_frag = 0x0010; }), Want::pass,
         0, Why::fragment},
        {"IPv4 DF is not a fragment", with(base, [](auto &p) { p.ipv4_frag = 0x4000; }),
         Want::offload, 1},
        // The kernel hands XDP no frame shorter than an Ethernet header (test runs refuse one).
        {"Ethernet header only", with(base, [](auto &p) { p.truncate = 14; }), Want::pass, 0,
         Why::malformed},
        {"truncated VLAN tag",
         with(base,
              [](auto &p) {
                  p.vlans = {0x8100};
                  p.truncate = 16;
              }),
         Want::pass, 0, Why::malformed},
        {"truncated IPv4 header", with(base, [](auto &p) { p.truncate = 14 + 12; }), Want::pass, 0,
         Why::malformed},
        {"IPv4 ihl below 5", with(base, [](auto &p) { p.ipv4_ihl = 4; }), Want::pass, 0,
         Why::malformed},
        {"truncated UDP header", with(base, [](auto &p) { p.truncate = 14 + 20 + 6; }), Want::pass,
         0, Why::malformed},
        {"truncated TCP header",
         with(v4("10.0.1.1", 1, "10.1.2.3", 5000, 6), [](auto &p) { p.truncate = 14 + 20 + 12; }),
         Want::pass, 0, Why::malformed},
        {"v6 tcp inside fd00::/8", v6("fd00::99", 5555, "fd00::1", 443), Want::offload, 2},
        {"v6 /8 edge: fdff::", v6("fdff:ffff::1", 5555, "fd00::1", 443), Want::offload, 2},
        {"v6 source outside /8", v6("fe80::1", 5555, "fd00::1", 443), Want::pass},
        {"v6 wrong port", v6("fd00::99", 5555, "fd00::1", 444), Want::pass},
        {"v6 udp where tcp is granted", v6("fd00::99", 5555, "fd00::1", 443, 17), Want::pass},
        {"v6 hop-by-hop then tcp",
         with(v6("fd00::99", 5555, "fd00::1", 443), [](auto &p) { p.ipv6_ext = {0}; }),
         Want::offload, 2},
        {"v6 routing + dest-opts then tcp",
         with(v6("fd00::99", 5555, "fd00::1", 443),
              [](auto &p) {
                  p.ipv6_ext = {43, 60};
              }),
         Want::offload, 2},
        {"v6 fragment header",
         with(v6("fd00::99", 5555, "fd00::1", 443), [](auto &p) { p.ipv6_ext = {44}; }), Want::pass,
         0, Why::fragment},
        {"v6 truncated header",
         with(v6("fd00::99", 5555, "fd00::1", 443), [](auto &p) { p.truncate = 14 + 30; }),
         Want::pass, 0, Why::malformed},
        {"v6 truncated extension header",
         with(v6("fd00::99", 5555, "fd00::1", 443),
              [](auto &p) {
                  p.ipv6_ext = {0};
                  p.truncate = 14 + 40 + 1;
              }),
         Want::pass, 0, Why::malformed},
        {"v6 /128 host, any protocol: udp", v6("2001:db8::1", 1, "fd00::2", 9000, 17),
         Want::offload, 7},
        {"v6 /128 host, any protocol: tcp", v6("2001:db8::1", 1, "fd00::2", 9000, 6), Want::offload,
         7},
        {"v6 neighbour of the /128", v6("2001:db8::1", 1, "fd00::3", 9000, 17), Want::pass},
        {"v4 destination /24", v4("1.2.3.4", 1, "10.1.2.77", 8000), Want::offload, 6},
        {"v4 destination outside the /24", v4("1.2.3.4", 1, "10.1.3.77", 8000), Want::pass},
        {"v4 destination /0 from the /32 source", v4("192.168.0.1", 3333, "8.8.8.8", 53),
         Want::offload, 8},
        {"v4 destination /0 from the neighbour", v4("192.168.0.2", 3333, "8.8.8.8", 53),
         Want::pass},
        {"ARP is the stack's", with(base, [](auto &p) { p.ethertype = 0x0806; }), Want::pass},
        {"ICMP is the stack's", v4("10.0.1.1", 0, "10.1.2.3", 5000, 1), Want::pass},
    };
    for (auto &c : cases)
        check(c);
}

TEST_F(FlowFilterTest, DropUnmatchedSetting) {
    ASSERT_TRUE(filter_->set_unmatched_drop(true).ok());
    check({"unmatched dropped by setting", v4("1.1.1.1", 1, "2.2.2.2", 3), Want::drop});
    check({"matched still offloaded", v4("10.0.1.1", 999, "10.1.2.3", 5000), Want::offload, 1});
    ASSERT_TRUE(filter_->set_unmatched_drop(false).ok());
    check({"unmatched passed again", v4("1.1.1.1", 1, "2.2.2.2", 3), Want::pass});
}

TEST_F(FlowFilterTest, RuleChangesAndRemoval) {
    // Replacing slot 1's flows moves the port window at once.
    ASSERT_TRUE(filter_->set_flows(1, {spec("udp 10.0.0.0/16:* -> 10.1.2.3:5200")}).ok());
    check({"old window gone", v4("10.0.1.1", 999, "10.1.2.3", 5000), Want::pass});
    check({"new window live", v4("10.0.1.1", 999, "10.1.2.3", 5200), Want::offload, 1});
    // Freeing slot 4 removes its exact rule.
    ASSERT_TRUE(filter_->remove(4).ok());
    check({"removed exact rule", v4("10.0.0.5", 1234, "10.1.2.3", 6000), Want::pass});
    EXPECT_EQ(filter_->counters(4).packets, 0u);
    // Activating the inactive binding starts delivery.
    ASSERT_TRUE(filter_->set_slot(3, SlotState::active, 0).ok());
    check({"activated", v4("10.9.9.9", 7, "10.1.2.3", 7000), Want::offload, 3});
    // A binding on another queue than the packet's is dropped, never passed.
    ASSERT_TRUE(filter_->set_slot(3, SlotState::active, 5).ok());
    check({"wrong queue", v4("10.9.9.9", 7, "10.1.2.3", 7000), Want::binding_drop, 3});
}

TEST_F(FlowFilterTest, ExactRulesKeepProtocolAndOwnerThroughGenerations) {
    const char *prefix5 = "udp 10.0.5.0/24:* -> 10.1.2.3:5000-5100";
    install(5, SlotState::active, {prefix5, "udp 10.3.3.3:53 -> 10.4.4.4:53"});
    install(9, SlotState::active, {"tcp 10.3.3.3:53 -> 10.4.4.4:53"});
    check({"udp tuple", v4("10.3.3.3", 53, "10.4.4.4", 53, 17), Want::offload, 5});
    check({"tcp on the same tuple", v4("10.3.3.3", 53, "10.4.4.4", 53, 6), Want::offload, 9});
    check({"ports swapped", v4("10.3.3.3", 53, "10.4.4.4", 54, 17), Want::pass});
    check({"addresses swapped", v4("10.4.4.4", 53, "10.3.3.3", 53, 17), Want::pass});
    // One binding cannot take a flow another holds.
    auto taken = filter_->set_flows(9, {spec("udp 10.3.3.3:53 -> 10.4.4.4:53")});
    ASSERT_FALSE(taken.ok());
    check({"refusal changes nothing", v4("10.3.3.3", 53, "10.4.4.4", 53, 17), Want::offload, 5});
    // Handed over: released by 5, then granted to 9. Each publish flips the generation, so the
    // checks below read both generations' tables.
    install(5, SlotState::active, {prefix5});
    check({"released", v4("10.3.3.3", 53, "10.4.4.4", 53, 17), Want::pass});
    install(9, SlotState::active,
            {"tcp 10.3.3.3:53 -> 10.4.4.4:53", "udp 10.3.3.3:53 -> 10.4.4.4:53"});
    check({"handed over", v4("10.3.3.3", 53, "10.4.4.4", 53, 17), Want::offload, 9});
    check({"tcp kept", v4("10.3.3.3", 53, "10.4.4.4", 53, 6), Want::offload, 9});
    // The same set again, with one flow listed twice by its own binding: not a conflict.
    install(9, SlotState::active,
            {"tcp 10.3.3.3:53 -> 10.4.4.4:53", "udp 10.3.3.3:53 -> 10.4.4.4:53",
             "udp 10.3.3.3:53 -> 10.4.4.4:53"});
    check({"the same set again", v4("10.3.3.3", 53, "10.4.4.4", 53, 17), Want::offload, 9});
}

TEST_F(FlowFilterTest, ManyExactRulesStayCorrect) {
    std::vector<policy::FlowSpec> many;
    for (int i = 0; i < 2000; ++i)
        many.push_back(spec(("udp 10.50." + std::to_string(i / 250) + "." +
                             std::to_string(i % 250) + ":1000 -> 10.60.0.1:2000")
                                .c_str()));
    ASSERT_TRUE(filter_->set_slot(9, SlotState::active, 0).ok());
    auto r = filter_->set_flows(9, many);
    ASSERT_TRUE(r.ok()) << r.error().message;
    check({"first of 2000", v4("10.50.0.0", 1000, "10.60.0.1", 2000), Want::offload, 9});
    check({"last of 2000", v4("10.50.7.249", 1000, "10.60.0.1", 2000), Want::offload, 9});
    check({"not among them", v4("10.50.8.0", 1000, "10.60.0.1", 2000), Want::pass});
    check({"others unaffected", v4("10.0.1.1", 999, "10.1.2.3", 5000), Want::offload, 1});
}

TEST_F(FlowFilterTest, TooManyRulesOnOnePrefixIsAClearError) {
    std::vector<policy::FlowSpec> crowd;
    for (int i = 0; i < 20; ++i)
        crowd.push_back(
            spec(("udp 10.70." + std::to_string(i) + ".0/24:* -> 10.80.0.1:1").c_str()));
    auto r = filter_->set_flows(9, crowd);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("at most 16"), std::string::npos) << r.error().message;
    check({"old rules intact after the refusal", v4("10.0.1.1", 999, "10.1.2.3", 5000),
           Want::offload, 1});
}

// Rule changes under real concurrent traffic: one thread runs a binding's packet through the
// program without pause while this one frees the binding's slot, gives the slot to another
// binding on another queue, and back, hundreds of times. A decision that mixed the old rules
// with the new slot would drop the packet as the other binding's (a binding drop); the epoch
// check must redo such decisions instead, and must be seen doing so. (Without the bump before
// slot writes this failed in most runs on a 2-vCPU VM.)
TEST_F(FlowFilterTest, RuleChangesUnderTrafficAreNeverHalfSeen) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs two CPUs";
    const char *mine = "udp 10.20.0.1:1000 -> 10.20.0.2:2000";
    const char *theirs = "udp 10.30.0.1:1000 -> 10.30.0.2:2000";
    install(5, SlotState::active, {mine});
    auto packet = build_packet(v4("10.20.0.1", 1000, "10.20.0.2", 2000));
    FilterStats before = filter_->stats();

    // Each test run switches the kernel's XDP dispatcher (two RCU grace periods, milliseconds),
    // so runs are long: the program must be running for much of the time rules change.
    std::atomic<bool> stop{false};
    std::atomic<int> failures{0};
    std::atomic<int> runs{0};
    std::thread traffic([&] {
        std::vector<std::uint8_t> out(packet.size() + 256);
        while (!stop) {
            LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = packet.data(), .data_out = out.data(),
                        .data_size_in = static_cast<__u32>(packet.size()),
                        .data_size_out = static_cast<__u32>(out.size()), .repeat = 500000);
            if (bpf_prog_test_run_opts(filter_->program_fd(), &opts) != 0) ++failures;
            ++runs;
        }
    });
    struct Joiner {
        std::atomic<bool> &stop;
        std::thread &thread;
        ~Joiner() { // also when an assertion leaves early
            stop = true;
            if (thread.joinable()) thread.join();
        }
    } joiner{stop, traffic};
    // Until a decision has been seen meeting a change (and a few hundred rounds in any case),
    // bounded by a deadline that is only a guard against a hang, never asserted.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int rounds = 0;
    for (; std::chrono::steady_clock::now() < deadline; ++rounds) {
        if (rounds >= 200 && runs >= 2 && filter_->stats().redecided > before.redecided) break;
        ASSERT_TRUE(filter_->remove(5).ok());
        ASSERT_TRUE(filter_->set_slot(5, SlotState::active, 7).ok()); // theirs, on queue 7
        ASSERT_TRUE(filter_->set_flows(5, {spec(theirs)}).ok());
        ASSERT_TRUE(filter_->remove(5).ok());
        ASSERT_TRUE(filter_->set_slot(5, SlotState::active, 0).ok()); // mine again, queue 0
        ASSERT_TRUE(filter_->set_flows(5, {spec(mine)}).ok());
    }
    stop = true;
    traffic.join();
    FilterStats after = filter_->stats();
    EXPECT_EQ(failures, 0);
    EXPECT_EQ(after.binding_drops, before.binding_drops)
        << "a packet was decided with one binding's rules and another's slot";
    EXPECT_GT(after.redecided, before.redecided)
        << "no decision met a rule change in " << rounds << " rounds";
    check({"mine after the storm", v4("10.20.0.1", 1000, "10.20.0.2", 2000), Want::offload, 5});
}

TEST_F(FlowFilterTest, ExactIPv6RulesOnTheFastAndTheGenericPath) {
    install(9, SlotState::active,
            {"udp [fd00::5]:1234 -> [fd00::1]:6000", "tcp [fd00::5]:1234 -> [fd00::1]:6000"});
    install(10, SlotState::inactive, {"udp [fd00::6]:1 -> [fd00::1]:2"});
    check({"v6 exact udp", v6("fd00::5", 1234, "fd00::1", 6000, 17), Want::offload, 9});
    check({"v6 exact tcp", v6("fd00::5", 1234, "fd00::1", 6000, 6), Want::offload, 9});
    check({"v6 exact, hop-by-hop first (generic path)",
           with(v6("fd00::5", 1234, "fd00::1", 6000, 17), [](auto &p) { p.ipv6_ext = {0}; }),
           Want::offload, 9});
    check({"v6 exact, VLAN tagged (generic path)",
           with(v6("fd00::5", 1234, "fd00::1", 6000, 17), [](auto &p) { p.vlans = {0x8100}; }),
           Want::offload, 9});
    check({"v6 other source port", v6("fd00::5", 1235, "fd00::1", 6000, 17), Want::pass});
    check({"v6 source differs in its first word", v6("fd01::5", 1234, "fd00::1", 6000, 17),
           Want::pass});
    check({"v6 destination differs in its last word", v6("fd00::5", 1234, "fd00::2", 6000, 17),
           Want::pass});
    check({"v6 exact of an inactive binding", v6("fd00::6", 1, "fd00::1", 2, 17),
           Want::binding_drop, 10});
    check({"v6 fragment of the flow",
           with(v6("fd00::5", 1234, "fd00::1", 6000, 17), [](auto &p) { p.ipv6_ext = {44}; }),
           Want::pass, 0, Why::fragment});
    // The prefix rules of slot 2 still decide their packets, around the exact table.
    check({"v6 prefix rule beside", v6("fd00::99", 5555, "fd00::1", 443), Want::offload, 2});
    // Released: the next generation no longer has it, nor the one after.
    install(9, SlotState::active, {"tcp [fd00::5]:1234 -> [fd00::1]:6000"});
    check({"v6 udp released", v6("fd00::5", 1234, "fd00::1", 6000, 17), Want::pass});
    check({"v6 tcp kept", v6("fd00::5", 1234, "fd00::1", 6000, 6), Want::offload, 9});
    install(10, SlotState::inactive, {});
    check({"v6 udp still released", v6("fd00::5", 1234, "fd00::1", 6000, 17), Want::pass});
}
