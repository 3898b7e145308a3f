// Flow specifications: which packets a binding may receive.
//
//   udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100
//   tcp [fd00::/8]:* -> [fd00::1]:443
//   any * -> *:9000
//
// PROTO SRC -> DST, where PROTO is udp, tcp or any, and each endpoint is `*` (any address, any
// port) or ADDRESS[:PORTS]. ADDRESS is `*`, an IPv4 prefix, or an IPv6 prefix in brackets; a
// prefix without /LEN is a host. PORTS is `*`, N, or LO-HI. Host bits beyond /LEN are an error,
// so a spec always means what it says.
#pragma once

#include "knod/result.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace knod::policy {

enum class Protocol : std::uint8_t { any = 0, tcp = 6, udp = 17 };

enum class Family : std::uint8_t { any = 0, ipv4 = 4, ipv6 = 6 };

struct Prefix {
    Family family = Family::any;
    std::array<std::uint8_t, 16> addr{}; // IPv4 uses the first 4 bytes
    std::uint8_t length = 0;             // bits; ignored when family is any

    bool contains(const Prefix &other) const;
    bool overlaps(const Prefix &other) const;
    bool matches(Family f, const std::uint8_t *address) const;
    std::string to_string() const;
    friend bool operator==(const Prefix &, const Prefix &) = default;
};

struct PortRange {
    std::uint16_t lo = 0;
    std::uint16_t hi = 65535;

    bool any() const { return lo == 0 && hi == 65535; }
    bool contains(const PortRange &o) const { return lo <= o.lo && o.hi <= hi; }
    bool overlaps(const PortRange &o) const { return lo <= o.hi && o.lo <= hi; }
    std::string to_string() const;
    friend bool operator==(const PortRange &, const PortRange &) = default;
};

struct Endpoint {
    Prefix prefix;
    PortRange ports;

    bool contains(const Endpoint &o) const {
        return prefix.contains(o.prefix) && ports.contains(o.ports);
    }
    bool overlaps(const Endpoint &o) const {
        return prefix.overlaps(o.prefix) && ports.overlaps(o.ports);
    }
    std::string to_string() const;
    friend bool operator==(const Endpoint &, const Endpoint &) = default;
};

// One packet's identity as the filter sees it.
struct FiveTuple {
    Protocol protocol = Protocol::any;
    Family family = Family::ipv4;
    std::array<std::uint8_t, 16> src{};
    std::array<std::uint8_t, 16> dst{};
    std::uint16_t src_port = 0;
    std::uint16_t dst_port = 0;
};

struct FlowSpec {
    Protocol protocol = Protocol::any;
    Endpoint src;
    Endpoint dst;

    Family family() const;
    // Every packet this spec matches is matched by *this: a granted spec contains a requested one.
    bool contains(const FlowSpec &other) const;
    bool overlaps(const FlowSpec &other) const;
    bool matches(const FiveTuple &packet) const;
    // Canonical text; parse(to_string()) gives back an equal spec.
    std::string to_string() const;
    friend bool operator==(const FlowSpec &, const FlowSpec &) = default;
};

// Where in the spec text a parse error was found (0-based byte offset), so that callers
// embedding the spec in a file can point at the exact column.
struct FlowSpecError {
    std::size_t offset = 0;
    std::string message;
};

struct FlowSpecParse {
    bool ok = false;
    FlowSpec spec;
    FlowSpecError error;
};

FlowSpecParse parse_flow_spec_at(std::string_view text);
Result<FlowSpec> parse_flow_spec(std::string_view text);

} // namespace knod::policy
