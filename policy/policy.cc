#include "policy/policy.h"

#include "knod/sha256.h"

namespace knod::policy {

const char *to_string(Mode m) {
    switch (m) {
    case Mode::rx_only:
        return "rx-only";
    case Mode::tx:
        return "tx";
    case Mode::rx_tx:
        return "rx-tx";
    }
    return "?";
}

const char *to_string(IommuRequirement r) {
    switch (r) {
    case IommuRequirement::translated:
        return "translated";
    case IommuRequirement::passthrough_ok:
        return "passthrough-ok";
    case IommuRequirement::any:
        return "any";
    }
    return "?";
}

const char *to_string(Action a) {
    return a == Action::allow ? "allow" : "deny";
}

std::string policy_digest(std::string_view text) {
    return sha256_hex(text);
}

std::optional<Mode> parse_mode(std::string_view t) {
    if (t == "rx-only") return Mode::rx_only;
    if (t == "tx") return Mode::tx;
    if (t == "rx-tx") return Mode::rx_tx;
    return std::nullopt;
}

std::optional<IommuRequirement> parse_iommu(std::string_view t) {
    if (t == "translated") return IommuRequirement::translated;
    if (t == "passthrough-ok") return IommuRequirement::passthrough_ok;
    if (t == "any") return IommuRequirement::any;
    return std::nullopt;
}

} // namespace knod::policy
