// One generation of one of the filter's exact-rule tables (IPv4 or IPv6), kept by the loader
// exactly as the BPF program reads it (layouts and hashes in flow_filter_abi.h): BUCKETS buckets
// of WAYS entries, every entry in one of the two buckets its hashes choose. Placement moves
// entries between their two buckets when both are full (a cuckoo-style search), so the table
// fills to well over 90 % before a rule finds no place. Pure: no BPF syscalls here.
#pragma once

#include "bpf/flow_filter_abi.h"
#include "knod/result.h"

#include <array>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace knod::bpf {

// An exact IPv4 rule as the table stores it (see knod_exact4_entry for the word order).
knod_exact4_entry make_exact4_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[4],
                                    const std::uint8_t (&dst)[4], std::uint32_t slot);
// The same for IPv6; ports in network order, addresses as the packet carries them.
knod_exact6_entry make_exact6_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[16],
                                    const std::uint8_t (&dst)[16], std::uint32_t slot);
// Both families' entries keep protocol and slot in `meta` alike.
std::uint8_t exact_protocol(std::uint32_t meta);
std::uint32_t exact_slot(std::uint32_t meta);
inline std::uint8_t exact4_protocol(const knod_exact4_entry &e) {
    return exact_protocol(e.meta);
}
inline std::uint32_t exact4_slot(const knod_exact4_entry &e) {
    return exact_slot(e.meta);
}

// What differs between the families: layouts, sizes and the hash (flow_filter_abi.h).
struct Exact4 {
    using Entry = knod_exact4_entry;
    using Bucket = knod_exact4_bucket;
    using Hash = knod_exact4_hash;
    static constexpr std::uint32_t buckets = KNOD_EXACT4_BUCKETS;
    static constexpr int ways = KNOD_EXACT4_WAYS;
    static constexpr const char *name = "IPv4";
    static std::uint32_t bucket_of(const Hash &h, const Entry &e);
};
struct Exact6 {
    using Entry = knod_exact6_entry;
    using Bucket = knod_exact6_bucket;
    using Hash = knod_exact6_hash;
    static constexpr std::uint32_t buckets = KNOD_EXACT6_BUCKETS;
    static constexpr int ways = KNOD_EXACT6_WAYS;
    static constexpr const char *name = "IPv6";
    static std::uint32_t bucket_of(const Hash &h, const Entry &e);
};

template <typename Family> class ExactTable {
  public:
    using Entry = typename Family::Entry;
    using Bucket = typename Family::Bucket;
    using Hash = typename Family::Hash;
    static constexpr std::uint32_t capacity = Family::buckets * Family::ways;

    explicit ExactTable(const std::array<Hash, 2> &hash);

    // Makes the table hold exactly `entries`, moving as little as it can, in time that grows with
    // the rules held and changed, not with the table. Returns the buckets it changed, in order.
    // When an entry finds no place the table is left as it was.
    Result<std::vector<std::uint32_t>> assign(const std::vector<Entry> &entries);
    // Changes only what is named: each of `upserts` is held afterwards (its slot updated if its
    // key was held), each key of `removals` (slot ignored) is not. Time grows with what is named.
    // Returns the buckets it changed, in order; on a refusal the table is left as it was.
    Result<std::vector<std::uint32_t>> update(const std::vector<Entry> &upserts,
                                              const std::vector<Entry> &removals);
    // Reverts the last successful assign() or update() (its change could not be published).
    void undo() {
        roll_back();
        begin();
    }

    // The lookup the BPF program does: the slot of the entry matching `probe`'s key, if any.
    std::optional<std::uint32_t> find(const Entry &probe) const;
    std::optional<std::uint32_t>
    find(std::uint32_t ports, std::uint32_t src, std::uint32_t dst,
         std::uint8_t protocol) const requires std::same_as<Family, Exact4> {
        return find(Entry{ports, src, dst, std::uint32_t{protocol} << 16});
    }

    const Bucket &bucket(std::uint32_t i) const { return buckets_[i]; }
    std::size_t size() const { return where_.size(); }

  private:
    // What an entry is matched on: its words and protocol, not its slot (the entry, slot bits
    // cleared and the used bit set).
    struct Key {
        Entry e;
        bool operator==(const Key &o) const;
    };
    struct KeyHash {
        std::size_t operator()(const Key &k) const;
    };
    static Key key_of(const Entry &e);

    std::array<std::uint32_t, 2> buckets_of(const Entry &e) const;
    // Puts `e` into a free way of one of its buckets, moving others along a shortest chain of
    // moves if both are full. False, with nothing changed, when no chain is found.
    bool place(const Entry &e);
    // Every change goes through these two, which log what they overwrite for a rollback.
    void write(std::uint32_t bucket, int way, const Entry &e);
    void clear(std::uint32_t bucket, int way);
    void begin();
    void roll_back();
    Result<std::vector<std::uint32_t>> no_place(std::size_t wanted);
    std::vector<std::uint32_t> changed() const;

    std::array<Hash, 2> hash_;
    // calloc'd: pages no rule was ever placed in stay the kernel's shared zero page, so a table
    // without rules (often IPv6) costs no resident memory.
    struct Free {
        void operator()(Bucket *b) const { std::free(b); }
    };
    std::unique_ptr<Bucket[], Free> buckets_;
    std::unordered_map<Key, std::uint32_t, KeyHash> where_; // key -> bucket * WAYS + way
    // The change in progress: each changed bucket's contents before its first change, and
    // each moved or removed key's location before (none: it was not held).
    std::map<std::uint32_t, Bucket> old_buckets_;
    std::unordered_map<Key, std::optional<std::uint32_t>, KeyHash> old_where_;
};

using Exact4Table = ExactTable<Exact4>;
using Exact6Table = ExactTable<Exact6>;

extern template class ExactTable<Exact4>;
extern template class ExactTable<Exact6>;

} // namespace knod::bpf
