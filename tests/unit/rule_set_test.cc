// The incremental rule compiler (RuleSet) against compile_rules from scratch: after every step
// of a random sequence of binding changes, accepted or refused, the compiled state is exactly
// what compile_rules gives for the bindings held, a refusal carries compile_rules's error, and
// what set() reports changed is exactly what differs between the two from-scratch results.
#include "bpf/rule_compiler.h"
#include "random_flows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>

using namespace knod;
using namespace knod::bpf;

namespace {

template <typename T> std::string bytes(const T &v) {
    return std::string(reinterpret_cast<const char *>(&v), sizeof v);
}

// Every entry by its bytes, so two results compare whatever their order.
struct Canonical {
    std::set<std::string> exact4, exact6;
    std::map<std::string, std::string> buckets4, buckets6; // key -> bucket
    bool operator==(const Canonical &) const = default;
};

Canonical canonical(const CompiledRules &c) {
    Canonical out;
    for (auto &e : c.exact4)
        out.exact4.insert(bytes(e));
    for (auto &e : c.exact6)
        out.exact6.insert(bytes(e));
    for (auto &b : c.buckets4)
        out.buckets4[bytes(b.key)] = bytes(b.bucket);
    for (auto &b : c.buckets6)
        out.buckets6[bytes(b.key)] = bytes(b.bucket);
    return out;
}

template <typename Map> std::size_t differing(const Map &a, const Map &b) {
    std::set<std::string> keys;
    for (auto &[k, v] : a)
        if (!b.count(k) || b.at(k) != v) keys.insert(k);
    for (auto &[k, v] : b)
        if (!a.count(k)) keys.insert(k);
    return keys.size();
}

std::size_t differing(const std::set<std::string> &a, const std::set<std::string> &b) {
    std::size_t n = 0;
    for (auto &k : a)
        n += !b.count(k);
    for (auto &k : b)
        n += !a.count(k);
    return n;
}

} // namespace

TEST(RuleCompiler, IncrementalSetMatchesCompilingFromScratch) {
    auto pool = knod::testing::flow_pool();
    std::mt19937 rng(2112);
    RuleSet rules;
    std::map<std::uint32_t, std::vector<policy::FlowSpec>> model;
    Canonical now = canonical(*compile_rules(model));
    int accepted = 0, conflicts = 0, overflows = 0, undone = 0;
    for (int step = 0; step < 3000; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        auto s = knod::testing::random_step(rng, pool, 12);
        auto next = model;
        if (s.flows.empty())
            next.erase(s.slot);
        else
            next[s.slot] = s.flows;
        auto want = compile_rules(next);
        auto got = rules.set(s.slot, s.flows);
        ASSERT_EQ(got.ok(), want.ok()) << (want.ok() ? got.error().message : want.error().message);
        if (!want.ok()) {
            EXPECT_EQ(got.error().message, want.error().message);
            EXPECT_EQ(got.error().code, want.error().code);
            bool conflict = want.error().message.find("claimed by two") != std::string::npos;
            (conflict ? conflicts : overflows) += 1;
        } else if (rng() % 10 == 0) {
            // The loader could not publish it: undo gives back the state before.
            rules.undo();
            ++undone;
        } else {
            Canonical after = canonical(*want);
            // What set() reports is exactly what differs.
            std::size_t exact = 0, buckets4 = 0, buckets6 = 0;
            for (auto &k : got->exact)
                exact += k.size() == 38 ? 1 : 1000;
            for (auto &d : got->buckets)
                (d.family == policy::Family::ipv4 ? buckets4 : buckets6) += 1;
            std::set<std::string> keys(got->exact.begin(), got->exact.end());
            EXPECT_EQ(keys.size(), got->exact.size()) << "a key reported twice";
            EXPECT_EQ(exact,
                      differing(now.exact4, after.exact4) + differing(now.exact6, after.exact6));
            EXPECT_EQ(buckets4, differing(now.buckets4, after.buckets4));
            EXPECT_EQ(buckets6, differing(now.buckets6, after.buckets6));
            model = std::move(next);
            now = after;
            ++accepted;
        }
        ASSERT_TRUE(canonical(rules.compiled()) == now) << "compiled state differs";
        EXPECT_EQ(rules.bucket_count(policy::Family::ipv4), now.buckets4.size());
        EXPECT_EQ(rules.bucket_count(policy::Family::ipv6), now.buckets6.size());
    }
    // The sequence must have exercised every path, or the test lost its edge.
    EXPECT_GT(accepted, 1000);
    EXPECT_GT(conflicts, 50);
    EXPECT_GT(overflows, 50);
    EXPECT_GT(undone, 50);
}

TEST(RuleCompiler, ABindingOfExactFlowsTouchesNoBucket) {
    RuleSet rules;
    ASSERT_TRUE(rules.set(1, {*policy::parse_flow_spec("udp * -> 10.1.0.0/16:*")}).ok());
    auto c = rules.set(2, {*policy::parse_flow_spec("udp 10.99.0.3:1 -> 10.99.0.2:2"),
                           *policy::parse_flow_spec("udp [fd00::3]:1 -> [fd00::2]:2")});
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->exact.size(), 2u);
    EXPECT_TRUE(c->buckets.empty());
    // The same set again changes nothing.
    c = rules.set(2, {*policy::parse_flow_spec("udp 10.99.0.3:1 -> 10.99.0.2:2"),
                      *policy::parse_flow_spec("udp [fd00::3]:1 -> [fd00::2]:2")});
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->exact.empty());
    EXPECT_TRUE(c->buckets.empty());
}
