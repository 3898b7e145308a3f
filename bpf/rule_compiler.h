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

// Keys without the generation bit: the loader adds it when it writes a generation.
struct ExactEntry {
    knod_exact_key key; // generation left 0
    std::uint32_t slot;
};

struct BucketEntry {
    knod_lpm_key key; // generation left 0; prefixlen already includes the 32 leading bits
    knod_bucket bucket;
};

struct CompiledRules {
    std::vector<ExactEntry> exact;
    std::vector<BucketEntry> buckets;
};

// True when a spec names one protocol, one host each side and one port each side.
bool is_exact(const policy::FlowSpec &f);

// Fails when one destination prefix would be covered by more than KNOD_BUCKET_RULES rules,
// or when two bindings claim the same exact 5-tuple.
Result<CompiledRules>
compile_rules(const std::map<std::uint32_t, std::vector<policy::FlowSpec>> &flows);

// Stable byte strings for keys, so the loader can diff generations.
std::string key_bytes(const knod_exact_key &k);
std::string key_bytes(const knod_lpm_key &k);

} // namespace knod::bpf
