#include "daemon/flow_claims.h"

#include <gtest/gtest.h>

using namespace knod;
using namespace knod::daemon;

namespace {

std::vector<policy::FlowSpec> flows(std::initializer_list<const char *> texts) {
    std::vector<policy::FlowSpec> out;
    for (auto *t : texts) {
        auto f = policy::parse_flow_spec(t);
        EXPECT_TRUE(f.ok()) << t;
        if (f) out.push_back(*f);
    }
    return out;
}

} // namespace

TEST(FlowClaims, OverlapOnTheSameDeviceIsAConflictNamingTheHolder) {
    FlowClaims claims;
    claims.claim("eth0", "broot", 0, flows({"udp 10.99.0.0/24:* -> 10.99.0.2:5000"}));
    auto c = claims.conflict(
        "eth0", flows({"udp 10.99.0.9:* -> 10.99.0.2:6000", "udp 10.99.0.1:* -> 10.99.0.2:5000"}));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->binding, "broot");
    EXPECT_EQ(c->owner, 0u);
    EXPECT_EQ(c->requested, 1u);
    EXPECT_EQ(c->held.to_string(), "udp 10.99.0.0/24:* -> 10.99.0.2:5000");
    // Identical, wider and narrower flows all conflict; other ports and other devices do not.
    EXPECT_TRUE(claims.conflict("eth0", flows({"udp 10.99.0.0/24:* -> 10.99.0.2:5000"})));
    EXPECT_TRUE(claims.conflict("eth0", flows({"any * -> *"})));
    EXPECT_FALSE(claims.conflict("eth0", flows({"udp 10.99.0.1:* -> 10.99.0.2:5001"})));
    EXPECT_FALSE(claims.conflict("eth1", flows({"udp 10.99.0.1:* -> 10.99.0.2:5000"})));
}

TEST(FlowClaims, ReleaseFreesTheFlowsAndTheDevice) {
    FlowClaims claims;
    claims.claim("eth0", "b1", 1000, flows({"udp * -> *:5000"}));
    claims.claim("eth0", "b2", 1001, flows({"udp * -> *:5001", "udp * -> *:5001"}));
    EXPECT_EQ(claims.size(), 2u);
    claims.release("b1");
    EXPECT_FALSE(claims.conflict("eth0", flows({"udp * -> *:5000"})));
    auto c = claims.conflict("eth0", flows({"udp * -> *:5000-5001"}));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->binding, "b2");
    claims.release("b2");
    claims.release("b2"); // twice is harmless
    EXPECT_EQ(claims.size(), 0u);
    EXPECT_FALSE(claims.conflict("eth0", flows({"any * -> *"})));
}

TEST(FlowClaims, ManyBindingsOnOneDevice) {
    FlowClaims claims;
    for (int i = 0; i < 1000; ++i)
        claims.claim("eth0", "b" + std::to_string(i), 1000,
                     flows({("udp * -> 10.0.0.1:" + std::to_string(5000 + i)).c_str()}));
    EXPECT_FALSE(claims.conflict("eth0", flows({"udp * -> 10.0.0.1:7000"})));
    auto c = claims.conflict("eth0", flows({"udp 10.1.0.0/16:* -> *:5999"}));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->binding, "b999");
}
