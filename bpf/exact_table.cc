#include "bpf/exact_table.h"

#include <cstring>
#include <string>
#include <unordered_set>

namespace knod::bpf {
namespace {

// How many buckets one placement may visit looking for a chain of moves. At the loads the
// table is sized for, chains are a few moves long; this only bounds a hopeless search.
constexpr std::size_t max_search = 4096;

template <typename Entry> bool used(const Entry &e) {
    return (e.meta & KNOD_EXACT_USED) != 0;
}

template <typename Family> std::uint32_t location(std::uint32_t bucket, int way) {
    return bucket * Family::ways + static_cast<std::uint32_t>(way);
}

std::uint32_t word(const std::uint8_t *bytes) {
    std::uint32_t w;
    std::memcpy(&w, bytes, 4);
    return w;
}

std::uint32_t port_word(std::uint16_t src_port, std::uint16_t dst_port) {
    std::uint16_t ports[2] = {src_port, dst_port}; // already in network order
    return word(reinterpret_cast<const std::uint8_t *>(ports));
}

std::uint32_t meta(std::uint8_t protocol, std::uint32_t slot) {
    return KNOD_EXACT_USED | std::uint32_t{protocol} << 16 | (slot & 0xffff);
}

} // namespace

knod_exact4_entry make_exact4_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[4],
                                    const std::uint8_t (&dst)[4], std::uint32_t slot) {
    return {port_word(src_port, dst_port), word(src), word(dst), meta(protocol, slot)};
}

knod_exact6_entry make_exact6_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[16],
                                    const std::uint8_t (&dst)[16], std::uint32_t slot) {
    knod_exact6_entry e{};
    e.ports = port_word(src_port, dst_port);
    std::memcpy(e.src, src, 16);
    std::memcpy(e.dst, dst, 16);
    e.meta = meta(protocol, slot);
    return e;
}

std::uint8_t exact_protocol(std::uint32_t meta) {
    return static_cast<std::uint8_t>(meta >> 16);
}

std::uint32_t exact_slot(std::uint32_t meta) {
    return meta & 0xffff;
}

std::uint32_t Exact4::bucket_of(const Hash &h, const Entry &e) {
    return knod_exact4_bucket_of(&h, e.ports, e.src, e.dst, exact_protocol(e.meta));
}

std::uint32_t Exact6::bucket_of(const Hash &h, const Entry &e) {
    return knod_exact6_bucket_of(&h, e.ports, e.src, e.dst, exact_protocol(e.meta));
}

template <typename F> bool ExactTable<F>::Key::operator==(const Key &o) const {
    return std::memcmp(&e, &o.e, sizeof e) == 0;
}

template <typename F> std::size_t ExactTable<F>::KeyHash::operator()(const Key &k) const {
    return std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char *>(&k.e), sizeof k.e));
}

template <typename F> typename ExactTable<F>::Key ExactTable<F>::key_of(const Entry &e) {
    Key k{e};
    k.e.meta = KNOD_EXACT_USED | (e.meta & 0x00ff0000u);
    return k;
}

template <typename F>
ExactTable<F>::ExactTable(const std::array<Hash, 2> &hash)
    : hash_(hash), buckets_(static_cast<Bucket *>(std::calloc(F::buckets, sizeof(Bucket)))) {
    if (!buckets_) std::abort(); // as std::vector would on a failed allocation, without exceptions
}

template <typename F> std::array<std::uint32_t, 2> ExactTable<F>::buckets_of(const Entry &e) const {
    return {F::bucket_of(hash_[0], e), F::bucket_of(hash_[1], e)};
}

template <typename F> std::optional<std::uint32_t> ExactTable<F>::find(const Entry &probe) const {
    Key want = key_of(probe);
    for (std::uint32_t b : buckets_of(probe))
        for (auto &w : buckets_[b].way)
            if (used(w) && key_of(w) == want) return exact_slot(w.meta);
    return std::nullopt;
}

template <typename F> void ExactTable<F>::write(std::uint32_t bucket, int way, const Entry &e) {
    old_buckets_.try_emplace(bucket, buckets_[bucket]);
    Key k = key_of(e);
    auto at = where_.find(k);
    old_where_.try_emplace(k, at == where_.end() ? std::nullopt
                                                 : std::optional<std::uint32_t>(at->second));
    buckets_[bucket].way[way] = e;
    where_[k] = location<F>(bucket, way);
}

template <typename F> void ExactTable<F>::clear(std::uint32_t bucket, int way) {
    old_buckets_.try_emplace(bucket, buckets_[bucket]);
    Key k = key_of(buckets_[bucket].way[way]);
    auto at = where_.find(k);
    if (at != where_.end() && at->second == location<F>(bucket, way)) {
        old_where_.try_emplace(k, at->second);
        where_.erase(at);
    }
    buckets_[bucket].way[way] = {};
}

template <typename F> void ExactTable<F>::begin() {
    old_buckets_.clear();
    old_where_.clear();
}

template <typename F> void ExactTable<F>::roll_back() {
    for (auto &[b, contents] : old_buckets_)
        buckets_[b] = contents;
    for (auto &[k, loc] : old_where_)
        if (loc)
            where_[k] = *loc;
        else
            where_.erase(k);
}

template <typename F> bool ExactTable<F>::place(const Entry &e) {
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
        const Bucket &here = buckets_[nodes[i].bucket];
        for (int w = 0; w < F::ways; ++w) {
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
        for (int w = 0; w < F::ways; ++w) {
            auto both = buckets_of(here.way[w]);
            std::uint32_t other = both[0] == nodes[i].bucket ? both[1] : both[0];
            if (seen.insert(other).second) nodes.push_back({other, static_cast<int>(i), w});
        }
    }
    return false;
}

template <typename F>
Result<std::vector<std::uint32_t>> ExactTable<F>::no_place(std::size_t wanted) {
    roll_back();
    return make_error(Errc::quota_exceeded, std::string("no place for another exact ") + F::name +
                                                " flow (" + std::to_string(wanted) +
                                                " wanted; the filter holds about " +
                                                std::to_string(capacity * 9 / 10) + ")");
}

template <typename F> std::vector<std::uint32_t> ExactTable<F>::changed() const {
    std::vector<std::uint32_t> out;
    for (auto &[b, _] : old_buckets_)
        out.push_back(b);
    return out;
}

template <typename F>
Result<std::vector<std::uint32_t>> ExactTable<F>::assign(const std::vector<Entry> &entries) {
    std::unordered_map<Key, std::uint32_t, KeyHash> wanted;
    for (auto &e : entries)
        wanted[key_of(e)] = e.meta;
    if (wanted.size() > capacity)
        return make_error(Errc::quota_exceeded, std::to_string(wanted.size()) + " exact " +
                                                    F::name + " flows; the filter holds at most " +
                                                    std::to_string(capacity));
    begin();
    // Clear what goes, bring the slot of what stays up to date.
    std::vector<std::uint32_t> going;
    for (auto &[k, loc] : where_) {
        auto it = wanted.find(k);
        if (it == wanted.end()) {
            going.push_back(loc);
            continue;
        }
        const Entry &held = buckets_[loc / F::ways].way[loc % F::ways];
        if (held.meta != it->second) {
            Entry updated = held;
            updated.meta = it->second;
            write(loc / F::ways, static_cast<int>(loc % F::ways), updated);
        }
        wanted.erase(it);
    }
    for (std::uint32_t loc : going)
        clear(loc / F::ways, static_cast<int>(loc % F::ways));
    // Place the new ones, in the order given, so the result does not depend on hash order.
    for (auto &e : entries) {
        auto it = wanted.find(key_of(e));
        if (it == wanted.end()) continue;
        Entry placed = e;
        placed.meta = it->second;
        if (!place(placed)) return no_place(entries.size());
        wanted.erase(it);
    }
    return changed();
}

template <typename F>
Result<std::vector<std::uint32_t>> ExactTable<F>::update(const std::vector<Entry> &upserts,
                                                         const std::vector<Entry> &removals) {
    begin();
    for (auto &e : removals) {
        auto at = where_.find(key_of(e));
        if (at != where_.end()) clear(at->second / F::ways, static_cast<int>(at->second % F::ways));
    }
    for (auto &e : upserts) {
        auto at = where_.find(key_of(e));
        if (at == where_.end()) {
            if (where_.size() >= capacity || !place(e)) return no_place(where_.size() + 1);
            continue;
        }
        const Entry &held = buckets_[at->second / F::ways].way[at->second % F::ways];
        if (held.meta != e.meta)
            write(at->second / F::ways, static_cast<int>(at->second % F::ways), e);
    }
    return changed();
}

template class ExactTable<Exact4>;
template class ExactTable<Exact6>;

} // namespace knod::bpf
