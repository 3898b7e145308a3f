// libFuzzer target: any bytes as a flow spec. Parsing never crashes, errors point inside the
// text, and an accepted spec round-trips through its canonical text.
#include "policy/flow_spec.h"

#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    auto parsed = knod::policy::parse_flow_spec_at(text);
    if (!parsed.ok) {
        if (parsed.error.offset > size) std::abort();
        return 0;
    }
    auto again = knod::policy::parse_flow_spec_at(parsed.spec.to_string());
    if (!again.ok || !(again.spec == parsed.spec)) std::abort();
    if (!parsed.spec.contains(parsed.spec) || !parsed.spec.overlaps(parsed.spec)) std::abort();
    return 0;
}
