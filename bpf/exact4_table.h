// One generation of the filter's IPv4 exact-rule table, kept by the loader exactly as the BPF
// program reads it (layout and hash in flow_filter_abi.h): KNOD_EXACT4_BUCKETS buckets of
// KNOD_EXACT4_WAYS entries, every entry in one of the two buckets its hashes choose. Placement
// moves entries between their two buckets when both are full (a cuckoo-style search), so the
// table fills to well over 90 % before a rule finds no place. Pure: no BPF syscalls here.
#pragma once

#include "bpf/flow_filter_abi.h"
#include "knod/result.h"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

namespace knod::bpf {

// An exact IPv4 rule as the table stores it (see knod_exact4_entry for the word order).
knod_exact4_entry make_exact4_entry(std::uint8_t protocol, std::uint16_t src_port,
                                    std::uint16_t dst_port, const std::uint8_t (&src)[4],
                                    const std::uint8_t (&dst)[4], std::uint32_t slot);
std::uint8_t exact4_protocol(const knod_exact4_entry &e);
std::uint32_t exact4_slot(const knod_exact4_entry &e);

class Exact4Table {
  public:
    static constexpr std::uint32_t capacity = KNOD_EXACT4_BUCKETS * KNOD_EXACT4_WAYS;

    explicit Exact4Table(const std::array<knod_exact4_hash, 2> &hash);

    // Makes the table hold exactly `entries`, moving as little as it can, in time that grows with
    // the rules held and changed, not with the table. Returns the buckets it changed, in order.
    // When an entry finds no place the table is left as it was.
    Result<std::vector<std::uint32_t>> assign(const std::vector<knod_exact4_entry> &entries);

    // The lookup the BPF program does: the slot of the matching entry, if any.
    std::optional<std::uint32_t> find(std::uint32_t ports, std::uint32_t src, std::uint32_t dst,
                                      std::uint8_t protocol) const;

    const knod_exact4_bucket &bucket(std::uint32_t i) const { return buckets_[i]; }
    std::size_t size() const { return where_.size(); }

  private:
    // What an entry is matched on: its words and protocol, not its slot.
    struct Key {
        std::uint32_t ports, src, dst;
        std::uint8_t protocol;
        bool operator==(const Key &) const = default;
    };
    struct KeyHash {
        std::size_t operator()(const Key &k) const;
    };
    static Key key_of(const knod_exact4_entry &e);

    std::array<std::uint32_t, 2> buckets_of(const knod_exact4_entry &e) const;
    // Puts `e` into a free way of one of its buckets, moving others along a shortest chain of
    // moves if both are full. False, with nothing changed, when no chain is found.
    bool place(const knod_exact4_entry &e);
    // Every change goes through these two, which log what they overwrite for a rollback.
    void write(std::uint32_t bucket, int way, const knod_exact4_entry &e);
    void clear(std::uint32_t bucket, int way);
    void roll_back();

    std::array<knod_exact4_hash, 2> hash_;
    std::vector<knod_exact4_bucket> buckets_;
    std::unordered_map<Key, std::uint32_t, KeyHash> where_; // key -> bucket * WAYS + way
    // The assignment in progress: each changed bucket's contents before its first change, and
    // each moved or removed key's location before (none: it was not held).
    std::map<std::uint32_t, knod_exact4_bucket> old_buckets_;
    std::unordered_map<Key, std::optional<std::uint32_t>, KeyHash> old_where_;
};

} // namespace knod::bpf
