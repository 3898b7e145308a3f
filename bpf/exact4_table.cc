#include "bpf/exact4_table.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace knod::bpf {
namespace {

// How many buckets one placement may visit looking for a chain of moves. At the loads the
// table is sized for, chains are a few moves long; this only bounds a hopeless search.
constexpr std::size_t max_search = 4096;

bool used(const knod_exact4_entry &e) {
    return (e.meta & KNOD_EXACT4_USED) != 0;
}

// What an entry is matched on: its words and protocol, not its slot.
struct Key {
    std::uint32_t ports, src, dst;
    std::uint8_t protocol;
    bool operator==(const Key &) const = default;
};

struct KeyHash {
    std::size_t operator()(const Key &k) const {
        std::uint64_t h = (std::uint64_t{k.ports} << 32 | k.src) * 0x9e3779b97f4a7c15ULL;
        return static_cast<std::size_t>(h ^ (std::uint64_t{k.dst} << 8 | k.protocol) *
                                                0xc2b2ae3d27d4eb4fULL);
    }
};

Key key_of(const knod_exact4_entry &e) {
    return {e.ports, e.src, e.dst, exact4_protocol(e)};
}

} // namespace

knod_exact4_entry make_exact4_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[4],
                                    const std::uint8_t (&dst)[4], std::uint32_t slot) {
    knod_exact4_entry e{};
    std::uint16_t ports[2] = {src_port, dst_port}; // already in network order
    std::memcpy(&e.ports, ports, 4);
    std::memcpy(&e.src, src, 4);
    std::memcpy(&e.dst, dst, 4);
    e.meta = KNOD_EXACT4_USED | std::uint32_t{protocol} << 16 | (slot & 0xffff);
    return e;
}

std::uint8_t exact4_protocol(const knod_exact4_entry &e) {
    return static_cast<std::uint8_t>(e.meta >> 16);
}

std::uint32_t exact4_slot(const knod_exact4_entry &e) {
    return e.meta & 0xffff;
}

Exact4Table::Exact4Table(const std::array<knod_exact4_hash, 2> &hash)
    : hash_(hash), buckets_(KNOD_EXACT4_BUCKETS) {}

std::array<std::uint32_t, 2> Exact4Table::buckets_of(const knod_exact4_entry &e) const {
    std::uint8_t p = exact4_protocol(e);
    return {knod_exact4_bucket_of(&hash_[0], e.ports, e.src, e.dst, p),
            knod_exact4_bucket_of(&hash_[1], e.ports, e.src, e.dst, p)};
}

std::optional<std::uint32_t> Exact4Table::find(std::uint32_t ports, std::uint32_t src,
                                               std::uint32_t dst, std::uint8_t protocol) const {
    knod_exact4_entry probe{ports, src, dst, std::uint32_t{protocol} << 16};
    std::uint32_t tag = KNOD_EXACT4_USED >> 16 | protocol;
    for (std::uint32_t b : buckets_of(probe))
        for (auto &w : buckets_[b].way)
            if (w.src == src && w.ports == ports && w.dst == dst && (w.meta >> 16) == tag)
                return exact4_slot(w);
    return std::nullopt;
}

bool Exact4Table::place(const knod_exact4_entry &e, std::vector<bool> &dirty) {
    // Breadth-first over buckets, so the chain of moves is the shortest. A node's children are
    // the other buckets of the entries it holds; `way` is the way of the parent's bucket whose
    // entry would move into this node's bucket.
    struct Node {
        std::uint32_t bucket;
        int parent;
        int way;
    };
    std::vector<Node> nodes;
    std::unordered_set<std::uint32_t> seen;
    for (std::uint32_t b : buckets_of(e))
        if (seen.insert(b).second) nodes.push_back({b, -1, -1});
    for (std::size_t i = 0; i < nodes.size() && i < max_search; ++i) {
        knod_exact4_bucket &here = buckets_[nodes[i].bucket];
        for (int w = 0; w < KNOD_EXACT4_WAYS; ++w) {
            if (used(here.way[w])) continue;
            // A free way: shift each entry on the chain one step, leaf first, then put `e` in
            // the way the first move freed.
            std::size_t n = i;
            int free_way = w;
            while (nodes[n].parent >= 0) {
                const Node &parent = nodes[static_cast<std::size_t>(nodes[n].parent)];
                buckets_[nodes[n].bucket].way[free_way] = buckets_[parent.bucket].way[nodes[n].way];
                dirty[nodes[n].bucket] = true;
                free_way = nodes[n].way;
                n = static_cast<std::size_t>(nodes[n].parent);
            }
            buckets_[nodes[n].bucket].way[free_way] = e;
            dirty[nodes[n].bucket] = true;
            return true;
        }
        for (int w = 0; w < KNOD_EXACT4_WAYS; ++w) {
            auto both = buckets_of(here.way[w]);
            std::uint32_t other = both[0] == nodes[i].bucket ? both[1] : both[0];
            if (seen.insert(other).second) nodes.push_back({other, static_cast<int>(i), w});
        }
    }
    return false;
}

Result<std::vector<std::uint32_t>>
Exact4Table::assign(const std::vector<knod_exact4_entry> &entries) {
    std::unordered_map<Key, std::uint32_t, KeyHash> wanted;
    for (auto &e : entries)
        wanted[key_of(e)] = e.meta;
    if (wanted.size() > capacity)
        return make_error(Errc::quota_exceeded, std::to_string(wanted.size()) +
                                                    " exact IPv4 flows; the filter holds at most " +
                                                    std::to_string(capacity));
    auto before = buckets_;
    std::size_t before_size = size_;
    std::vector<bool> dirty(KNOD_EXACT4_BUCKETS);
    // Keep what stays (with its slot brought up to date), clear what goes.
    for (std::uint32_t b = 0; b < KNOD_EXACT4_BUCKETS; ++b)
        for (auto &w : buckets_[b].way) {
            if (!used(w)) continue;
            auto it = wanted.find(key_of(w));
            if (it == wanted.end()) {
                w = {};
                --size_;
                dirty[b] = true;
                continue;
            }
            if (w.meta != it->second) {
                w.meta = it->second;
                dirty[b] = true;
            }
            wanted.erase(it);
        }
    // Place the new ones, in the order given, so the result does not depend on hash order.
    for (auto &e : entries) {
        auto it = wanted.find(key_of(e));
        if (it == wanted.end()) continue;
        knod_exact4_entry placed = e;
        placed.meta = it->second;
        if (!place(placed, dirty)) {
            buckets_ = std::move(before);
            size_ = before_size;
            return make_error(Errc::quota_exceeded, "no place for another exact IPv4 flow (" +
                                                        std::to_string(entries.size()) +
                                                        " wanted; the filter holds about " +
                                                        std::to_string(capacity * 9 / 10) + ")");
        }
        ++size_;
        wanted.erase(it);
    }
    std::vector<std::uint32_t> changed;
    for (std::uint32_t b = 0; b < KNOD_EXACT4_BUCKETS; ++b)
        if (dirty[b]) changed.push_back(b);
    return changed;
}

} // namespace knod::bpf
