#include "bpf/rule_compiler.h"

#include "bpf/exact_table.h"

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

// `d` with the bits past `length` cleared.
Destination masked(Family family, const std::array<std::uint8_t, 16> &addr, unsigned length) {
    Destination d{family, {}, static_cast<std::uint8_t>(length)};
    std::memcpy(d.addr.data(), addr.data(), length / 8);
    if (length % 8)
        d.addr[length / 8] = addr[length / 8] & static_cast<std::uint8_t>(0xff00 >> (length % 8));
    return d;
}

// A flow's destination prefixes; an any-family destination is the /0 of each family.
std::vector<Destination> destinations(const FlowSpec &f) {
    const Prefix &p = f.dst.prefix;
    if (p.family == Family::any) {
        // Source family pins it when the destination is open.
        Family fam = f.src.prefix.family;
        std::vector<Destination> out;
        for (Family each : {Family::ipv4, Family::ipv6})
            if (fam == Family::any || fam == each) out.push_back({each, {}, 0});
        return out;
    }
    return {masked(p.family, p.addr, p.length)};
}

bool covers(const Destination &outer, const Destination &inner) {
    return outer.family == inner.family && outer.length <= inner.length &&
           masked(inner.family, inner.addr, outer.length) == outer;
}

bool covers_any(const std::vector<Destination> &outer, const Destination &inner) {
    return std::any_of(outer.begin(), outer.end(),
                       [&](const Destination &o) { return covers(o, inner); });
}

knod_rule to_rule(std::uint32_t slot, const FlowSpec &spec) {
    knod_rule out{};
    out.slot = slot;
    out.protocol = static_cast<std::uint8_t>(spec.protocol);
    const Prefix &src = spec.src.prefix;
    out.src_len = src.family == Family::any ? 0 : src.length;
    std::memcpy(out.src, src.addr.data(), 16);
    out.src_port_lo = spec.src.ports.lo;
    out.src_port_hi = spec.src.ports.hi;
    out.dst_port_lo = spec.dst.ports.lo;
    out.dst_port_hi = spec.dst.ports.hi;
    return out;
}

// Most specific first: longer destination, then longer source, then narrower ports.
std::uint64_t specificity(const FlowSpec &f) {
    auto len = [](const Prefix &p) { return p.family == Family::any ? 0u : p.length + 0u; };
    std::uint64_t ports = (f.src.ports.hi - f.src.ports.lo) + (f.dst.ports.hi - f.dst.ports.lo);
    return (std::uint64_t{len(f.dst.prefix)} << 40) | (std::uint64_t{len(f.src.prefix)} << 32) |
           (0xffffffffu - ports);
}

// An exact flow's identity: family, protocol, ports (network order), addresses (an IPv4 address
// fills the first 4 bytes). Its bytes key the claims.
struct ExactKey {
    std::uint8_t family;
    std::uint8_t protocol;
    std::uint16_t src_port, dst_port;
    std::uint8_t src[16], dst[16];
};
static_assert(sizeof(ExactKey) == 38);

std::string exact_key(const FlowSpec &f) {
    ExactKey k{};
    k.family = static_cast<std::uint8_t>(f.family());
    k.protocol = static_cast<std::uint8_t>(f.protocol);
    k.src_port = htons(f.src.ports.lo);
    k.dst_port = htons(f.dst.ports.lo);
    std::memcpy(k.src, f.src.prefix.addr.data(), sizeof k.src);
    std::memcpy(k.dst, f.dst.prefix.addr.data(), sizeof k.dst);
    return std::string(reinterpret_cast<const char *>(&k), sizeof k);
}

ExactKey key_of(const std::string &bytes) {
    ExactKey k{};
    std::memcpy(&k, bytes.data(), std::min(bytes.size(), sizeof k));
    return k;
}

knod_exact4_entry exact4_entry(const ExactKey &k, std::uint32_t slot) {
    std::uint8_t src[4], dst[4];
    std::memcpy(src, k.src, 4);
    std::memcpy(dst, k.dst, 4);
    return make_exact4_entry(k.protocol, k.src_port, k.dst_port, src, dst, slot);
}

knod_exact6_entry exact6_entry(const ExactKey &k, std::uint32_t slot) {
    return make_exact6_entry(k.protocol, k.src_port, k.dst_port, k.src, k.dst, slot);
}

std::string claimed_twice(const FlowSpec &f) {
    return "flow '" + f.to_string() + "' is claimed by two bindings";
}

std::string too_many(std::size_t n, const Destination &d) {
    Prefix p{d.family, d.addr, d.length};
    return std::to_string(n) + " flows cover destination " + p.to_string() +
           "; the filter holds at most " + std::to_string(KNOD_BUCKET_RULES) +
           " per destination prefix";
}

template <typename Key> BucketEntry<Key> bucket_entry(const Destination &d, const knod_bucket &b) {
    BucketEntry<Key> e{};
    e.key.prefixlen = 32u + d.length;
    std::memcpy(e.key.addr, d.addr.data(), sizeof e.key.addr);
    e.bucket = b;
    return e;
}

void add_bucket(CompiledRules &out, const Destination &d, const knod_bucket &b) {
    if (d.family == Family::ipv4)
        out.buckets4.push_back(bucket_entry<knod_lpm4_key>(d, b));
    else
        out.buckets6.push_back(bucket_entry<knod_lpm6_key>(d, b));
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
    struct PrefixRule {
        std::uint32_t slot;
        const FlowSpec *spec;
        std::vector<Destination> dsts;
    };
    std::vector<PrefixRule> prefix_rules;
    for (auto &[slot, specs] : flows) {
        for (auto &f : specs) {
            if (!is_exact(f)) {
                prefix_rules.push_back({slot, &f, destinations(f)});
                continue;
            }
            std::string key = exact_key(f);
            auto [claim, fresh] = exact_claims.try_emplace(key, slot);
            if (!fresh) {
                if (claim->second == slot) continue; // listed twice by one binding
                return make_error(Errc::invalid_argument, claimed_twice(f));
            }
            if (f.family() == Family::ipv4)
                out.exact4.push_back(exact4_entry(key_of(key), slot));
            else
                out.exact6.push_back(exact6_entry(key_of(key), slot));
        }
    }
    std::set<Destination> dsts;
    for (auto &r : prefix_rules)
        dsts.insert(r.dsts.begin(), r.dsts.end());
    for (auto &d : dsts) {
        std::vector<const PrefixRule *> members;
        for (auto &r : prefix_rules)
            if (covers_any(r.dsts, d)) members.push_back(&r);
        if (members.size() > KNOD_BUCKET_RULES)
            return make_error(Errc::invalid_argument, too_many(members.size(), d));
        std::stable_sort(members.begin(), members.end(), [](auto *a, auto *b) {
            return specificity(*a->spec) > specificity(*b->spec);
        });
        knod_bucket bucket{};
        bucket.count = static_cast<std::uint32_t>(members.size());
        for (std::size_t i = 0; i < members.size(); ++i)
            bucket.rules[i] = to_rule(members[i]->slot, *members[i]->spec);
        add_bucket(out, d, bucket);
    }
    return out;
}

Result<void> RuleSet::check_claims(std::uint32_t slot, const std::vector<FlowSpec> &flows,
                                   const std::map<std::string, std::uint32_t> &keys) const {
    // compile_rules names the flow it meets second in (slot, index) order: this binding's when
    // a lower slot holds the key, the holder's when a higher one does. The first such position
    // is its error.
    std::optional<std::pair<RuleId, const FlowSpec *>> first;
    for (auto &[key, index] : keys) {
        auto c = claims_.find(key);
        if (c == claims_.end() || c->second.slot == slot) continue;
        RuleId at =
            c->second.slot < slot ? RuleId{slot, index} : RuleId{c->second.slot, c->second.index};
        const FlowSpec *f =
            c->second.slot < slot ? &flows[index] : &flows_.at(c->second.slot)[c->second.index];
        if (!first || at < first->first) first = {at, f};
    }
    if (first) return make_error(Errc::invalid_argument, claimed_twice(*first->second));
    return {};
}

// The buckets inside `d`, `d` itself included if it is one: one range of the ordered map.
std::vector<Destination> RuleSet::inside(const Destination &d) const {
    Destination last = d;
    for (unsigned bit = d.length; bit < 128; ++bit)
        last.addr[bit / 8] |= static_cast<std::uint8_t>(0x80 >> (bit % 8));
    last.length = 255;
    std::vector<Destination> out;
    for (auto it = buckets_.lower_bound(d); it != buckets_.end() && !(last < it->first); ++it)
        if (covers(d, it->first)) out.push_back(it->first);
    return out;
}

// The members a new bucket at `d` gets from the rules held: every rule at a prefix of `d`
// (one lookup per prefix length), but none of `skip_slot`'s.
std::vector<RuleSet::Member> RuleSet::covering(const Destination &d,
                                               std::uint32_t skip_slot) const {
    std::vector<Member> out;
    for (unsigned len = 0; len <= d.length; ++len) {
        auto at = rules_at_.find(masked(d.family, d.addr, len));
        if (at == rules_at_.end()) continue;
        for (const RuleId &id : at->second) {
            if (id.slot == skip_slot) continue;
            const FlowSpec &f = flows_.at(id.slot)[id.index];
            if (std::any_of(out.begin(), out.end(), [&](const Member &m) { return m.id == id; }))
                continue; // an any-family rule is at the /0 of both families, counted once
            out.push_back({specificity(f), id, to_rule(id.slot, f)});
        }
    }
    return out;
}

Result<RuleChange> RuleSet::set(std::uint32_t slot, const std::vector<FlowSpec> &flows) {
    static const std::vector<FlowSpec> none;
    auto held = flows_.find(slot);
    const std::vector<FlowSpec> &old = held == flows_.end() ? none : held->second;

    // Exact flows: the keys this binding held and will hold (first index of each).
    std::map<std::string, std::uint32_t> old_keys, new_keys;
    for (std::uint32_t i = 0; i < old.size(); ++i)
        if (is_exact(old[i])) old_keys.try_emplace(exact_key(old[i]), i);
    for (std::uint32_t i = 0; i < flows.size(); ++i)
        if (is_exact(flows[i])) new_keys.try_emplace(exact_key(flows[i]), i);
    if (auto c = check_claims(slot, flows, new_keys); !c) return c.error();

    // Prefix rules: the destinations whose rule lists change, then every bucket inside them.
    // The new rules by destination (an any-family rule at the /0 of each family it may have).
    std::map<Destination, std::vector<std::uint32_t>> new_at;
    std::set<Destination> touched;
    for (std::uint32_t i = 0; i < old.size(); ++i)
        if (!is_exact(old[i]))
            for (auto &d : destinations(old[i]))
                touched.insert(d);
    for (std::uint32_t i = 0; i < flows.size(); ++i)
        if (!is_exact(flows[i]))
            for (auto &d : destinations(flows[i])) {
                new_at[d].push_back(i);
                touched.insert(d);
            }
    std::map<Destination, std::vector<RuleId>> staged_rules;
    for (auto &d : touched) {
        auto at = rules_at_.find(d);
        std::vector<RuleId> ids;
        if (at != rules_at_.end())
            for (auto &id : at->second)
                if (id.slot != slot) ids.push_back(id);
        if (auto mine = new_at.find(d); mine != new_at.end())
            for (std::uint32_t i : mine->second)
                ids.push_back({slot, i});
        std::sort(ids.begin(), ids.end());
        staged_rules[d] = std::move(ids);
    }
    std::set<Destination> affected(touched.begin(), touched.end());
    for (auto &d : touched)
        for (auto &b : inside(d))
            affected.insert(b);
    std::map<Destination, std::optional<std::vector<Member>>> staged;
    std::optional<Destination> overflow;
    for (auto &b : affected) {
        auto rules = staged_rules.find(b);
        bool exists = rules != staged_rules.end() ? !rules->second.empty() : rules_at_.count(b) > 0;
        if (!exists) {
            if (buckets_.count(b)) staged[b] = std::nullopt;
            continue;
        }
        std::vector<Member> members;
        if (auto it = buckets_.find(b); it != buckets_.end()) {
            for (auto &m : it->second)
                if (m.id.slot != slot) members.push_back(m);
        } else {
            members = covering(b, slot);
        }
        // The new rules covering `b`: those at each of its prefixes, one lookup per length, or
        // a check of each destination of the new rules when there are fewer of those.
        auto add_mine = [&](const std::vector<std::uint32_t> &mine) {
            for (std::uint32_t i : mine)
                members.push_back({specificity(flows[i]), {slot, i}, to_rule(slot, flows[i])});
        };
        if (new_at.size() <= b.length + 1u) {
            for (auto &[d, mine] : new_at)
                if (covers(d, b)) add_mine(mine);
        } else {
            for (unsigned len = 0; len <= b.length; ++len)
                if (auto mine = new_at.find(masked(b.family, b.addr, len)); mine != new_at.end())
                    add_mine(mine->second);
        }
        std::sort(members.begin(), members.end(), [](const Member &x, const Member &y) {
            return x.specificity != y.specificity ? x.specificity > y.specificity : x.id < y.id;
        });
        if (members.size() > KNOD_BUCKET_RULES && (!overflow || b < *overflow)) overflow = b;
        staged[b] = std::move(members);
    }
    if (overflow)
        return make_error(Errc::invalid_argument, too_many(staged[*overflow]->size(), *overflow));

    // Accepted: apply, keeping what it replaces for undo().
    Undo u;
    u.slot = slot;
    if (held != flows_.end()) u.flows = held->second;
    RuleChange change;
    for (auto &[key, index] : old_keys)
        if (!new_keys.count(key)) {
            u.claims[key] = claims_.at(key);
            claims_.erase(key);
            change.exact.push_back(key);
        }
    for (auto &[key, index] : new_keys) {
        auto c = claims_.find(key);
        u.claims[key] = c == claims_.end() ? std::nullopt : std::optional<Claim>(c->second);
        if (c == claims_.end()) change.exact.push_back(key);
        claims_[key] = {slot, index};
    }
    for (auto &[d, ids] : staged_rules) {
        auto at = rules_at_.find(d);
        u.rules_at[d] =
            at == rules_at_.end() ? std::nullopt : std::optional<std::vector<RuleId>>(at->second);
        if (ids.empty())
            rules_at_.erase(d);
        else
            rules_at_[d] = std::move(ids);
    }
    for (auto &[b, members] : staged) {
        auto at = buckets_.find(b);
        std::size_t fam = b.family == Family::ipv4 ? 0 : 1;
        u.buckets[b] =
            at == buckets_.end() ? std::nullopt : std::optional<std::vector<Member>>(at->second);
        if (at != buckets_.end() && members) {
            knod_bucket was = to_bucket(at->second), now = to_bucket(*members);
            if (std::memcmp(&was, &now, sizeof was) != 0) change.buckets.push_back(b);
            at->second = std::move(*members);
        } else if (members) {
            change.buckets.push_back(b);
            buckets_[b] = std::move(*members);
            ++bucket_count_[fam];
        } else {
            change.buckets.push_back(b);
            buckets_.erase(at);
            --bucket_count_[fam];
        }
    }
    if (flows.empty())
        flows_.erase(slot);
    else
        flows_[slot] = flows;
    undo_ = std::move(u);
    return change;
}

void RuleSet::undo() {
    if (!undo_) return;
    Undo u = std::move(*undo_);
    undo_.reset();
    if (u.flows)
        flows_[u.slot] = *u.flows;
    else
        flows_.erase(u.slot);
    for (auto &[key, claim] : u.claims)
        if (claim)
            claims_[key] = *claim;
        else
            claims_.erase(key);
    for (auto &[d, ids] : u.rules_at)
        if (ids)
            rules_at_[d] = *ids;
        else
            rules_at_.erase(d);
    for (auto &[b, members] : u.buckets) {
        std::size_t fam = b.family == Family::ipv4 ? 0 : 1;
        bool had = buckets_.count(b) > 0;
        if (members) {
            buckets_[b] = *members;
            bucket_count_[fam] += !had;
        } else if (had) {
            buckets_.erase(b);
            --bucket_count_[fam];
        }
    }
}

std::optional<knod_exact4_entry> RuleSet::exact4(const std::string &key) const {
    auto c = claims_.find(key);
    if (c == claims_.end()) return std::nullopt;
    return exact4_entry(key_of(key), c->second.slot);
}

std::optional<knod_exact6_entry> RuleSet::exact6(const std::string &key) const {
    auto c = claims_.find(key);
    if (c == claims_.end()) return std::nullopt;
    return exact6_entry(key_of(key), c->second.slot);
}

knod_exact4_entry RuleSet::exact4_of(const std::string &key) {
    return exact4_entry(key_of(key), 0);
}

knod_exact6_entry RuleSet::exact6_of(const std::string &key) {
    return exact6_entry(key_of(key), 0);
}

std::optional<knod_bucket> RuleSet::bucket(const Destination &d) const {
    auto at = buckets_.find(d);
    if (at == buckets_.end()) return std::nullopt;
    return to_bucket(at->second);
}

std::size_t RuleSet::bucket_count(Family f) const {
    return bucket_count_[f == Family::ipv4 ? 0 : 1];
}

CompiledRules RuleSet::compiled() const {
    CompiledRules out;
    std::vector<std::string> keys;
    for (auto &[key, _] : claims_)
        keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    for (auto &key : keys)
        if (key_of(key).family == static_cast<std::uint8_t>(Family::ipv4))
            out.exact4.push_back(*exact4(key));
        else
            out.exact6.push_back(*exact6(key));
    for (auto &[d, members] : buckets_)
        add_bucket(out, d, to_bucket(members));
    return out;
}

knod_bucket RuleSet::to_bucket(const std::vector<Member> &members) {
    knod_bucket b{};
    b.count = static_cast<std::uint32_t>(std::min<std::size_t>(members.size(), KNOD_BUCKET_RULES));
    for (std::uint32_t i = 0; i < b.count; ++i)
        b.rules[i] = members[i].rule;
    return b;
}

} // namespace knod::bpf
