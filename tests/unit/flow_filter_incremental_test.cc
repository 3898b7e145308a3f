// The loader's incremental publication against compile_rules from scratch, in the kernel: a random
// sequence of binding changes (random_flows.h), and after each the live generation's maps hold
// exactly the from-scratch entries (prefix tries every step, the exact tables' used entries every
// few), crafted packets get the decision the from-scratch rules give (BPF_PROG_TEST_RUN), and a
// refused change leaves the config, epoch included, as it was. Needs root; skipped otherwise.
#include "bpf/flow_filter.h"
#include "bpf/packet_builder.h"
#include "random_flows.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>

using namespace knod;
using namespace knod::bpf;
using knod::bpf::packets::build_packet;
using knod::bpf::packets::PacketSpec;

namespace {

template <typename T> std::string bytes(const T &v) {
    return std::string(reinterpret_cast<const char *>(&v), sizeof v);
}

// A map of the loaded program, by name (the loader keeps its skeleton to itself).
int map_fd(int prog_fd, const std::string &name) {
    std::vector<__u32> ids(64);
    bpf_prog_info info{};
    info.nr_map_ids = static_cast<__u32>(ids.size());
    info.map_ids = reinterpret_cast<__u64>(ids.data());
    __u32 len = sizeof info;
    if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) return -1;
    for (__u32 i = 0; i < info.nr_map_ids; ++i) {
        int fd = bpf_map_get_fd_by_id(ids[i]);
        bpf_map_info m{};
        __u32 mlen = sizeof m;
        if (fd >= 0 && bpf_obj_get_info_by_fd(fd, &m, &mlen) == 0 && name == m.name) return fd;
        if (fd >= 0) close(fd);
    }
    return -1;
}

knod_config read_config(int fd) {
    knod_config c{};
    __u32 zero = 0;
    bpf_map_lookup_elem(fd, &zero, &c);
    return c;
}

// The live generation's entries of an LPM trie, generation byte cleared, key bytes -> bucket.
template <typename Key> std::map<std::string, std::string> trie(int fd, std::uint8_t gen) {
    std::map<std::string, std::string> out;
    Key k{}, next{};
    void *prev = nullptr;
    while (bpf_map_get_next_key(fd, prev, &next) == 0) {
        k = next;
        prev = &k;
        if (k.generation != gen) continue;
        knod_bucket b{};
        if (bpf_map_lookup_elem(fd, &k, &b) != 0) continue;
        Key plain = k;
        plain.generation = 0;
        out[bytes(plain)] = bytes(b);
    }
    return out;
}

template <typename Key> std::map<std::string, std::string> expected(const auto &buckets) {
    std::map<std::string, std::string> out;
    for (auto &b : buckets)
        out[bytes(b.key)] = bytes(b.bucket);
    return out;
}

// Every used way of the live generation of an exact table, by its bytes.
template <typename Bucket>
std::multiset<std::string> used_ways(int fd, std::uint8_t gen, std::uint32_t bits) {
    std::multiset<std::string> out;
    std::uint32_t n = 1u << bits;
    std::vector<__u32> keys(n);
    std::vector<Bucket> values(n);
    __u32 batch = 0, count = n;
    __u32 start = std::uint32_t{gen} << bits;
    // Reads from `start`: a batch resumes after the key it is given, so start one before.
    __u32 in = start - 1;
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    int r = bpf_map_lookup_batch(fd, gen ? &in : nullptr, &batch, keys.data(), values.data(),
                                 &count, &opts);
    EXPECT_TRUE(r == 0 || errno == ENOENT) << std::strerror(errno);
    for (__u32 i = 0; i < count; ++i) {
        if (keys[i] < start || keys[i] >= start + n) continue;
        for (auto &w : values[i].way)
            if (w.meta & KNOD_EXACT_USED) out.insert(bytes(w));
    }
    return out;
}

// What the from-scratch rules decide for one packet: the slot, or none (as flow_filter.bpf.c
// decides: an exact entry first, then the longest-prefix bucket's rules in order).
struct Probe {
    bool ipv6;
    std::uint8_t protocol;
    std::array<std::uint8_t, 16> src{}, dst{};
    std::uint16_t sport, dport;
};

bool prefix_match(const std::uint8_t *want, const std::uint8_t *addr, unsigned bits) {
    for (unsigned bit = 0; bit < bits; ++bit)
        if ((want[bit / 8] ^ addr[bit / 8]) & (0x80 >> (bit % 8))) return false;
    return true;
}

template <typename Entry> std::uint32_t key_meta(const Entry &e) {
    return e.meta & ~0xffffu;
}

std::optional<std::uint32_t> decide(const CompiledRules &c, const Probe &p) {
    std::uint8_t src4[4], dst4[4];
    std::memcpy(src4, p.src.data(), 4);
    std::memcpy(dst4, p.dst.data(), 4);
    if (!p.ipv6) {
        auto want = make_exact4_entry(p.protocol, htons(p.sport), htons(p.dport), src4, dst4, 0);
        for (auto &e : c.exact4)
            if (e.ports == want.ports && e.src == want.src && e.dst == want.dst &&
                key_meta(e) == key_meta(want))
                return exact_slot(e.meta);
    } else {
        std::uint8_t s[16], d[16];
        std::memcpy(s, p.src.data(), 16);
        std::memcpy(d, p.dst.data(), 16);
        auto want = make_exact6_entry(p.protocol, htons(p.sport), htons(p.dport), s, d, 0);
        for (auto &e : c.exact6) {
            auto plain = e;
            plain.meta = key_meta(e);
            if (bytes(plain) == bytes(want)) return exact_slot(e.meta);
        }
    }
    const knod_bucket *best = nullptr;
    int best_len = -1;
    auto consider = [&](const auto &buckets) {
        for (auto &b : buckets) {
            int len = static_cast<int>(b.key.prefixlen) - 32;
            if (len > best_len && prefix_match(b.key.addr, p.dst.data(), len)) {
                best = &b.bucket;
                best_len = len;
            }
        }
    };
    if (p.ipv6)
        consider(c.buckets6);
    else
        consider(c.buckets4);
    if (!best) return std::nullopt;
    for (std::uint32_t i = 0; i < best->count; ++i) {
        auto &r = best->rules[i];
        if (r.protocol && r.protocol != p.protocol) continue;
        if (p.sport < r.src_port_lo || p.sport > r.src_port_hi) continue;
        if (p.dport < r.dst_port_lo || p.dport > r.dst_port_hi) continue;
        if (!prefix_match(r.src, p.src.data(), r.src_len)) continue;
        return r.slot;
    }
    return std::nullopt;
}

Probe probe(bool ipv6, std::uint8_t protocol, const std::string &src, std::uint16_t sport,
            const std::string &dst, std::uint16_t dport) {
    Probe p{ipv6, protocol, {}, {}, sport, dport};
    inet_pton(ipv6 ? AF_INET6 : AF_INET, src.c_str(), p.src.data());
    inet_pton(ipv6 ? AF_INET6 : AF_INET, dst.c_str(), p.dst.data());
    return p;
}

// Packets around the pool's flows: its exact tuples, inside and outside its prefixes and ports.
std::vector<std::pair<Probe, PacketSpec>> probes() {
    std::vector<
        std::tuple<bool, std::uint8_t, std::string, std::uint16_t, std::string, std::uint16_t>>
        t;
    for (int h = 0; h < 5; ++h)
        for (int port = 1000; port < 1004; ++port) {
            t.push_back({false, 17, "10.5.0." + std::to_string(h), port, "10.6.0.1", 2000});
            t.push_back({false, 6, "10.5.0." + std::to_string(h), port, "10.6.0.1", 2000});
            t.push_back({true, 17, "fd00::" + std::to_string(h), port, "fd01::1", 2000});
        }
    for (int x = 0; x < 14; ++x)
        t.push_back({false, 17, "10.0." + std::to_string(x) + ".5", 40000, "10.1.2.3", 5050});
    t.insert(t.end(), {{false, 17, "10.3.3.3", 1234, "10.1.2.3", 8000},
                       {false, 17, "10.3.3.3", 1234, "10.1.2.9", 8000},
                       {false, 17, "10.3.3.3", 1234, "10.1.9.9", 8000},
                       {false, 17, "192.168.0.1", 5, "8.8.8.8", 53},
                       {false, 17, "1.1.1.1", 5, "8.8.8.8", 53},
                       {false, 6, "1.2.3.4", 5, "5.6.7.8", 9000},
                       {false, 6, "10.9.1.1", 80, "10.1.2.3", 85},
                       {false, 17, "10.7.1.1", 150, "10.8.1.1", 150},
                       {false, 17, "10.7.2.1", 150, "10.8.2.1", 150},
                       {false, 17, "10.1.2.3", 7, "10.1.2.3", 7000},
                       {true, 6, "fd00:3::1", 5, "fd02::1", 443},
                       {true, 6, "fd00:9::1", 5, "fd02::1", 443},
                       {true, 17, "fd05::1", 7, "fd02:ff::1", 9000},
                       {true, 17, "fd05::1", 7, "fd09::1", 53}});
    std::vector<std::pair<Probe, PacketSpec>> out;
    for (auto &[ipv6, proto, src, sport, dst, dport] : t) {
        PacketSpec s;
        s.ipv6 = ipv6;
        s.protocol = proto;
        s.src = src;
        s.sport = sport;
        s.dst = dst;
        s.dport = dport;
        out.push_back({probe(ipv6, proto, src, sport, dst, dport), s});
    }
    return out;
}

int run(int prog, const std::vector<std::uint8_t> &packet) {
    std::vector<std::uint8_t> out(packet.size() + 256);
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = packet.data(), .data_out = out.data(),
                .data_size_in = static_cast<__u32>(packet.size()),
                .data_size_out = static_cast<__u32>(out.size()), .repeat = 1);
    EXPECT_EQ(bpf_prog_test_run_opts(prog, &opts), 0);
    return static_cast<int>(opts.retval);
}

// A loaded filter and its maps.
class FlowFilterIncremental : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "BPF tests need root";
        auto loaded = FlowFilter::load();
        ASSERT_TRUE(loaded.ok()) << loaded.error().message;
        filter_ = std::move(*loaded);
        prog = filter_->program_fd();
        config = map_fd(prog, "config");
        p4 = map_fd(prog, "prefixes4");
        p6 = map_fd(prog, "prefixes6");
        e4 = map_fd(prog, "exact4");
        e6 = map_fd(prog, "exact6");
        ASSERT_TRUE(config >= 0 && p4 >= 0 && p6 >= 0 && e4 >= 0 && e6 >= 0);
    }
    void TearDown() override {
        for (int fd : {config, p4, p6, e4, e6})
            if (fd >= 0) close(fd);
    }

    std::unique_ptr<FlowFilter> filter_;
    int prog = -1, config = -1, p4 = -1, p6 = -1, e4 = -1, e6 = -1;
};

} // namespace

TEST_F(FlowFilterIncremental, LiveGenerationMatchesCompilingFromScratch) {
    FlowFilter &f = *filter_;
    constexpr std::uint32_t slots = 12;
    for (std::uint32_t s = 0; s < slots; ++s)
        ASSERT_TRUE(f.set_slot(s, SlotState::active, 0).ok());

    auto pool = knod::testing::flow_pool();
    auto packets = probes();
    std::mt19937 rng(77);
    std::map<std::uint32_t, std::vector<policy::FlowSpec>> model;
    int accepted = 0, refused = 0, offloaded = 0, passed = 0;
    for (int step = 0; step < 300; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        auto s = knod::testing::random_step(rng, pool, slots);
        auto next = model;
        if (s.flows.empty())
            next.erase(s.slot);
        else
            next[s.slot] = s.flows;
        auto want = compile_rules(next);
        knod_config before = read_config(config);
        auto got = f.set_flows(s.slot, s.flows);
        ASSERT_EQ(got.ok(), want.ok()) << (want.ok() ? got.error().message : "");
        if (!got.ok()) {
            EXPECT_EQ(got.error().message, want.error().message);
            knod_config after = read_config(config);
            EXPECT_EQ(bytes(after), bytes(before)) << "a refusal wrote the config";
            ++refused;
        } else {
            model = std::move(next);
            ++accepted;
        }
        auto c = *compile_rules(model);
        knod_config live = read_config(config);
        auto gen = static_cast<std::uint8_t>(live.generation);
        ASSERT_EQ(trie<knod_lpm4_key>(p4, gen), expected<knod_lpm4_key>(c.buckets4));
        ASSERT_EQ(trie<knod_lpm6_key>(p6, gen), expected<knod_lpm6_key>(c.buckets6));
        EXPECT_EQ(live.prefixes4, c.buckets4.size());
        EXPECT_EQ(live.prefixes6, c.buckets6.size());
        if (step % 15 == 0) {
            std::multiset<std::string> w4, w6;
            for (auto &e : c.exact4)
                w4.insert(bytes(e));
            for (auto &e : c.exact6)
                w6.insert(bytes(e));
            ASSERT_EQ(used_ways<knod_exact4_bucket>(e4, gen, KNOD_EXACT4_BUCKET_BITS), w4);
            ASSERT_EQ(used_ways<knod_exact6_bucket>(e6, gen, KNOD_EXACT6_BUCKET_BITS), w6);
        }
        for (int k = 0; k < 4; ++k) {
            auto &[p, spec] = packets[rng() % packets.size()];
            auto slot = decide(c, p);
            std::vector<std::uint64_t> counts;
            for (std::uint32_t i = 0; i < slots; ++i)
                counts.push_back(f.counters(i).packets);
            int verdict = run(prog, build_packet(spec));
            SCOPED_TRACE(spec.src + ":" + std::to_string(spec.sport) + " -> " + spec.dst + ":" +
                         std::to_string(spec.dport));
            // Offloaded (no AF_XDP socket in a test run: dropped) and counted for its slot only.
            EXPECT_EQ(verdict, slot ? XDP_DROP : XDP_PASS);
            for (std::uint32_t i = 0; i < slots; ++i)
                EXPECT_EQ(f.counters(i).packets - counts[i], slot && *slot == i ? 1u : 0u)
                    << "slot " << i;
            (slot ? offloaded : passed) += 1;
        }
    }
    EXPECT_GT(accepted, 100);
    EXPECT_GT(refused, 10);
    EXPECT_GT(offloaded, 100);
    EXPECT_GT(passed, 100);
}

// A rule set the IPv6 exact table cannot hold is refused before the kernel sees anything: the
// config (epoch, generation) and the live table as they were, and the next change publishes as
// if the refusal never happened.
TEST_F(FlowFilterIncremental, AnExactTableRefusalWritesNothing) {
    FlowFilter &f = *filter_;
    auto flow = [](std::uint32_t i) {
        char text[96];
        std::snprintf(text, sizeof text, "udp [fd10::%x:%x]:1 -> [fd11::1]:2", i >> 16, i & 0xffff);
        return *policy::parse_flow_spec(text);
    };
    auto packet = [](std::uint32_t i) {
        char src[64];
        std::snprintf(src, sizeof src, "fd10::%x:%x", i >> 16, i & 0xffff);
        return build_packet(knod::bpf::packets::v6(src, 1, "fd11::1", 2, 17));
    };
    ASSERT_TRUE(f.set_slot(1, SlotState::active, 0).ok());
    ASSERT_TRUE(f.set_slot(2, SlotState::active, 0).ok());
    ASSERT_TRUE(f.set_flows(1, {flow(0)}).ok());
    std::vector<policy::FlowSpec> many;
    for (std::uint32_t i = 1; i <= Exact6Table::capacity; ++i)
        many.push_back(flow(i));
    knod_config before = read_config(config);
    auto held = used_ways<knod_exact6_bucket>(e6, static_cast<std::uint8_t>(before.generation),
                                              KNOD_EXACT6_BUCKET_BITS);
    auto r = f.set_flows(2, many);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::quota_exceeded) << r.error().message;
    EXPECT_EQ(bytes(read_config(config)), bytes(before)) << "the refusal wrote the config";
    for (std::uint8_t gen : {0, 1})
        EXPECT_EQ(used_ways<knod_exact6_bucket>(e6, gen, KNOD_EXACT6_BUCKET_BITS).size(),
                  gen == before.generation ? held.size() : 0u)
            << "generation " << int{gen};
    EXPECT_EQ(run(prog, packet(0)), XDP_DROP) << "the rule in force still offloads";
    EXPECT_EQ(run(prog, packet(1)), XDP_PASS) << "none of the refused set";
    ASSERT_TRUE(f.set_flows(2, {flow(1)}).ok());
    EXPECT_EQ(run(prog, packet(1)), XDP_DROP) << "a later change publishes";
    EXPECT_EQ(run(prog, packet(2)), XDP_PASS) << "and only it";
    EXPECT_EQ(f.counters(2).packets, 1u);
    EXPECT_EQ(f.counters(1).packets, 1u);
}

// A kernel write that fails half way (the prefix trie, shared by both generations, runs out of
// entries) fails the change: the rules in force stay, and the next change publishes a
// generation with none of the failed change's half-written buckets left in it (the dirty sets
// kept them) and exact tables rewritten whole (unsynced).
TEST_F(FlowFilterIncremental, AFailedKernelWriteIsCleanedUpByTheNextPublish) {
    FlowFilter &f = *filter_;
    std::map<std::uint32_t, std::vector<policy::FlowSpec>> model;
    auto install = [&](std::uint32_t slot, std::vector<policy::FlowSpec> flows) {
        ASSERT_TRUE(f.set_slot(slot, SlotState::active, 0).ok());
        auto r = f.set_flows(slot, flows);
        ASSERT_TRUE(r.ok()) << r.error().message;
        model[slot] = std::move(flows);
    };
    install(1, {*policy::parse_flow_spec("udp 10.0.0.0/16:* -> 10.1.2.3:5000"),
                *policy::parse_flow_spec("udp 10.5.0.1:1 -> 10.6.0.1:2")});
    // More destinations than the trie holds for both generations together.
    std::vector<policy::FlowSpec> crowd;
    for (std::uint32_t i = 0; i < KNOD_MAX_BUCKETS; ++i)
        crowd.push_back(*policy::parse_flow_spec(
            "udp 10.200.0.0/16:* -> 11." + std::to_string(i >> 16) + "." +
            std::to_string((i >> 8) & 255) + "." + std::to_string(i & 255) + ":1"));
    crowd.push_back(*policy::parse_flow_spec("udp 10.5.0.2:1 -> 10.6.0.1:2"));
    ASSERT_TRUE(f.set_slot(2, SlotState::active, 0).ok());
    auto r = f.set_flows(2, crowd);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::io) << r.error().message;
    auto check = [&](const char *when) {
        SCOPED_TRACE(when);
        auto c = *compile_rules(model);
        auto gen = static_cast<std::uint8_t>(read_config(config).generation);
        EXPECT_EQ(trie<knod_lpm4_key>(p4, gen), expected<knod_lpm4_key>(c.buckets4));
        std::multiset<std::string> w4;
        for (auto &e : c.exact4)
            w4.insert(bytes(e));
        EXPECT_EQ(used_ways<knod_exact4_bucket>(e4, gen, KNOD_EXACT4_BUCKET_BITS), w4);
    };
    check("after the failure");
    install(3, {*policy::parse_flow_spec("udp 10.5.0.3:1 -> 10.6.0.1:2")});
    check("at the next publish");
    install(4, {*policy::parse_flow_spec("udp 10.5.0.4:1 -> 10.6.0.1:2")});
    check("and the one after");
}
