// Crafts Ethernet frames for the filter's tests and benchmarks: IPv4/IPv6, VLAN tags, TCP/UDP,
// fragments, and truncation at any length. Header-only; nothing in the daemon uses it.
#pragma once

#include <arpa/inet.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace knod::bpf::packets {

struct PacketSpec {
    bool ipv6 = false;
    std::string src = "10.0.1.1";
    std::string dst = "10.1.2.3";
    std::uint8_t protocol = 17; // UDP
    std::uint16_t sport = 40000;
    std::uint16_t dport = 5000;
    std::vector<std::uint16_t> vlans; // TPIDs, outermost first: 0x8100 or 0x88a8
    std::uint16_t ipv4_frag = 0;      // host-order frag_off field (flags + offset)
    std::uint8_t ipv4_ihl = 5;
    std::vector<std::uint8_t> ipv6_ext; // extension header types to insert before L4
    std::size_t payload = 32;
    std::size_t truncate = 0;    // cut the frame to this many bytes (0: keep)
    std::uint16_t ethertype = 0; // override (e.g. ARP)
};

inline std::vector<std::uint8_t> build_packet(const PacketSpec &s) {
    std::vector<std::uint8_t> p(12, 0);
    p[0] = 0x02; // dst MAC
    p[6] = 0x02; // src MAC
    auto put16 = [&](std::uint16_t v) {
        p.push_back(static_cast<std::uint8_t>(v >> 8));
        p.push_back(static_cast<std::uint8_t>(v));
    };
    for (auto tpid : s.vlans) {
        put16(tpid);
        put16(42); // TCI
    }
    put16(s.ethertype ? s.ethertype : (s.ipv6 ? 0x86dd : 0x0800));
    std::vector<std::uint8_t> l4;
    auto l4_16 = [&](std::uint16_t v) {
        l4.push_back(static_cast<std::uint8_t>(v >> 8));
        l4.push_back(static_cast<std::uint8_t>(v));
    };
    l4_16(s.sport);
    l4_16(s.dport);
    if (s.protocol == 6) {
        for (int i = 0; i < 8; ++i)
            l4.push_back(0); // seq, ack
        l4.push_back(0x50);  // doff 5
        for (int i = 0; i < 7; ++i)
            l4.push_back(0);
    } else {
        l4_16(static_cast<std::uint16_t>(8 + s.payload));
        l4_16(0);
    }
    l4.insert(l4.end(), s.payload, 0xab);
    if (!s.ipv6) {
        std::size_t ihl_bytes = s.ipv4_ihl * 4u;
        std::vector<std::uint8_t> ip(ihl_bytes < 20 ? 20 : ihl_bytes, 0);
        ip[0] = static_cast<std::uint8_t>(0x40 | (s.ipv4_ihl & 0x0f));
        std::uint16_t total = static_cast<std::uint16_t>(ip.size() + l4.size());
        ip[2] = static_cast<std::uint8_t>(total >> 8);
        ip[3] = static_cast<std::uint8_t>(total);
        ip[6] = static_cast<std::uint8_t>(s.ipv4_frag >> 8);
        ip[7] = static_cast<std::uint8_t>(s.ipv4_frag);
        ip[8] = 64;
        ip[9] = s.protocol;
        inet_pton(AF_INET, s.src.c_str(), &ip[12]);
        inet_pton(AF_INET, s.dst.c_str(), &ip[16]);
        p.insert(p.end(), ip.begin(), ip.end());
    } else {
        std::vector<std::uint8_t> ip(40, 0);
        ip[0] = 0x60;
        std::vector<std::uint8_t> ext;
        std::uint8_t first = s.ipv6_ext.empty() ? s.protocol : s.ipv6_ext[0];
        for (std::size_t i = 0; i < s.ipv6_ext.size(); ++i) {
            std::uint8_t next = i + 1 < s.ipv6_ext.size() ? s.ipv6_ext[i + 1] : s.protocol;
            std::vector<std::uint8_t> h(8, 0);
            h[0] = next;
            if (s.ipv6_ext[i] == 44) h[3] = 8; // fragment header: offset 1 (in 8-byte units)
            ext.insert(ext.end(), h.begin(), h.end());
        }
        std::uint16_t plen = static_cast<std::uint16_t>(ext.size() + l4.size());
        ip[4] = static_cast<std::uint8_t>(plen >> 8);
        ip[5] = static_cast<std::uint8_t>(plen);
        ip[6] = first;
        ip[7] = 64;
        inet_pton(AF_INET6, s.src.c_str(), &ip[8]);
        inet_pton(AF_INET6, s.dst.c_str(), &ip[24]);
        p.insert(p.end(), ip.begin(), ip.end());
        p.insert(p.end(), ext.begin(), ext.end());
    }
    p.insert(p.end(), l4.begin(), l4.end());
    if (s.truncate && s.truncate < p.size()) p.resize(s.truncate);
    return p;
}

// A packet of one flow (UDP unless PROTO says otherwise); `with` changes one field of it.
inline PacketSpec v4(const char *src, std::uint16_t sport, const char *dst, std::uint16_t dport,
                     std::uint8_t proto = 17) {
    PacketSpec p;
    p.src = src;
    p.sport = sport;
    p.dst = dst;
    p.dport = dport;
    p.protocol = proto;
    return p;
}

inline PacketSpec v6(const char *src, std::uint16_t sport, const char *dst, std::uint16_t dport,
                     std::uint8_t proto = 6) {
    PacketSpec p = v4(src, sport, dst, dport, proto);
    p.ipv6 = true;
    return p;
}

template <typename F> PacketSpec with(PacketSpec p, F f) {
    f(p);
    return p;
}

} // namespace knod::bpf::packets
