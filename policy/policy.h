// The policy model: settings and an ordered list of rules. Default deny: a request no rule
// allows is refused. Pure data; the parser builds it and the engine reads it.
#pragma once

#include "policy/flow_spec.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace knod::policy {

enum class Mode { rx_only, tx, rx_tx };
enum class IommuRequirement { translated, passthrough_ok, any };
enum class Action { allow, deny };
enum class UnmatchedTraffic { pass, drop };

const char *to_string(Mode m);
const char *to_string(IommuRequirement r);
const char *to_string(Action a);
std::optional<Mode> parse_mode(std::string_view text);
std::optional<IommuRequirement> parse_iommu(std::string_view text);

// Where a rule came from, for messages: "policy.d/10-ml.toml:12:1".
struct SourceLocation {
    std::string file;
    std::uint32_t line = 0;
    std::uint32_t column = 0;
    std::string to_string() const;
};

// A user or group named either by number or by name; the caller's identity carries both.
struct Principal {
    std::optional<std::uint32_t> id;
    std::string name;
    std::string to_string() const { return id ? std::to_string(*id) : name; }
    friend bool operator==(const Principal &, const Principal &) = default;
};

// Pod annotations the policy may match carry this prefix; the CNI plugin passes no others.
inline constexpr const char *pod_annotation_prefix = "knod.io/";

struct Rule {
    std::string name;
    SourceLocation where;
    Action action = Action::allow;

    // Who: every listed condition must hold; an empty list means "anyone". The parser refuses
    // a rule with all of them empty unless it says `any_caller = true`.
    std::vector<Principal> users;
    std::vector<Principal> groups;        // primary or supplementary
    std::vector<std::string> units;       // globs on the caller's system-manager unit
    std::vector<std::string> user_units;  // globs on its unit under the user's own manager
    std::vector<std::string> cgroups;     // globs on the caller's cgroup path
    std::vector<std::string> executables; // globs on the caller's executable path
    // Kubernetes: the caller's pod (policy::PodIdentity); a caller in no registered pod matches
    // no rule that sets one of these.
    std::vector<std::string> k8s_namespaces;            // globs on the pod's namespace
    std::vector<std::string> k8s_pods;                  // globs on the pod's name
    std::map<std::string, std::string> k8s_annotations; // each key = value, exactly

    // What: a request must fall inside all of these for the rule to match it.
    std::vector<std::string> netdevs; // globs; empty means any
    std::vector<std::string> gpus;    // globs on any of the GPU's names; empty means any
    std::vector<Mode> modes{Mode::rx_only};
    std::optional<std::uint64_t> max_region_bytes; // required for allow rules
    std::vector<FlowSpec> flows;                   // allow: required; deny: empty means any

    // Limits applied once the rule has allowed a request.
    std::optional<std::uint32_t> max_bindings_per_uid;
    std::optional<std::uint64_t> max_total_bytes_per_uid;
    IommuRequirement iommu = IommuRequirement::translated;
    std::chrono::seconds key_lifetime{3600};
};

struct Settings {
    bool permissive = false; // grant what would be denied, and record that it would have been
    std::string auditor_group = "knod-audit";
    std::string admin_group; // empty: only root (and polkit) may administer
    UnmatchedTraffic unmatched_traffic = UnmatchedTraffic::pass;
};

struct Policy {
    Settings settings;
    std::vector<Rule> rules;
    std::vector<std::string> files;        // the files it was read from, in order
    std::vector<std::string> file_digests; // SHA-256 of each file's bytes, as `files`
    // What it was loaded from, in one canonical text: for each file in load order,
    // "# file: PATH\n" then the file's bytes, then "\n" if they are not empty and do not end
    // with one. The journal stores it once per digest, so an auditor can read the exact policy
    // that decided.
    std::string text;
    std::string digest; // SHA-256 of `text`, 64 lowercase hex digits (policy_digest())
};

// The digest that names a policy text everywhere (events' "policy", the policies table).
std::string policy_digest(std::string_view text);

} // namespace knod::policy
