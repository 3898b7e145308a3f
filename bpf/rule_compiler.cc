#include "bpf/rule_compiler.h"

#include "bpf/exact4_table.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace knod::bpf {
namespace {

using policy::Family;
using policy::FlowSpec;
using policy::Prefix;

int width(Family f) {
    return f == Family::ipv4 ? 32 : 128;
}

struct PrefixRule {
    std::uint32_t slot;
    FlowSpec spec;
};

// A destination prefix of one family; an any-family destination is the /0 of each family.
struct Dst {
    Family family;
    std::array<std::uint8_t, 16> addr{};
    std::uint8_t length = 0;
    bool operator<(const Dst &o) const {
        return std::tie(family, length, addr) < std::tie(o.family, o.length, o.addr);
    }
};

std::vector<Dst> destinations(const FlowSpec &f) {
    const Prefix &p = f.dst.prefix;
    if (p.family == Family::any) {
        // Source family pins it when the destination is open.
        Family fam = f.src.prefix.family;
        std::vector<Dst> out;
        for (Family each : {Family::ipv4, Family::ipv6})
            if (fam == Family::any || fam == each) out.push_back({each, {}, 0});
        return out;
    }
    return {{p.family, p.addr, p.length}};
}

bool covers(const Dst &outer, const Dst &inner) {
    if (outer.family != inner.family || outer.length > inner.length) return false;
    Prefix a{outer.family, outer.addr, outer.length}, b{inner.family, inner.addr, inner.length};
    return a.contains(b);
}

knod_rule to_rule(const PrefixRule &r) {
    knod_rule out{};
    out.slot = r.slot;
    out.protocol = static_cast<std::uint8_t>(r.spec.protocol);
    const Prefix &src = r.spec.src.prefix;
    out.src_len = src.family == Family::any ? 0 : src.length;
    std::memcpy(out.src, src.addr.data(), 16);
    out.src_port_lo = r.spec.src.ports.lo;
    out.src_port_hi = r.spec.src.ports.hi;
    out.dst_port_lo = r.spec.dst.ports.lo;
    out.dst_port_hi = r.spec.dst.ports.hi;
    return out;
}

// Most specific first: longer destination, then longer source, then narrower ports.
std::uint64_t specificity(const FlowSpec &f) {
    auto len = [](const Prefix &p) { return p.family == Family::any ? 0u : p.length + 0u; };
    std::uint64_t ports = (f.src.ports.hi - f.src.ports.lo) + (f.dst.ports.hi - f.dst.ports.lo);
    return (std::uint64_t{len(f.dst.prefix)} << 40) | (std::uint64_t{len(f.src.prefix)} << 32) |
           (0xffffffffu - ports);
}

// The 40-byte key of an exact flow of either family (an IPv4 address fills the first 4 bytes).
knod_exact6_key exact_key(const FlowSpec &f) {
    knod_exact6_key k{};
    k.protocol = static_cast<std::uint8_t>(f.protocol);
    k.src_port = htons(f.src.ports.lo);
    k.dst_port = htons(f.dst.ports.lo);
    std::memcpy(k.src, f.src.prefix.addr.data(), sizeof k.src);
    std::memcpy(k.dst, f.dst.prefix.addr.data(), sizeof k.dst);
    return k;
}

} // namespace

bool is_exact(const FlowSpec &f) {
    auto host = [](const Prefix &p) {
        return p.family != Family::any && p.length == width(p.family);
    };
    return f.protocol != policy::Protocol::any && host(f.src.prefix) && host(f.dst.prefix) &&
           f.src.ports.lo == f.src.ports.hi && f.dst.ports.lo == f.dst.ports.hi;
}

Result<CompiledRules> compile_rules(const std::map<std::uint32_t, std::vector<FlowSpec>> &flows) {
    CompiledRules out;
    std::map<std::string, std::uint32_t> exact_claims; // key bytes -> the binding's slot
    std::vector<PrefixRule> prefix_rules;
    for (auto &[slot, specs] : flows) {
        for (auto &f : specs) {
            if (!is_exact(f)) {
                prefix_rules.push_back({slot, f});
                continue;
            }
            // The IPv4 entry is built from the same key.
            knod_exact6_key k = exact_key(f);
            bool v4 = f.family() == Family::ipv4;
            auto [claim, fresh] = exact_claims.try_emplace((v4 ? "4" : "6") + key_bytes(k), slot);
            if (!fresh) {
                if (claim->second == slot) continue; // listed twice by one binding
                return make_error(Errc::invalid_argument,
                                  "flow '" + f.to_string() + "' is claimed by two bindings");
            }
            if (v4) {
                std::uint8_t src[4], dst[4];
                std::memcpy(src, k.src, 4);
                std::memcpy(dst, k.dst, 4);
                out.exact4.push_back(
                    make_exact4_entry(k.protocol, k.src_port, k.dst_port, src, dst, slot));
            } else {
                out.exact6.push_back({k, slot});
            }
        }
    }
    std::set<Dst> dsts;
    for (auto &r : prefix_rules)
        for (auto &d : destinations(r.spec))
            dsts.insert(d);
    for (auto &d : dsts) {
        std::vector<const PrefixRule *> members;
        for (auto &r : prefix_rules) {
            auto mine = destinations(r.spec);
            if (std::any_of(mine.begin(), mine.end(), [&](const Dst &m) { return covers(m, d); }))
                members.push_back(&r);
        }
        if (members.size() > KNOD_BUCKET_RULES) {
            Prefix p{d.family, d.addr, d.length};
            return make_error(Errc::invalid_argument,
                              std::to_string(members.size()) + " flows cover destination " +
                                  p.to_string() + "; the filter holds at most " +
                                  std::to_string(KNOD_BUCKET_RULES) + " per destination prefix");
        }
        std::stable_sort(members.begin(), members.end(), [](auto *a, auto *b) {
            return specificity(a->spec) > specificity(b->spec);
        });
        knod_bucket bucket{};
        bucket.count = static_cast<std::uint32_t>(members.size());
        for (std::size_t i = 0; i < members.size(); ++i)
            bucket.rules[i] = to_rule(*members[i]);
        if (d.family == Family::ipv4) {
            BucketEntry<knod_lpm4_key> e{};
            e.key.prefixlen = 32u + d.length;
            std::memcpy(e.key.addr, d.addr.data(), 4);
            e.bucket = bucket;
            out.buckets4.push_back(e);
        } else {
            BucketEntry<knod_lpm6_key> e{};
            e.key.prefixlen = 32u + d.length;
            std::memcpy(e.key.addr, d.addr.data(), 16);
            e.bucket = bucket;
            out.buckets6.push_back(e);
        }
    }
    return out;
}

} // namespace knod::bpf
