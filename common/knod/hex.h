// Lower-case hex text of a byte string, for ids and hashes shown to people.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace knod {

inline std::string to_hex(std::span<const std::uint8_t> bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (auto b : bytes) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

} // namespace knod
