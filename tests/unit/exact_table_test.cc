// The loader's IPv4 exact-rule table, without the kernel: placement, lookups as the BPF program
// does them, the buckets it reports changed, and refusals that leave it as it was.
#include "bpf/exact_table.h"

#include <gtest/gtest.h>

#include <netinet/in.h>

#include <map>
#include <random>
#include <set>

using knod::Errc;
using knod::bpf::Exact4Table;
using knod::bpf::make_exact4_entry;

namespace {

std::array<knod_exact4_hash, 2> random_hash(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::array<knod_exact4_hash, 2> h{};
    for (auto &f : h) {
        for (auto &m : f.mul)
            m = rng() | 1;
        f.seed = rng();
    }
    return h;
}

knod_exact4_entry entry(std::uint32_t i, std::uint32_t slot, std::uint8_t protocol = IPPROTO_UDP) {
    std::uint8_t src[4] = {10, static_cast<std::uint8_t>(i >> 16),
                           static_cast<std::uint8_t>(i >> 8), static_cast<std::uint8_t>(i)};
    std::uint8_t dst[4] = {10, 60, 0, 1};
    return make_exact4_entry(protocol, htons(1000), htons(2000), src, dst, slot);
}

std::optional<std::uint32_t> find(const Exact4Table &t, const knod_exact4_entry &e) {
    return t.find(e.ports, e.src, e.dst, knod::bpf::exact4_protocol(e));
}

std::vector<knod_exact4_entry> entries(std::uint32_t n, std::uint32_t slot = 1) {
    std::vector<knod_exact4_entry> out;
    for (std::uint32_t i = 0; i < n; ++i)
        out.push_back(entry(i, slot));
    return out;
}

} // namespace

TEST(Exact4Table, FindsWhatItHoldsAndNothingElse) {
    Exact4Table t(random_hash(1));
    std::vector<knod_exact4_entry> want;
    for (std::uint32_t i = 0; i < 5000; ++i)
        want.push_back(entry(i, i % 300));
    auto changed = t.assign(want);
    ASSERT_TRUE(changed.ok()) << changed.error().message;
    EXPECT_EQ(t.size(), 5000u);
    for (std::uint32_t i = 0; i < 5000; ++i)
        ASSERT_EQ(find(t, entry(i, 0)), i % 300) << i;
    EXPECT_EQ(find(t, entry(5000, 0)), std::nullopt);
    EXPECT_EQ(find(t, entry(7, 0, IPPROTO_TCP)), std::nullopt) << "protocol is part of the match";
}

TEST(Exact4Table, OneTupleMayHaveAUdpAndATcpRule) {
    Exact4Table t(random_hash(2));
    ASSERT_TRUE(t.assign({entry(1, 5, IPPROTO_UDP), entry(1, 6, IPPROTO_TCP)}).ok());
    EXPECT_EQ(find(t, entry(1, 0, IPPROTO_UDP)), 5u);
    EXPECT_EQ(find(t, entry(1, 0, IPPROTO_TCP)), 6u);
}

TEST(Exact4Table, ReportsOnlyTheBucketsThatChanged) {
    Exact4Table t(random_hash(3));
    auto first = t.assign(entries(1000));
    ASSERT_TRUE(first.ok());
    EXPECT_GE(first->size(), 900u); // 1,000 entries over 65,536 buckets rarely share one
    auto again = t.assign(entries(1000));
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->empty()) << "the same rules again write nothing";

    // One rule gone, one moved to another binding: at most the buckets of those two change.
    auto next = entries(1000);
    next.erase(next.begin() + 10);
    next[20] = entry(21, 7);
    auto changed = t.assign(next);
    ASSERT_TRUE(changed.ok());
    EXPECT_GE(changed->size(), 1u);
    EXPECT_LE(changed->size(), 2u);
    EXPECT_EQ(find(t, entry(10, 0)), std::nullopt);
    EXPECT_EQ(find(t, entry(21, 0)), 7u);
    EXPECT_EQ(t.size(), 999u);
}

TEST(Exact4Table, FillsToNinetyPercentOfItsCapacity) {
    Exact4Table t(random_hash(4));
    std::uint32_t n = Exact4Table::capacity * 9 / 10;
    auto r = t.assign(entries(n));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(t.size(), n);
    for (std::uint32_t i = 0; i < n; i += 97)
        ASSERT_EQ(find(t, entry(i, 0)), 1u) << i;
    // Every entry sits in one of its own two buckets, so the BPF program's two reads find it.
    std::set<std::uint32_t> seen;
    for (std::uint32_t b = 0; b < KNOD_EXACT4_BUCKETS; ++b)
        for (auto &w : t.bucket(b).way)
            if (w.meta & KNOD_EXACT4_USED) seen.insert(w.src);
    EXPECT_EQ(seen.size(), n) << "each entry is held exactly once";
}

TEST(Exact4Table, MoreThanItCanHoldIsRefusedAndChangesNothing) {
    Exact4Table t(random_hash(5));
    ASSERT_TRUE(t.assign(entries(100)).ok());
    auto r = t.assign(entries(Exact4Table::capacity + 1));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::quota_exceeded);
    EXPECT_EQ(t.size(), 100u);
    EXPECT_EQ(find(t, entry(99, 0)), 1u);
    EXPECT_EQ(find(t, entry(100, 0)), std::nullopt);
}

TEST(Exact4Table, ANoPlaceRefusalRollsBackEveryMove) {
    // All-zero keys send every entry to bucket 0 by both hashes: four ways, then no place.
    Exact4Table t(std::array<knod_exact4_hash, 2>{});
    ASSERT_TRUE(t.assign(entries(3, 2)).ok());
    auto r = t.assign(entries(5, 3));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::quota_exceeded);
    EXPECT_NE(r.error().message.find("no place"), std::string::npos) << r.error().message;
    EXPECT_EQ(t.size(), 3u);
    for (std::uint32_t i = 0; i < 3; ++i)
        EXPECT_EQ(find(t, entry(i, 0)), 2u) << "slot updates are rolled back too";
    EXPECT_EQ(find(t, entry(3, 0)), std::nullopt);
}

// Random assignments against a plain map, with hash keys that crowd 320 possible rules into
// about 80 buckets, so that most placements move others and some find no place. After each
// assignment, accepted or refused, every rule is found exactly where the model says, and the
// table's own count agrees with the buckets.
TEST(Exact4Table, RandomAssignmentsMatchAModelThroughMovesAndRefusals) {
    std::array<knod_exact4_hash, 2> crowded{};
    crowded[0].mul[1] = 1ULL << 48; // bucket = src mod 65,536
    crowded[1].mul[1] = 3ULL << 48; // bucket = 3 * src mod 65,536
    Exact4Table t(crowded);
    auto rule = [](std::uint32_t src, std::uint32_t port, std::uint32_t slot) {
        return knod_exact4_entry{port, src, 7, KNOD_EXACT4_USED | IPPROTO_UDP << 16 | slot};
    };
    std::mt19937 rng(42);
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> model;
    int refused = 0;
    for (int round = 0; round < 300; ++round) {
        std::vector<knod_exact4_entry> want;
        std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> next;
        int percent = 30 + static_cast<int>(rng() % 70);
        for (std::uint32_t src = 0; src < 40; ++src)
            for (std::uint32_t port = 0; port < 8; ++port)
                if (static_cast<int>(rng() % 100) < percent) {
                    std::uint32_t slot = rng() % 5;
                    want.push_back(rule(src, port, slot));
                    next[{src, port}] = slot;
                }
        auto r = t.assign(want);
        if (r.ok()) {
            model = next;
        } else {
            ++refused;
            EXPECT_EQ(r.error().code, Errc::quota_exceeded);
        }
        std::size_t used_ways = 0;
        for (std::uint32_t b = 0; b < KNOD_EXACT4_BUCKETS; ++b)
            for (auto &w : t.bucket(b).way)
                used_ways += (w.meta & KNOD_EXACT4_USED) != 0;
        ASSERT_EQ(t.size(), model.size()) << "round " << round;
        ASSERT_EQ(used_ways, model.size()) << "round " << round;
        for (std::uint32_t src = 0; src < 40; ++src)
            for (std::uint32_t port = 0; port < 8; ++port) {
                auto it = model.find({src, port});
                auto found = t.find(port, src, 7, IPPROTO_UDP);
                if (it == model.end())
                    ASSERT_EQ(found, std::nullopt) << "round " << round;
                else
                    ASSERT_EQ(found, it->second) << "round " << round;
            }
    }
    EXPECT_GT(refused, 0) << "the crowded table never refused: the test lost its edge";
    EXPECT_LT(refused, 300);
}

// The IPv6 table is the same code over 40-byte entries and its own hash.
namespace {

std::array<knod_exact6_hash, 2> random_hash6(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::array<knod_exact6_hash, 2> h{};
    for (auto &f : h) {
        for (auto &m : f.mul)
            m = rng() | 1;
        f.seed = rng();
    }
    return h;
}

knod_exact6_entry entry6(std::uint32_t i, std::uint32_t slot, std::uint8_t protocol = IPPROTO_UDP) {
    std::uint8_t src[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    src[12] = static_cast<std::uint8_t>(i >> 24);
    src[13] = static_cast<std::uint8_t>(i >> 16);
    src[14] = static_cast<std::uint8_t>(i >> 8);
    src[15] = static_cast<std::uint8_t>(i);
    std::uint8_t dst[16] = {0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return knod::bpf::make_exact6_entry(protocol, htons(1000), htons(2000), src, dst, slot);
}

} // namespace

TEST(Exact6Table, FindsWhatItHoldsAndNothingElse) {
    knod::bpf::Exact6Table t(random_hash6(11));
    std::vector<knod_exact6_entry> want;
    for (std::uint32_t i = 0; i < 5000; ++i)
        want.push_back(entry6(i, i % 300));
    ASSERT_TRUE(t.assign(want).ok());
    EXPECT_EQ(t.size(), 5000u);
    for (std::uint32_t i = 0; i < 5000; ++i)
        ASSERT_EQ(t.find(entry6(i, 0)), i % 300) << i;
    EXPECT_EQ(t.find(entry6(5000, 0)), std::nullopt);
    EXPECT_EQ(t.find(entry6(7, 0, IPPROTO_TCP)), std::nullopt) << "protocol is part of the match";
    auto other = entry6(7, 0);
    other.dst[3] ^= 1; // a destination differing in its last word only
    EXPECT_EQ(t.find(other), std::nullopt);
}

TEST(Exact6Table, UpdatesChangeOnlyWhatTheyName) {
    knod::bpf::Exact6Table t(random_hash6(12));
    std::vector<knod_exact6_entry> first;
    for (std::uint32_t i = 0; i < 1000; ++i)
        first.push_back(entry6(i, 1));
    ASSERT_TRUE(t.update(first, {}).ok());
    // One removed, one moved to another slot, one added, one removal of what is not held.
    auto changed = t.update({entry6(5, 2), entry6(2000, 3)}, {entry6(7, 0), entry6(3000, 0)});
    ASSERT_TRUE(changed.ok());
    EXPECT_LE(changed->size(), 3u + 8u) << "a few buckets, plus moves";
    EXPECT_EQ(t.size(), 1000u);
    EXPECT_EQ(t.find(entry6(5, 0)), 2u);
    EXPECT_EQ(t.find(entry6(2000, 0)), 3u);
    EXPECT_EQ(t.find(entry6(7, 0)), std::nullopt);
    EXPECT_EQ(t.find(entry6(8, 0)), 1u);
    // The same again changes nothing; undo() takes back the last update.
    changed = t.update({entry6(5, 2)}, {entry6(7, 0)});
    ASSERT_TRUE(changed.ok());
    EXPECT_TRUE(changed->empty());
    ASSERT_TRUE(t.update({entry6(9, 4)}, {entry6(10, 0)}).ok());
    t.undo();
    EXPECT_EQ(t.find(entry6(9, 0)), 1u);
    EXPECT_EQ(t.find(entry6(10, 0)), 1u);
}

TEST(Exact6Table, FillsToNinetyPercentAndRefusesPastCapacityChangingNothing) {
    knod::bpf::Exact6Table t(random_hash6(13));
    std::uint32_t n = knod::bpf::Exact6Table::capacity * 9 / 10;
    std::vector<knod_exact6_entry> want;
    for (std::uint32_t i = 0; i < n; ++i)
        want.push_back(entry6(i, 1));
    ASSERT_TRUE(t.assign(want).ok());
    EXPECT_EQ(t.size(), n);
    for (std::uint32_t i = 0; i < n; i += 97)
        ASSERT_EQ(t.find(entry6(i, 0)), 1u) << i;
    std::vector<knod_exact6_entry> more;
    for (std::uint32_t i = n; i < knod::bpf::Exact6Table::capacity + 1; ++i)
        more.push_back(entry6(i, 2));
    auto r = t.update(more, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::quota_exceeded);
    EXPECT_EQ(t.size(), n);
    EXPECT_EQ(t.find(entry6(n, 0)), std::nullopt);
    EXPECT_EQ(t.find(entry6(n - 1, 0)), 1u);
}
