// SHA-256 as lowercase hex: the digest that names a policy text (policy/, the journal's
// policies table). Users link OpenSSL::Crypto.
#pragma once

#include "knod/hex.h"

#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace knod {

inline std::string sha256_hex(std::string_view data) {
    std::array<std::uint8_t, 32> out{};
    unsigned int len = 0;
    EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
    return to_hex(out);
}

} // namespace knod
