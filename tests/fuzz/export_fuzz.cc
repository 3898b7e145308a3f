// libFuzzer target: any bytes as a JSON-lines export into `audit verify --export`, with and
// without --allow-gaps. Nothing may crash or read out of bounds; a verdict or an error naming
// the line is the only outcome.
#include "journal/export.h"

#include <cstdint>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
    std::string text(reinterpret_cast<const char *>(data), size);
    for (bool gaps : {false, true}) {
        std::istringstream in(text);
        auto r = knod::journal::verify_export(in, gaps);
        if (r && r->ok && r->bad_line != 0) __builtin_trap(); // ok never names a bad line
    }
    return 0;
}
