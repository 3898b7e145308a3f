// Random binding changes for the rule compiler's equivalence tests: flow sets drawn from a small
// pool (exact IPv4 and IPv6 tuples, prefixes of both families, port ranges, any-family rules,
// many rules on one destination), so that exact-tuple conflicts between bindings and overfull
// buckets both happen often.
#pragma once

#include "policy/flow_spec.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace knod::testing {

// The first `crowd` of the pool all cover 10.1.2.3.
constexpr std::size_t crowd = 12;

inline std::vector<policy::FlowSpec> flow_pool() {
    std::vector<std::string> text;
    // Prefix rules on one host: with several bindings these overfill its bucket.
    for (std::size_t x = 0; x < crowd; ++x)
        text.push_back("udp 10.0." + std::to_string(x) + ".0/24:* -> 10.1.2.3:5000-5100");
    for (int h = 0; h < 4; ++h)
        for (int p = 0; p < 3; ++p) {
            std::string port = std::to_string(1000 + p);
            text.push_back("udp 10.5.0." + std::to_string(h) + ":" + port + " -> 10.6.0.1:2000");
            text.push_back("tcp 10.5.0." + std::to_string(h) + ":" + port + " -> 10.6.0.1:2000");
            text.push_back("udp [fd00::" + std::to_string(h) + "]:" + port + " -> [fd01::1]:2000");
        }
    for (int x = 0; x < 6; ++x)
        text.push_back("tcp [fd00:" + std::to_string(x) + "::/32]:* -> [fd02::1]:443");
    text.insert(text.end(), {
                                "udp * -> 10.1.2.0/24:8000",
                                "udp * -> 10.1.0.0/16:*",
                                "tcp 10.9.0.0/16:1-1023 -> 10.1.2.3:80-90",
                                "udp 192.168.0.1:* -> 0.0.0.0/0:53",
                                "any * -> *:9000",
                                "udp * -> *:53",
                                "any * -> [fd02::/16]:*",
                                "tcp [fd00::/8]:* -> [fd02::1]:443",
                                "udp 10.1.2.3:7 -> 10.1.2.3:7000",
                                "udp 10.7.0.0/16:* -> 10.8.0.0/16:1-65535",
                                "udp 10.7.1.0/24:* -> 10.8.1.0/24:100-200",
                            });
    std::vector<policy::FlowSpec> out;
    for (auto &t : text)
        out.push_back(*policy::parse_flow_spec(t));
    return out;
}

// One step: a slot and its new flows (empty: the binding goes).
struct FlowStep {
    std::uint32_t slot;
    std::vector<policy::FlowSpec> flows;
};

inline FlowStep random_step(std::mt19937 &rng, const std::vector<policy::FlowSpec> &pool,
                            std::uint32_t slots) {
    FlowStep s{static_cast<std::uint32_t>(rng() % slots), {}};
    if (rng() % 5 == 0) return s;
    auto n = 1 + rng() % 5;
    for (unsigned i = 0; i < n; ++i)
        s.flows.push_back(pool[rng() % 3 == 0 ? rng() % crowd : rng() % pool.size()]);
    if (rng() % 8 == 0 && !s.flows.empty()) s.flows.push_back(s.flows.front()); // listed twice
    return s;
}

} // namespace knod::testing
