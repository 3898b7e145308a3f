#include "daemon/flow_claims.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

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

// The port index must find exactly what a plain scan of every held flow finds, through claims
// and releases of narrow and wide flows on two devices.
TEST(FlowClaims, TheIndexAgreesWithAPlainScan) {
    std::mt19937 rng(14);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    auto random_flow = [&] {
        const char *protos[] = {"udp", "tcp", "any"};
        const char *srcs[] = {"*", "10.0.0.0/30:*", "10.0.0.1:*", "10.0.0.2:7", "[fd00::1]:*"};
        std::string dst_addr = pick(4) == 0 ? "*" : "10.0.0.9";
        if (pick(6) == 0) dst_addr = "[fd00::9]";
        int lo = 5000 + pick(40);
        std::string ports;
        switch (pick(4)) {
        case 0:
            ports = std::to_string(lo);
            break;
        case 1:
            ports = std::to_string(lo) + "-" + std::to_string(lo + pick(20));
            break;
        case 2:
            ports = std::to_string(lo) + "-" + std::to_string(lo + 15);
            break;
        default:
            ports = "*";
        }
        std::string src = srcs[pick(5)];
        bool v6 = src.find('[') != std::string::npos || dst_addr.find('[') != std::string::npos;
        if (v6 && src.find('.') != std::string::npos) src = "*";
        if (v6 && dst_addr.find('.') != std::string::npos) dst_addr = "*";
        auto f = policy::parse_flow_spec(std::string(protos[pick(3)]) + " " + src + " -> " +
                                         dst_addr + ":" + ports);
        EXPECT_TRUE(f.ok()) << f.error().message;
        return f ? *f : policy::FlowSpec{};
    };
    struct Model {
        std::string netdev;
        std::vector<policy::FlowSpec> flows;
    };
    std::map<std::string, Model> model;
    FlowClaims claims;
    int conflicts = 0, granted = 0;
    for (int step = 0; step < 3000; ++step) {
        std::string netdev = pick(2) ? "eth0" : "eth1";
        std::vector<policy::FlowSpec> asked;
        for (int n = 1 + pick(3); n > 0; --n)
            asked.push_back(random_flow());
        auto found = claims.conflict(netdev, asked);
        bool any = false;
        for (auto &[id, m] : model)
            for (auto &held : m.flows)
                for (auto &a : asked)
                    any = any || (m.netdev == netdev && held.overlaps(a));
        ASSERT_EQ(found.has_value(), any) << "step " << step;
        conflicts += any;
        if (found) {
            ASSERT_TRUE(model.count(found->binding));
            EXPECT_TRUE(found->held.overlaps(asked[found->requested]));
        }
        if (!any && pick(3) != 0) {
            std::string id = "b" + std::to_string(step);
            claims.claim(netdev, id, 1000, asked);
            model[id] = {netdev, asked};
            ++granted;
        }
        if (!model.empty() && pick(4) == 0) {
            auto victim = std::next(model.begin(), pick(static_cast<int>(model.size())));
            claims.release(victim->first);
            model.erase(victim);
        }
        ASSERT_EQ(claims.size(), model.size());
    }
    EXPECT_GT(conflicts, 300);
    EXPECT_GT(granted, 300);
}
