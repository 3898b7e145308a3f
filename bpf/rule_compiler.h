// Turns bindings' flow specs into the filter's map entries: exact 5-tuples go to the hash map;
// everything else goes into destination-prefix buckets for the LPM trie, each bucket holding
// every rule that covers its prefix, most specific first. Pure: no BPF syscalls here.
#pragma once

#include "bpf/flow_filter_abi.h"
#include "knod/result.h"
#include "policy/flow_spec.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace knod::bpf {

// IPv6 keys without the generation bit: the loader adds it when it writes a generation.
template <typename Key> struct ExactEntry {
    Key key;
    std::uint32_t slot;
};

template <typename Key> struct BucketEntry {
    Key key; // prefixlen already includes the 32 leading bits
    knod_bucket bucket;
};

struct CompiledRules {
    std::vector<knod_exact4_entry> exact4; // placed into buckets by Exact4Table
    std::vector<ExactEntry<knod_exact6_key>> exact6;
    std::vector<BucketEntry<knod_lpm4_key>> buckets4;
    std::vector<BucketEntry<knod_lpm6_key>> buckets6;
};

// True when a spec names one protocol, one host each side and one port each side.
bool is_exact(const policy::FlowSpec &f);

// Fails when one destination prefix would be covered by more than KNOD_BUCKET_RULES rules,
// or when two bindings claim the same exact 5-tuple.
Result<CompiledRules>
compile_rules(const std::map<std::uint32_t, std::vector<policy::FlowSpec>> &flows);

// Stable byte strings for keys, so the loader can diff generations.
template <typename Key> std::string key_bytes(const Key &k) {
    return std::string(reinterpret_cast<const char *>(&k), sizeof k);
}

} // namespace knod::bpf
