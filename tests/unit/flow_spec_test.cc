#include "policy/flow_spec.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

using namespace knod::policy;

namespace {

FlowSpec spec(const char *text) {
    auto r = parse_flow_spec(text);
    EXPECT_TRUE(r.ok()) << text << ": " << (r ? "" : r.error().message);
    return r ? *r : FlowSpec{};
}

FiveTuple udp4(const char *src, std::uint16_t sport, const char *dst, std::uint16_t dport) {
    FiveTuple t;
    t.protocol = Protocol::udp;
    t.family = Family::ipv4;
    inet_pton(AF_INET, src, t.src.data());
    inet_pton(AF_INET, dst, t.dst.data());
    t.src_port = sport;
    t.dst_port = dport;
    return t;
}

} // namespace

TEST(FlowSpec, ParsesTheIssueExample) {
    FlowSpec f = spec("udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100");
    EXPECT_EQ(f.protocol, Protocol::udp);
    EXPECT_EQ(f.src.prefix.family, Family::ipv4);
    EXPECT_EQ(f.src.prefix.length, 16);
    EXPECT_TRUE(f.src.ports.any());
    EXPECT_EQ(f.dst.prefix.length, 32);
    EXPECT_EQ(f.dst.ports.lo, 5000);
    EXPECT_EQ(f.dst.ports.hi, 5100);
    EXPECT_EQ(f.to_string(), "udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100");
}

TEST(FlowSpec, CanonicalTextRoundTrips) {
    for (const char *text : {"udp * -> *", "tcp [fd00::/8]:* -> [fd00::1]:443", "any *:53 -> *",
                             "udp 0.0.0.0/0:1-2 -> 10.0.0.0/8:*", "udp [::/0]:* -> *:9"}) {
        FlowSpec f = spec(text);
        EXPECT_EQ(spec(f.to_string().c_str()), f) << text;
    }
}

TEST(FlowSpec, RejectsWithOffsets) {
    struct Case {
        const char *text;
        std::size_t offset;
        const char *message;
    } cases[] = {
        {"icmp * -> *", 0, "unknown protocol"},
        {"udp 10.0.0.0/33 -> *", 13, "prefix length"},
        {"udp 10.0.0.1/8 -> *", 4, "host bits"},
        {"udp * -> *:5100-5000", 11, "inverted"},
        {"udp * -> *:65536", 11, "expected a port"},
        {"udp * => *", 6, "'->'"},
        {"udp * -> * trailing", 11, "unexpected text"},
        {"udp [fd00::1 -> *", 4, "missing ']'"},
        {"udp 10.0.0.0/8 -> [fd00::1]", 0, "different address families"},
        {"udp 1.2.3 -> *", 4, "not an IPv4"},
        {"", 0, "unknown protocol"},
    };
    for (auto &c : cases) {
        auto r = parse_flow_spec_at(c.text);
        ASSERT_FALSE(r.ok) << c.text;
        EXPECT_EQ(r.error.offset, c.offset) << c.text << ": " << r.error.message;
        EXPECT_NE(r.error.message.find(c.message), std::string::npos) << r.error.message;
    }
}

TEST(FlowSpec, ContainmentFollowsPrefixesPortsAndProtocol) {
    FlowSpec grant = spec("udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100");
    EXPECT_TRUE(grant.contains(spec("udp 10.0.4.0/24:* -> 10.1.2.3:5000")));
    EXPECT_TRUE(grant.contains(grant));
    EXPECT_FALSE(grant.contains(spec("udp 10.0.0.0/8:* -> 10.1.2.3:5000")));
    EXPECT_FALSE(grant.contains(spec("udp 10.0.0.0/16:* -> 10.1.2.3:4999-5000")));
    EXPECT_FALSE(grant.contains(spec("tcp 10.0.0.0/16:* -> 10.1.2.3:5000")));
    EXPECT_FALSE(grant.contains(spec("any 10.0.0.0/16:* -> 10.1.2.3:5000")));
    EXPECT_FALSE(grant.contains(spec("udp * -> 10.1.2.3:5000")));
    EXPECT_TRUE(spec("any * -> *").contains(spec("udp [fd00::1]:1 -> *")));
}

TEST(FlowSpec, PrefixEdges) {
    FlowSpec all4 = spec("udp 0.0.0.0/0:* -> *");
    EXPECT_TRUE(all4.matches(udp4("255.255.255.255", 1, "1.1.1.1", 2)));
    FlowSpec host = spec("udp 10.0.0.1/32:* -> *");
    EXPECT_TRUE(host.matches(udp4("10.0.0.1", 1, "1.1.1.1", 2)));
    EXPECT_FALSE(host.matches(udp4("10.0.0.2", 1, "1.1.1.1", 2)));
    FlowSpec odd = spec("udp 10.0.0.128/25:* -> *");
    EXPECT_TRUE(odd.matches(udp4("10.0.0.255", 1, "1.1.1.1", 2)));
    EXPECT_FALSE(odd.matches(udp4("10.0.0.127", 1, "1.1.1.1", 2)));
}

TEST(FlowSpec, MatchesPortRangeEdges) {
    FlowSpec f = spec("udp * -> 10.1.2.3:5000-5100");
    EXPECT_FALSE(f.matches(udp4("1.1.1.1", 9, "10.1.2.3", 4999)));
    EXPECT_TRUE(f.matches(udp4("1.1.1.1", 9, "10.1.2.3", 5000)));
    EXPECT_TRUE(f.matches(udp4("1.1.1.1", 9, "10.1.2.3", 5100)));
    EXPECT_FALSE(f.matches(udp4("1.1.1.1", 9, "10.1.2.3", 5101)));
    FiveTuple tcp = udp4("1.1.1.1", 9, "10.1.2.3", 5000);
    tcp.protocol = Protocol::tcp;
    EXPECT_FALSE(f.matches(tcp));
}

TEST(FlowSpec, Overlap) {
    EXPECT_TRUE(spec("udp 10.0.0.0/16:* -> *:5000-5100")
                    .overlaps(spec("udp 10.0.5.0/24:* -> *:5100-6000")));
    EXPECT_FALSE(spec("udp 10.0.0.0/16:* -> *:5000-5100")
                     .overlaps(spec("udp 10.0.5.0/24:* -> *:5101-6000")));
    EXPECT_FALSE(spec("udp 10.0.0.0/16:* -> *").overlaps(spec("udp 10.1.0.0/16:* -> *")));
    EXPECT_FALSE(spec("udp * -> *").overlaps(spec("tcp * -> *")));
    EXPECT_TRUE(spec("any * -> *").overlaps(spec("tcp * -> *")));
    EXPECT_FALSE(spec("udp [fd00::/8]:* -> *").overlaps(spec("udp 10.0.0.0/8:* -> *")));
}
