// The export's fast path: recognises JSON text that is already in the exact form the daemon
// writes (nlohmann's compact dump) without building a DOM, and reads the few top-level members
// an export lifts out of an event's detail. Anything it is not sure of is "not recognised"
// (nullopt), and the caller takes the slow, general path (nlohmann parse + dump), so the fast
// path can only ever be narrower, never different.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace knod::journal {

struct CompactObject {
    // Top-level string members "netdev" and "gpu", and "flows" when it is an array of strings.
    std::optional<std::string> netdev, gpu;
    std::optional<std::vector<std::string>> flows;
};

// `text` is a JSON object that nlohmann::ordered_json would parse and dump (compact, no
// ensure_ascii) back to exactly `text`, and it is printable ASCII: no whitespace between
// tokens; strings of bytes 0x20-0x7e with no escape but \" and \\; integers of at most 18
// digits without a leading zero or "-0"; no repeated key in any object; nesting below 64.
// A top-level "flows" that is not an array of strings (an older daemon's JSON-encoded string)
// is also not recognised: the general path decodes it.
std::optional<CompactObject> scan_compact_object(std::string_view text);

// The same for a JSON array of strings (the sessions.flows column).
std::optional<std::vector<std::string>> scan_compact_string_array(std::string_view text);

} // namespace knod::journal
