// How long each caller string may be. Checked before anything parses, copies or echoes it, so
// no request makes the daemon allocate much, and no reply (an error quotes at most a short,
// escaped prefix of the input) comes near the bus's message limit. The D-Bus docs list these.
#pragma once

#include "knod/result.h"
#include "knod/untrusted.h"

#include <net/if.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace knod::daemon::limits {

constexpr std::size_t netdev = IFNAMSIZ - 1; // the kernel's own limit on interface names
constexpr std::size_t gpu = 256;             // a PCI address, a DRM node path, or a name
constexpr std::size_t mode = 16;             // "rx-only", "tx", "rx-tx"
constexpr std::size_t flow = 256;            // "udp [v6 prefix]:port-port -> [v6 prefix]:port" fits
constexpr std::size_t binding_id = 64;       // ids are 17 characters
constexpr std::size_t reason = 1024;         // RevokeBinding's free text
constexpr std::size_t key = 1024;            // keys are 32 bytes
// Every D-Bus error message is cut to this (the bus drops a connection that sends a message
// over its limit; the reference bus's default is 32 MiB on the system bus).
constexpr std::size_t error_message = 4096;

// InvalidArgument naming the argument and quoting a short prefix, if `value` is too long.
inline Result<void> check_length(std::string_view argument, std::string_view value,
                                 std::size_t max) {
    if (value.size() <= max) return {};
    return make_error(Errc::invalid_argument, std::string(argument) + ": at most " +
                                                  std::to_string(max) + " bytes, got " +
                                                  quote_untrusted(value, 32));
}

} // namespace knod::daemon::limits
