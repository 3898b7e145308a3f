// Turns bindings' flow specs into the filter's map entries: exact 5-tuples go to the exact tables
// (one per family); everything else goes into destination-prefix buckets for the LPM tries, each
// bucket holding every rule that covers its prefix, most specific first. Pure: no BPF syscalls.
//
// compile_rules() does it from scratch for every binding at once; RuleSet keeps the same result
// up to date one binding at a time, at the cost of that binding's flows (docs/flow-filter.md).
#pragma once

#include "bpf/flow_filter_abi.h"
#include "knod/result.h"
#include "policy/flow_spec.h"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace knod::bpf {

template <typename Key> struct BucketEntry {
    Key key; // prefixlen already includes the 32 leading bits; generation 0 (the loader sets it)
    knod_bucket bucket;
};

struct CompiledRules {
    std::vector<knod_exact4_entry> exact4; // placed into buckets by Exact4Table
    std::vector<knod_exact6_entry> exact6; // ... and Exact6Table
    std::vector<BucketEntry<knod_lpm4_key>> buckets4;
    std::vector<BucketEntry<knod_lpm6_key>> buckets6;
};

// True when a spec names one protocol, one host each side and one port each side.
bool is_exact(const policy::FlowSpec &f);

// Fails when one destination prefix would be covered by more than KNOD_BUCKET_RULES rules,
// or when two bindings claim the same exact 5-tuple.
Result<CompiledRules>
compile_rules(const std::map<std::uint32_t, std::vector<policy::FlowSpec>> &flows);

// A bucket's destination prefix (host bits cleared). Ordered by family, then address, then
// length, so the buckets inside one prefix are one contiguous range.
struct Destination {
    policy::Family family = policy::Family::ipv4;
    std::array<std::uint8_t, 16> addr{};
    std::uint8_t length = 0;
    auto operator<=>(const Destination &) const = default;
};

// What one RuleSet::set changed: the exact keys (as exact_key_bytes gives them) and the buckets
// whose contents differ, added, changed or gone. The loader rewrites these in each generation.
struct RuleChange {
    std::vector<std::string> exact;
    std::vector<Destination> buckets;
};

// Every binding's flows, compiled, kept equal to compile_rules() over all of them. set() costs
// what the binding's old and new flows cost: its exact keys, plus for each prefix rule the
// buckets inside the rule's destination (a /0 rule touches every bucket of its family: inherent,
// since each bucket lists every rule that covers it). A refused set() changes nothing.
class RuleSet {
  public:
    // Replaces slot's flows (empty removes them). Refused, with compile_rules's error, when an
    // exact flow is another binding's or a destination prefix would hold too many rules.
    Result<RuleChange> set(std::uint32_t slot, const std::vector<policy::FlowSpec> &flows);
    // Reverts the last successful set() (the loader could not publish it).
    void undo();

    // The exact entry for a key from RuleChange, or none (gone). First byte '4' or '6'.
    std::optional<knod_exact4_entry> exact4(const std::string &key) const;
    std::optional<knod_exact6_entry> exact6(const std::string &key) const;
    // The entry a key names, slot 0 (what a removal needs).
    static knod_exact4_entry exact4_of(const std::string &key);
    static knod_exact6_entry exact6_of(const std::string &key);
    // A bucket's contents, or none (gone).
    std::optional<knod_bucket> bucket(const Destination &d) const;
    std::size_t bucket_count(policy::Family f) const;

    // Everything, as compile_rules gives it, sorted by key (for tests and full rewrites).
    CompiledRules compiled() const;

  private:
    struct RuleId {
        std::uint32_t slot, index; // the spec's place in its binding's list
        auto operator<=>(const RuleId &) const = default;
    };
    struct Member {
        std::uint64_t specificity;
        RuleId id;
        knod_rule rule;
    };
    struct Claim {
        std::uint32_t slot, index; // the binding and its first listing of the flow
    };
    struct Undo {
        std::uint32_t slot = 0;
        std::optional<std::vector<policy::FlowSpec>> flows;
        std::map<std::string, std::optional<Claim>> claims;
        std::map<Destination, std::optional<std::vector<RuleId>>> rules_at;
        std::map<Destination, std::optional<std::vector<Member>>> buckets;
    };
    Result<void> check_claims(std::uint32_t slot, const std::vector<policy::FlowSpec> &flows,
                              const std::map<std::string, std::uint32_t> &keys) const;
    std::vector<Destination> inside(const Destination &d) const;
    std::vector<Member> covering(const Destination &d, std::uint32_t skip_slot) const;
    static knod_bucket to_bucket(const std::vector<Member> &members);

    std::map<std::uint32_t, std::vector<policy::FlowSpec>> flows_;
    std::unordered_map<std::string, Claim> claims_;       // exact key -> its binding
    std::map<Destination, std::vector<RuleId>> rules_at_; // prefix rules by destination
    std::map<Destination, std::vector<Member>> buckets_;  // most specific first
    std::array<std::size_t, 2> bucket_count_{};           // IPv4, IPv6
    std::optional<Undo> undo_;
};

} // namespace knod::bpf
