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

// Overlap is what refuses a request whose flows another binding holds (FlowConflict): it must be
// true exactly when some packet matches both specs.
TEST(FlowSpec, OverlapEdges) {
    // Prefix containment, either way round, and disjoint siblings.
    EXPECT_TRUE(spec("udp 10.0.0.0/16:* -> *").overlaps(spec("udp 10.0.3.4:* -> *")));
    EXPECT_TRUE(spec("udp 10.0.3.4:* -> *").overlaps(spec("udp 10.0.0.0/16:* -> *")));
    EXPECT_FALSE(spec("udp 10.0.0.0/25:* -> *").overlaps(spec("udp 10.0.0.128/25:* -> *")));
    EXPECT_TRUE(spec("udp 0.0.0.0/0:* -> *").overlaps(spec("udp 192.168.1.1:* -> *")));
    // The issue's example: a host inside root's /24, same destination.
    EXPECT_TRUE(spec("udp 10.99.0.0/24:* -> 10.99.0.2:5000")
                    .overlaps(spec("udp 10.99.0.1:* -> 10.99.0.2:5000")));
    EXPECT_FALSE(spec("udp 10.99.0.0/24:* -> 10.99.0.2:5000")
                     .overlaps(spec("udp 10.99.0.1:* -> 10.99.0.2:5001")));
    EXPECT_FALSE(spec("udp 10.99.0.0/24:* -> 10.99.0.2:5000")
                     .overlaps(spec("udp 10.99.0.1:* -> 10.99.0.3:5000")));
    // Port range edges: sharing one port is enough, adjacent ranges are apart.
    EXPECT_TRUE(spec("udp * -> *:5000-5100").overlaps(spec("udp * -> *:5100")));
    EXPECT_TRUE(spec("udp * -> *:5000-5100").overlaps(spec("udp * -> *:4000-5000")));
    EXPECT_FALSE(spec("udp * -> *:5000-5100").overlaps(spec("udp * -> *:5101-6000")));
    EXPECT_FALSE(spec("udp * -> *:5000-5100").overlaps(spec("udp * -> *:0-4999")));
    EXPECT_TRUE(spec("udp * -> *:0").overlaps(spec("udp * -> *")));
    EXPECT_TRUE(spec("udp * -> *:65535").overlaps(spec("udp * -> *:65535")));
    EXPECT_FALSE(spec("udp 1.2.3.4:7 -> *").overlaps(spec("udp 1.2.3.4:8 -> *")));
    // The wildcard protocol overlaps both; tcp and udp never do.
    EXPECT_TRUE(spec("any * -> *:80").overlaps(spec("udp * -> *:80")));
    EXPECT_TRUE(spec("tcp * -> *:80").overlaps(spec("any * -> *:80")));
    EXPECT_FALSE(spec("tcp * -> *:80").overlaps(spec("udp * -> *:80")));
    // IPv4 and IPv6 never overlap, whichever endpoint names the family; `*` meets both.
    EXPECT_FALSE(spec("udp * -> 10.0.0.1:5000").overlaps(spec("udp [fd00::1]:* -> *:5000")));
    EXPECT_FALSE(spec("udp 0.0.0.0/0:* -> *").overlaps(spec("udp [::/0]:* -> *")));
    EXPECT_TRUE(spec("udp * -> *").overlaps(spec("udp [fd00::1]:* -> [fd00::2]:1")));
    EXPECT_TRUE(spec("udp [fd00::/16]:* -> *").overlaps(spec("udp [fd00:1::]:* -> *")));
    EXPECT_FALSE(spec("udp [fd00::/16]:* -> *").overlaps(spec("udp [fd01::]:* -> *")));
}

// Every spec over a small universe of prefixes, port ranges and protocols, against every packet
// of a universe that reaches each edge: overlaps() must agree with "a packet matches both".
TEST(FlowSpec, OverlapAgreesWithPacketsExhaustively) {
    const std::vector<std::string> protos = {"any", "tcp", "udp"};
    const std::vector<std::string> v4 = {"10.0.0.0/29", "10.0.0.0/30", "10.0.0.4/30",
                                         "10.0.0.2/31", "10.0.0.3",    "0.0.0.0/0"};
    const std::vector<std::string> v6 = {"[fd00::/125]", "[fd00::4/126]", "[fd00::3]", "[::/0]"};
    const std::vector<std::string> ports = {"*", "0", "1-3", "3", "3-65535", "4-5"};
    std::vector<FlowSpec> specs;
    auto endpoints = [&](const std::vector<std::string> &prefixes) {
        std::vector<std::string> out = {"*"};
        for (auto &r : ports)
            if (r != "*") out.push_back("*:" + r);
        for (auto &p : prefixes)
            for (auto &r : ports)
                out.push_back(p + ":" + r);
        return out;
    };
    for (auto *family : {&v4, &v6}) {
        auto eps = endpoints(*family);
        for (auto &proto : protos)
            for (std::size_t s = 0; s < eps.size(); s += 3) // a spread, not all 1,200 each
                for (std::size_t d = s % 2; d < eps.size(); d += 4) {
                    auto r = parse_flow_spec(proto + " " + eps[s] + " -> " + eps[d]);
                    ASSERT_TRUE(r.ok()) << r.error().message;
                    specs.push_back(*r);
                }
    }
    // Packets: three protocols (1 is ICMP), both families, addresses in and just outside the
    // prefixes, ports at every range edge.
    std::vector<FiveTuple> packets;
    std::vector<std::uint16_t> port_values = {0, 1, 2, 3, 4, 5, 6, 65535};
    for (auto proto : {Protocol::tcp, Protocol::udp, static_cast<Protocol>(1)})
        for (auto family : {Family::ipv4, Family::ipv6})
            for (int a = 0; a < 9; ++a)
                for (int b = 0; b < 9; ++b)
                    for (auto sp : port_values)
                        for (auto dp : port_values) {
                            FiveTuple t;
                            t.protocol = proto;
                            t.family = family;
                            auto put = [&](std::array<std::uint8_t, 16> &addr, int i) {
                                if (family == Family::ipv4) {
                                    addr[0] = 10;
                                    addr[2] = i == 8 ? 1 : 0;
                                    addr[3] = static_cast<std::uint8_t>(i == 8 ? 0 : i);
                                } else {
                                    addr[0] = 0xfd;
                                    addr[1] = i == 8 ? 1 : 0;
                                    addr[15] = static_cast<std::uint8_t>(i == 8 ? 0 : i);
                                }
                            };
                            put(t.src, a);
                            put(t.dst, b);
                            t.src_port = sp;
                            t.dst_port = dp;
                            packets.push_back(t);
                        }
    // Which packets each spec matches, as bit sets, so all pairs are cheap to compare.
    std::size_t words = (packets.size() + 63) / 64;
    std::vector<std::vector<std::uint64_t>> matched(specs.size(),
                                                    std::vector<std::uint64_t>(words));
    for (std::size_t i = 0; i < specs.size(); ++i)
        for (std::size_t p = 0; p < packets.size(); ++p)
            if (specs[i].matches(packets[p])) matched[i][p / 64] |= std::uint64_t{1} << (p % 64);
    std::size_t both = 0, apart = 0;
    for (std::size_t i = 0; i < specs.size(); ++i)
        for (std::size_t j = i; j < specs.size(); ++j) {
            bool shared = false;
            for (std::size_t w = 0; w < words && !shared; ++w)
                shared = (matched[i][w] & matched[j][w]) != 0;
            ASSERT_EQ(specs[i].overlaps(specs[j]), shared)
                << specs[i].to_string() << " vs " << specs[j].to_string();
            ASSERT_EQ(specs[j].overlaps(specs[i]), shared) << "symmetric";
            (shared ? both : apart) += 1;
        }
    EXPECT_GT(both, 1000u);
    EXPECT_GT(apart, 1000u);
}
