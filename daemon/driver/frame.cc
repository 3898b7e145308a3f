#include "daemon/driver/frame.h"

#include <cstring>

namespace knod::driver {
namespace {

std::uint16_t be16(const std::uint8_t *p) {
    return static_cast<std::uint16_t>(p[0] << 8 | p[1]);
}

} // namespace

std::optional<Frame> parse_frame(std::span<const std::uint8_t> f) {
    std::size_t at = 14;
    if (f.size() < at) return std::nullopt;
    std::uint16_t type = be16(&f[12]);
    if (type == 0x8100 || type == 0x88a8) {
        if (f.size() < at + 4) return std::nullopt;
        type = be16(&f[at + 2]);
        at += 4;
    }
    Frame out;
    std::uint8_t proto = 0;
    std::size_t end = f.size();
    if (type == 0x0800) {
        if (f.size() < at + 20) return std::nullopt;
        std::size_t ihl = (f[at] & 0x0f) * 4u;
        std::size_t total = be16(&f[at + 2]);
        if (ihl < 20 || f.size() < at + ihl || total < ihl) return std::nullopt;
        end = std::min(end, at + total);
        proto = f[at + 9];
        out.tuple.family = policy::Family::ipv4;
        std::memcpy(out.tuple.src.data(), &f[at + 12], 4);
        std::memcpy(out.tuple.dst.data(), &f[at + 16], 4);
        at += ihl;
    } else if (type == 0x86dd) {
        if (f.size() < at + 40) return std::nullopt;
        end = std::min(end, at + 40 + be16(&f[at + 4]));
        proto = f[at + 6];
        out.tuple.family = policy::Family::ipv6;
        std::memcpy(out.tuple.src.data(), &f[at + 8], 16);
        std::memcpy(out.tuple.dst.data(), &f[at + 24], 16);
        at += 40;
        for (int i = 0; i < 4 && (proto == 0 || proto == 43 || proto == 60); ++i) {
            if (f.size() < at + 2) return std::nullopt;
            proto = f[at];
            at += (f[at + 1] + 1u) * 8u;
        }
    } else {
        return std::nullopt;
    }
    if (proto == 17) {
        if (end < at + 8) return std::nullopt;
        out.tuple.protocol = policy::Protocol::udp;
        out.tuple.src_port = be16(&f[at]);
        out.tuple.dst_port = be16(&f[at + 2]);
        at += 8;
    } else if (proto == 6) {
        if (end < at + 20) return std::nullopt;
        out.tuple.protocol = policy::Protocol::tcp;
        out.tuple.src_port = be16(&f[at]);
        out.tuple.dst_port = be16(&f[at + 2]);
        at += (f[at + 12] >> 4) * 4u;
        if (end < at) return std::nullopt;
    } else {
        return std::nullopt;
    }
    out.payload = f.subspan(at, end - at);
    return out;
}

} // namespace knod::driver
