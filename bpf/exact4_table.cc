#include "bpf/exact4_table.h"

#include <cstring>
#include <unordered_set>

namespace knod::bpf {
namespace {

// How many buckets one placement may visit looking for a chain of moves. At the loads the
// table is sized for, chains are a few moves long; this only bounds a hopeless search.
constexpr std::size_t max_search = 4096;

bool used(const knod_exact4_entry &e) {
    return (e.meta & KNOD_EXACT4_USED) != 0;
}

std::uint32_t location(std::uint32_t bucket, int way) {
    return bucket * KNOD_EXACT4_WAYS + static_cast<std::uint32_t>(way);
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

std::size_t Exact4Table::KeyHash::operator()(const Key &k) const {
    std::uint64_t h = (std::uint64_t{k.ports} << 32 | k.src) * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(h ^ (std::uint64_t{k.dst} << 8 | k.protocol) *
                                            0xc2b2ae3d27d4eb4fULL);
}

Exact4Table::Key Exact4Table::key_of(const knod_exact4_entry &e) {
    return {e.ports, e.src, e.dst, exact4_protocol(e)};
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

void Exact4Table::write(std::uint32_t bucket, int way, const knod_exact4_entry &e) {
    old_buckets_.try_emplace(bucket, buckets_[bucket]);
    Key k = key_of(e);
    auto at = where_.find(k);
    old_where_.try_emplace(k, at == where_.end() ? std::nullopt
                                                 : std::optional<std::uint32_t>(at->second));
    buckets_[bucket].way[way] = e;
    where_[k] = location(bucket, way);
}

void Exact4Table::clear(std::uint32_t bucket, int way) {
    old_buckets_.try_emplace(bucket, buckets_[bucket]);
    Key k = key_of(buckets_[bucket].way[way]);
    auto at = where_.find(k);
    if (at != where_.end() && at->second == location(bucket, way)) {
        old_where_.try_emplace(k, at->second);
        where_.erase(at);
    }
    buckets_[bucket].way[way] = {};
}

void Exact4Table::roll_back() {
    for (auto &[b, contents] : old_buckets_)
        buckets_[b] = contents;
    for (auto &[k, loc] : old_where_)
        if (loc)
            where_[k] = *loc;
        else
            where_.erase(k);
}

bool Exact4Table::place(const knod_exact4_entry &e) {
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
        const knod_exact4_bucket &here = buckets_[nodes[i].bucket];
        for (int w = 0; w < KNOD_EXACT4_WAYS; ++w) {
            if (used(here.way[w])) continue;
            // A free way: shift each entry on the chain one step, leaf first, then put `e` in
            // the way the first move freed. (A moved entry's old way is overwritten next.)
            std::size_t n = i;
            int free_way = w;
            while (nodes[n].parent >= 0) {
                const Node &parent = nodes[static_cast<std::size_t>(nodes[n].parent)];
                write(nodes[n].bucket, free_way, buckets_[parent.bucket].way[nodes[n].way]);
                free_way = nodes[n].way;
                n = static_cast<std::size_t>(nodes[n].parent);
            }
            write(nodes[n].bucket, free_way, e);
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
    old_buckets_.clear();
    old_where_.clear();
    // Clear what goes, bring the slot of what stays up to date.
    std::vector<std::uint32_t> going;
    for (auto &[k, loc] : where_) {
        auto it = wanted.find(k);
        if (it == wanted.end()) {
            going.push_back(loc);
            continue;
        }
        const knod_exact4_entry &held =
            buckets_[loc / KNOD_EXACT4_WAYS].way[loc % KNOD_EXACT4_WAYS];
        if (held.meta != it->second) {
            knod_exact4_entry updated = held;
            updated.meta = it->second;
            write(loc / KNOD_EXACT4_WAYS, static_cast<int>(loc % KNOD_EXACT4_WAYS), updated);
        }
        wanted.erase(it);
    }
    for (std::uint32_t loc : going)
        clear(loc / KNOD_EXACT4_WAYS, static_cast<int>(loc % KNOD_EXACT4_WAYS));
    // Place the new ones, in the order given, so the result does not depend on hash order.
    for (auto &e : entries) {
        auto it = wanted.find(key_of(e));
        if (it == wanted.end()) continue;
        knod_exact4_entry placed = e;
        placed.meta = it->second;
        if (!place(placed)) {
            roll_back();
            return make_error(Errc::quota_exceeded, "no place for another exact IPv4 flow (" +
                                                        std::to_string(entries.size()) +
                                                        " wanted; the filter holds about " +
                                                        std::to_string(capacity * 9 / 10) + ")");
        }
        wanted.erase(it);
    }
    std::vector<std::uint32_t> changed;
    for (auto &[b, _] : old_buckets_)
        changed.push_back(b);
    return changed;
}

} // namespace knod::bpf
