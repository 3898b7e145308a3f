// SPDX-License-Identifier: GPL-2.0
/* knod flow filter: decides which received packets reach a binding's offload queue.
 * A packet that matches an active binding's flows is redirected to the AF_XDP socket of that
 * binding's queue; one that matches an inactive binding is dropped; everything else, and every
 * fragment or malformed packet, never reaches an offload queue (passed to the stack or dropped,
 * per the config). Per-packet cost: at most two bucket reads of an exact table, then at most one
 * LPM lookup and a bounded scan of one bucket, whatever the number of rules. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "flow_filter_abi.h"

char LICENSE[] SEC("license") = "GPL";

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct knod_config);
} config SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2 * KNOD_EXACT4_BUCKETS);
    __type(key, __u32);
    __type(value, struct knod_exact4_bucket);
} exact4 SEC(".maps");

/* The two hash functions' keys, drawn by the loader before it loads the program. */
const volatile struct knod_exact4_hash exact4_hash[2];

/* The slot of the entry for (ports, src, dst, protocol) in bucket `bucket` of generation `gen`,
 * or -1. Words are compared in network order, straight from the packet. */
static __always_inline long exact4_in_bucket(__u32 bucket, __u8 gen, __u32 ports, __u32 src,
                                             __u32 dst, __u32 tag) {
    __u32 index = (__u32)gen << KNOD_EXACT4_BUCKET_BITS | bucket;
    struct knod_exact4_bucket *b = bpf_map_lookup_elem(&exact4, &index);
    if (!b) return -1;
#pragma unroll
    for (int i = 0; i < KNOD_EXACT4_WAYS; i++) {
        const struct knod_exact4_entry *e = &b->way[i];
        if (e->src == src && e->ports == ports && e->dst == dst && (e->meta >> 16) == tag)
            return e->meta & 0xffff;
    }
    return -1;
}

/* The slot an exact IPv4 rule gives this packet in generation `gen`, or -1. */
static __always_inline long exact4_slot(__u32 ports, __u32 src, __u32 dst, __u8 protocol,
                                        __u8 gen) {
    __u32 tag = KNOD_EXACT4_USED >> 16 | protocol;
    long slot = exact4_in_bucket(knod_exact4_bucket_of(&exact4_hash[0], ports, src, dst, protocol),
                                 gen, ports, src, dst, tag);
    if (slot >= 0) return slot;
    return exact4_in_bucket(knod_exact4_bucket_of(&exact4_hash[1], ports, src, dst, protocol), gen,
                            ports, src, dst, tag);
}

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2 * KNOD_EXACT6_BUCKETS);
    __type(key, __u32);
    __type(value, struct knod_exact6_bucket);
} exact6 SEC(".maps");

const volatile struct knod_exact6_hash exact6_hash[2];

/* The same for IPv6: `src` and `dst` point at four words each, from the packet or a copy. */
static __always_inline long exact6_in_bucket(__u32 bucket, __u8 gen, __u32 ports, const __u32 *src,
                                             const __u32 *dst, __u32 tag) {
    __u32 index = (__u32)gen << KNOD_EXACT6_BUCKET_BITS | bucket;
    struct knod_exact6_bucket *b = bpf_map_lookup_elem(&exact6, &index);
    if (!b) return -1;
#pragma unroll
    for (int i = 0; i < KNOD_EXACT6_WAYS; i++) {
        const struct knod_exact6_entry *e = &b->way[i];
        if (e->src[3] == src[3] && e->ports == ports && e->dst[3] == dst[3] &&
            e->src[0] == src[0] && e->src[1] == src[1] && e->src[2] == src[2] &&
            e->dst[0] == dst[0] && e->dst[1] == dst[1] && e->dst[2] == dst[2] &&
            (e->meta >> 16) == tag)
            return e->meta & 0xffff;
    }
    return -1;
}

static __always_inline long exact6_slot(__u32 ports, const __u32 *src, const __u32 *dst,
                                        __u8 protocol, __u8 gen) {
    __u32 tag = KNOD_EXACT_USED >> 16 | protocol;
    long slot = exact6_in_bucket(knod_exact6_bucket_of(&exact6_hash[0], ports, src, dst, protocol),
                                 gen, ports, src, dst, tag);
    if (slot >= 0) return slot;
    return exact6_in_bucket(knod_exact6_bucket_of(&exact6_hash[1], ports, src, dst, protocol), gen,
                            ports, src, dst, tag);
}

struct {
    __uint(type, BPF_MAP_TYPE_LPM_TRIE);
    __uint(max_entries, KNOD_MAX_BUCKETS);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, struct knod_lpm4_key);
    __type(value, struct knod_bucket);
} prefixes4 SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LPM_TRIE);
    __uint(max_entries, KNOD_MAX_BUCKETS);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, struct knod_lpm6_key);
    __type(value, struct knod_bucket);
} prefixes6 SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, KNOD_MAX_BINDINGS);
    __type(key, __u32);
    __type(value, struct knod_slot);
} slots SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, KNOD_MAX_BINDINGS);
    __type(key, __u32);
    __type(value, struct knod_counters);
} counters SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, KNOD_MAX_QUEUES);
    __type(key, __u32);
    __type(value, __u32);
} bound_queues SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, KNOD_STAT_COUNT);
    __type(key, __u32);
    __type(value, __u64);
} stats SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 64);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

struct packet {
    __u8 src[16] __attribute__((aligned(4))); /* read as words by the exact lookups */
    __u8 dst[16];
    __u16 src_port; /* host order */
    __u16 dst_port;
    __u8 family;
    __u8 protocol;
};

static __always_inline void count(__u32 stat) {
    __u64 *v = bpf_map_lookup_elem(&stats, &stat);
    if (v) *v += 1;
}

static __always_inline int unmatched(const struct knod_config *cfg) {
    if (cfg->unmatched == KNOD_UNMATCHED_DROP) {
        count(KNOD_STAT_DROPPED);
        return XDP_DROP;
    }
    count(KNOD_STAT_PASSED);
    return XDP_PASS;
}

#define PARSE_OK 0
#define PARSE_UNMATCHED 1 /* not IP, or not TCP/UDP: the stack's business */
#define PARSE_MALFORMED 2
#define PARSE_FRAGMENT 3

/* IPv6 extension headers skipped on the way to TCP/UDP. */
#define MAX_EXT_HEADERS 4

static __always_inline int parse_l4(void *l4, void *end, __u8 protocol, struct packet *p) {
    p->protocol = protocol;
    if (protocol == IPPROTO_UDP) {
        struct udphdr *udp = l4;
        if ((void *)(udp + 1) > end) return PARSE_MALFORMED;
        p->src_port = bpf_ntohs(udp->source);
        p->dst_port = bpf_ntohs(udp->dest);
        return PARSE_OK;
    }
    if (protocol == IPPROTO_TCP) {
        struct tcphdr *tcp = l4;
        if ((void *)(tcp + 1) > end || tcp->doff < 5) return PARSE_MALFORMED;
        p->src_port = bpf_ntohs(tcp->source);
        p->dst_port = bpf_ntohs(tcp->dest);
        return PARSE_OK;
    }
    return PARSE_UNMATCHED;
}

static __always_inline int parse(void *data, void *end, struct packet *p) {
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end) return PARSE_MALFORMED;
    void *next = eth + 1;
    __u16 proto = eth->h_proto;
    if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
        __be16 *vlan = next; /* TCI, then the encapsulated EtherType */
        if ((void *)(vlan + 2) > end) return PARSE_MALFORMED;
        proto = vlan[1];
        next = vlan + 2;
    }
    if (proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = next;
        if ((void *)(ip + 1) > end || ip->ihl < 5 || ip->version != 4) return PARSE_MALFORMED;
        void *l4 = (void *)ip + ip->ihl * 4;
        if (l4 > end) return PARSE_MALFORMED;
        /* Any fragment, first or not: a partial datagram never goes to an offload queue. */
        if (ip->frag_off & bpf_htons(0x3fff)) return PARSE_FRAGMENT;
        p->family = 4;
        __builtin_memcpy(p->src, &ip->saddr, 4);
        __builtin_memcpy(p->dst, &ip->daddr, 4);
        return parse_l4(l4, end, ip->protocol, p);
    }
    if (proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = next;
        if ((void *)(ip6 + 1) > end || ip6->version != 6) return PARSE_MALFORMED;
        p->family = 6;
        __builtin_memcpy(p->src, &ip6->saddr, 16);
        __builtin_memcpy(p->dst, &ip6->daddr, 16);
        __u8 nexthdr = ip6->nexthdr;
        void *l4 = ip6 + 1;
#pragma unroll
        for (int i = 0; i < MAX_EXT_HEADERS; i++) {
            if (nexthdr == IPPROTO_HOPOPTS || nexthdr == IPPROTO_ROUTING ||
                nexthdr == IPPROTO_DSTOPTS) {
                __u8 *ext = l4;
                if ((void *)(ext + 2) > end) return PARSE_MALFORMED;
                nexthdr = ext[0];
                l4 = ext + (ext[1] + 1) * 8;
            } else if (nexthdr == IPPROTO_FRAGMENT) {
                return PARSE_FRAGMENT;
            } else {
                break;
            }
        }
        if (l4 > end) return PARSE_MALFORMED;
        return parse_l4(l4, end, nexthdr, p);
    }
    return PARSE_UNMATCHED;
}

static __always_inline int prefix_match(const __u8 *want, const __u8 *addr, __u32 bits) {
    for (int i = 0; i < 16; i++) {
        if (bits == 0) return 1;
        __u8 mask = bits >= 8 ? 0xff : (__u8)(0xff << (8 - bits));
        if ((want[i] ^ addr[i]) & mask) return 0;
        bits = bits >= 8 ? bits - 8 : 0;
    }
    return 1;
}

static __always_inline long scan_bucket(const struct knod_bucket *b, const struct packet *p) {
    for (int i = 0; i < KNOD_BUCKET_RULES; i++) {
        if (i >= b->count) break;
        const struct knod_rule *r = &b->rules[i];
        if (r->protocol && r->protocol != p->protocol) continue;
        if (p->src_port < r->src_port_lo || p->src_port > r->src_port_hi) continue;
        if (p->dst_port < r->dst_port_lo || p->dst_port > r->dst_port_hi) continue;
        if (!prefix_match(r->src, p->src, r->src_len)) continue;
        return r->slot;
    }
    return -1;
}

/* The slot of the binding this packet belongs to, or -1. */
static __always_inline long classify(const struct packet *p, const struct knod_config *c) {
    __u8 gen = c->generation & 1;
    if (p->family == 4) {
        __be16 ports[2] = {bpf_htons(p->src_port), bpf_htons(p->dst_port)};
        __u32 pw, src, dst;
        __builtin_memcpy(&pw, ports, 4);
        __builtin_memcpy(&src, p->src, 4);
        __builtin_memcpy(&dst, p->dst, 4);
        long slot = exact4_slot(pw, src, dst, p->protocol, gen);
        if (slot >= 0) return slot;
        if (!c->prefixes4) return -1;
        struct knod_lpm4_key lk = {};
        lk.prefixlen = 32 + 32;
        lk.generation = gen;
        __builtin_memcpy(lk.addr, p->dst, 4);
        struct knod_bucket *b = bpf_map_lookup_elem(&prefixes4, &lk);
        return b ? scan_bucket(b, p) : -1;
    }
    __be16 ports[2] = {bpf_htons(p->src_port), bpf_htons(p->dst_port)};
    __u32 pw;
    __builtin_memcpy(&pw, ports, 4);
    long slot = exact6_slot(pw, (const __u32 *)p->src, (const __u32 *)p->dst, p->protocol, gen);
    if (slot >= 0) return slot;
    if (!c->prefixes6) return -1;
    struct knod_lpm6_key lk = {};
    lk.prefixlen = 32 + 128;
    lk.generation = gen;
    __builtin_memcpy(lk.addr, p->dst, 16);
    struct knod_bucket *b = bpf_map_lookup_elem(&prefixes6, &lk);
    return b ? scan_bucket(b, p) : -1;
}

/* The exact-match hot path of both families, straight from the headers to the lookup: no
 * intermediate packet copy, ports stay in network order. Returns the slot, -1 when no exact rule
 * matches a well-formed TCP/UDP packet and the family has no prefix rules, or -2 when the generic
 * path must decide (prefix rules to try; not a plain IPv4 or IPv6 TCP/UDP packet, IPv4 options,
 * IPv6 extension headers, malformed, or a fragment), so that the generic path alone keeps every
 * rule about malformed and fragmented packets. */
static __always_inline int plain_l4(void *l4, void *end, __u8 protocol) {
    if (protocol == IPPROTO_UDP) return l4 + sizeof(struct udphdr) <= end;
    if (protocol != IPPROTO_TCP) return 0;
    struct tcphdr *tcp = l4;
    return (void *)(tcp + 1) <= end && tcp->doff >= 5;
}

static __always_inline long exact_fast(void *data, void *end, const struct knod_config *c) {
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end) return -2;
    __u8 gen = c->generation & 1;
    if (eth->h_proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->version != 4 ||
            (ip->frag_off & bpf_htons(0x3fff)) || !plain_l4(ip + 1, end, ip->protocol))
            return -2;
        long slot = exact4_slot(*(__u32 *)(ip + 1), ip->saddr, ip->daddr, ip->protocol, gen);
        return slot == -1 && c->prefixes4 ? -2 : slot;
    }
    if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > end || ip6->version != 6 || !plain_l4(ip6 + 1, end, ip6->nexthdr))
            return -2;
        long slot = exact6_slot(*(__u32 *)(ip6 + 1), (const __u32 *)&ip6->saddr,
                                (const __u32 *)&ip6->daddr, ip6->nexthdr, gen);
        return slot == -1 && c->prefixes6 ? -2 : slot;
    }
    return -2;
}

/* A copy of the config, epoch first, every field read exactly once where it stands: the
 * compiler may neither drop the copy nor move these reads past the rule reads that follow. */
static __always_inline void read_config(const struct knod_config *cfg, struct knod_config *c) {
    const volatile struct knod_config *v = cfg;
    c->epoch = v->epoch;
    c->generation = v->generation;
    c->unmatched = v->unmatched;
    c->prefixes4 = v->prefixes4;
    c->prefixes6 = v->prefixes6;
    c->record_queue = v->record_queue;
}

/* What the filter decided for a packet, before anything is counted or sent. */
#define DECIDED_UNMATCHED 0
#define DECIDED_MALFORMED 1
#define DECIDED_FRAGMENT 2
#define DECIDED_OFFLOAD 3
#define DECIDED_BINDING_DROP 4

/* Decides against the rule set `c` names, touching nothing, so the decision can be dropped and
 * made again if the rules changed meanwhile. Sets *slot_id for the binding decisions. */
static __always_inline int decide(void *data, void *end, __u32 rx_queue,
                                  const struct knod_config *c, __u32 *slot_id) {
    long found = exact_fast(data, end, c);
    if (found == -2) {
        struct packet p = {};
        int parsed = parse(data, end, &p);
        if (parsed == PARSE_MALFORMED) return DECIDED_MALFORMED;
        if (parsed == PARSE_FRAGMENT) return DECIDED_FRAGMENT;
        if (parsed != PARSE_OK) return DECIDED_UNMATCHED;
        found = classify(&p, c);
    }
    if (found < 0 || found >= KNOD_MAX_BINDINGS) return DECIDED_UNMATCHED;
    *slot_id = found;
    struct knod_slot *slot = bpf_map_lookup_elem(&slots, slot_id);
    if (!slot) return DECIDED_UNMATCHED;
    struct knod_slot s = *slot;
    if (s.state == KNOD_SLOT_FREE) return DECIDED_UNMATCHED;
    /* An inactive binding's traffic, or traffic on a queue other than the binding's, is
     * dropped: it must not reach the stack or another binding's socket. */
    if (s.state != KNOD_SLOT_ACTIVE || s.queue != rx_queue) return DECIDED_BINDING_DROP;
    return DECIDED_OFFLOAD;
}

static __always_inline int foreign_on_queue(void *data, void *end, __u32 q, struct knod_config *cfg,
                                            const struct knod_config *c, int decided);

/* unmatched() for the XDP filter: when a guard runs behind the filter (record_queue), a passed
 * packet either carries its RX queue in its metadata to the tc guard, or meets the guard's
 * check here. A packet that cannot carry it is dropped: the guard could not tell whether it
 * landed on a bound queue (fail closed). */
static __always_inline int unmatched_xdp(struct xdp_md *ctx, struct knod_config *cfg,
                                         const struct knod_config *c, int decided,
                                         const int guard_path) {
    int act = unmatched(c);
    if (act != XDP_PASS || !c->record_queue) return act;
    __u32 queue = ctx->rx_queue_index;
    if (guard_path == KNOD_SIM_GUARD_XDP) {
        if (queue >= KNOD_MAX_QUEUES) return act;
        __u32 *owner = bpf_map_lookup_elem(&bound_queues, &queue);
        if (!owner || *owner == 0) return act;
        foreign_on_queue((void *)(long)ctx->data, (void *)(long)ctx->data_end, queue, cfg, c,
                         decided);
        return XDP_DROP;
    }
    if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct knod_rx_meta)) != 0) return XDP_DROP;
    struct knod_rx_meta *m = (void *)(long)ctx->data_meta;
    if ((void *)(m + 1) > (void *)(long)ctx->data) return XDP_DROP;
    m->magic = KNOD_RX_META_MAGIC;
    m->queue = queue;
    return act;
}

/* The filter, in one of two programs by where the sim's guard checks passed packets
 * (KNOD_SIM_GUARD_*, a constant): the loader loads the one it attaches. Only the tc path's
 * program calls bpf_xdp_adjust_meta, which some kernels refuse to XDP programs; the other holds
 * no call to it at all. */
static __always_inline int flow_filter(struct xdp_md *ctx, const int guard_path) {
    __u32 zero = 0;
    struct knod_config *cfg = bpf_map_lookup_elem(&config, &zero);
    if (!cfg) return XDP_PASS;
    struct knod_config c;
    read_config(cfg, &c); /* one generation per decision */
    __u32 slot_id = 0;
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    int decided = decide(data, end, ctx->rx_queue_index, &c, &slot_id);
    /* x86 keeps loads in order: if this decision saw anything the loader wrote after a bump, it
     * sees the bump here too. */
    if (*(volatile __u32 *)&cfg->epoch != c.epoch) {
        count(KNOD_STAT_REDECIDED);
        read_config(cfg, &c);
        data = (void *)(long)ctx->data;
        end = (void *)(long)ctx->data_end;
        decided = decide(data, end, ctx->rx_queue_index, &c, &slot_id);
        if (*(volatile __u32 *)&cfg->epoch != c.epoch) {
            /* Undecidable while the rules keep changing: fail closed. */
            count(KNOD_STAT_RACED);
            return XDP_DROP;
        }
    }
    if (decided == DECIDED_MALFORMED) count(KNOD_STAT_MALFORMED);
    if (decided == DECIDED_FRAGMENT) count(KNOD_STAT_FRAGMENT);
    if (decided == DECIDED_MALFORMED || decided == DECIDED_FRAGMENT || decided == DECIDED_UNMATCHED)
        return unmatched_xdp(ctx, cfg, &c, decided, guard_path); /* one inlined copy */
    struct knod_counters *cnt = bpf_map_lookup_elem(&counters, &slot_id);
    if (!cnt) return XDP_DROP;
    if (decided == DECIDED_BINDING_DROP) {
        cnt->drops += 1;
        count(KNOD_STAT_BINDING_DROP);
        return XDP_DROP;
    }
    cnt->packets += 1;
    cnt->bytes += (__u64)(ctx->data_end - ctx->data);
    /* No socket on the queue: drop rather than leak the packet to the stack. */
    return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_DROP);
}

/* The filter with the guard's check inside (KNOD_SIM_GUARD_XDP); without a guard behind it
 * (record_queue off) both programs are the plain filter. */
SEC("xdp")
int knod_flow_filter(struct xdp_md *ctx) {
    return flow_filter(ctx, KNOD_SIM_GUARD_XDP);
}

/* The filter that hands each passed packet's RX queue to knod_sim_guard at tc ingress
 * (KNOD_SIM_GUARD_TC). Shown by the kernel, as the other is, as knod_flow_filte. */
SEC("xdp")
int knod_flow_filter_meta(struct xdp_md *ctx) {
    return flow_filter(ctx, KNOD_SIM_GUARD_TC);
}

/* The sim's stand-in for a NIC's ntuple steering rules and RSS: on the wire end's egress, a
 * packet that belongs to a binding is given that binding's queue, so it arrives on the NIC end's
 * RX queue whose AF_XDP socket serves the binding; every other packet goes to queue 0, as RSS
 * spread over the normal stack's queues only (what devmem's pre-check requires of a real NIC).
 * (On veth, queue_mapping N+1 lands on RX queue N.) */
SEC("tc")
int knod_steer(struct __sk_buff *skb) {
    skb->queue_mapping = 0 + 1;
    __u32 zero = 0;
    struct knod_config *cfg = bpf_map_lookup_elem(&config, &zero);
    if (!cfg) return TC_ACT_OK;
    struct knod_config c;
    read_config(cfg, &c);
    struct packet p = {};
    if (parse((void *)(long)skb->data, (void *)(long)skb->data_end, &p) != PARSE_OK)
        return TC_ACT_OK;
    long found = classify(&p, &c);
    if (found < 0 || found >= KNOD_MAX_BINDINGS) return TC_ACT_OK;
    __u32 slot_id = found;
    struct knod_slot *slot = bpf_map_lookup_elem(&slots, &slot_id);
    if (slot && slot->state != KNOD_SLOT_FREE) skb->queue_mapping = slot->queue + 1;
    return TC_ACT_OK;
}

/* The devmem guard: tc ingress on a devmem NIC, where XDP cannot run (bind-rx refuses a device
 * with XDP). It sees each packet after the NIC placed it (headers in host memory, payload in the
 * dma-buf) with the RX queue it arrived on, and uses the flow filter's rule tables and decision:
 * a binding's own packet on its queue is counted for it; any other packet on a bound queue
 * (another flow, a fragment, malformed, not TCP) is foreign traffic the NIC put in the holder's
 * memory: it is dropped and counted as misrouted for the queue's binding, and the daemon revokes
 * the binding (steering drift). Packets on unbound queues are the stack's. `rx_queue` is the
 * queue index, or -1 when the driver recorded none. */
/* The slot a malformed or fragmented TCP/UDP packet's addresses and ports name (a bad TCP
 * header, a cut one, an IPv4 first fragment; IPv6 without extension headers), or -1: a NIC's
 * ntuple rule matches by these fields alone, so such a packet of a binding's own flow lands on
 * its queue without any steering drifting. */
static __always_inline long tuple_slot(void *data, void *end, const struct knod_config *c) {
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end) return -1;
    void *next = eth + 1;
    __u16 proto = eth->h_proto;
    if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
        __be16 *vlan = next;
        if ((void *)(vlan + 2) > end) return -1;
        proto = vlan[1];
        next = vlan + 2;
    }
    struct packet p = {};
    __be16 *ports;
    if (proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = next;
        if ((void *)(ip + 1) > end || ip->ihl < 5 || ip->version != 4) return -1;
        if (ip->frag_off & bpf_htons(0x1fff)) return -1; /* a later fragment: no ports */
        p.family = 4;
        p.protocol = ip->protocol;
        __builtin_memcpy(p.src, &ip->saddr, 4);
        __builtin_memcpy(p.dst, &ip->daddr, 4);
        ports = (void *)ip + ip->ihl * 4;
    } else if (proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = next;
        if ((void *)(ip6 + 1) > end || ip6->version != 6) return -1;
        p.family = 6;
        p.protocol = ip6->nexthdr;
        __builtin_memcpy(p.src, &ip6->saddr, 16);
        __builtin_memcpy(p.dst, &ip6->daddr, 16);
        ports = (void *)(ip6 + 1);
    } else {
        return -1;
    }
    if (p.protocol != IPPROTO_TCP && p.protocol != IPPROTO_UDP) return -1;
    if ((void *)(ports + 2) > end) return -1;
    p.src_port = bpf_ntohs(ports[0]);
    p.dst_port = bpf_ntohs(ports[1]);
    return classify(&p, c);
}

static __always_inline int guard(struct __sk_buff *skb, long rx_queue) {
    if (rx_queue < 0 || rx_queue >= KNOD_MAX_QUEUES) return TC_ACT_OK;
    __u32 q = rx_queue;
    __u32 *owner = bpf_map_lookup_elem(&bound_queues, &q);
    if (!owner || *owner == 0) return TC_ACT_OK;
    __u32 zero = 0;
    struct knod_config *cfg = bpf_map_lookup_elem(&config, &zero);
    if (!cfg) return TC_ACT_SHOT;
    struct knod_config c;
    read_config(cfg, &c);
    __u32 slot_id = 0;
    int decided = decide((void *)(long)skb->data, (void *)(long)skb->data_end, q, &c, &slot_id);
    if (*(volatile __u32 *)&cfg->epoch != c.epoch) {
        count(KNOD_STAT_REDECIDED);
        read_config(cfg, &c);
        decided = decide((void *)(long)skb->data, (void *)(long)skb->data_end, q, &c, &slot_id);
        if (*(volatile __u32 *)&cfg->epoch != c.epoch) {
            count(KNOD_STAT_RACED);
            return TC_ACT_SHOT;
        }
    }
    if (decided == DECIDED_OFFLOAD) {
        struct knod_counters *cnt = bpf_map_lookup_elem(&counters, &slot_id);
        if (cnt) {
            /* After GRO one skb may carry several of the flow's packets. */
            cnt->packets += skb->gso_segs ? skb->gso_segs : 1;
            cnt->bytes += skb->len;
        }
        return TC_ACT_OK;
    }
    if (decided == DECIDED_MALFORMED) count(KNOD_STAT_MALFORMED);
    if (decided == DECIDED_FRAGMENT) count(KNOD_STAT_FRAGMENT);
    foreign_on_queue((void *)(long)skb->data, (void *)(long)skb->data_end, q, cfg, &c, decided);
    return TC_ACT_SHOT;
}

/* A packet on bound queue `q` that is not an offload of its binding (`decided` says why), to be
 * dropped: a malformed or fragmented packet of a binding's own flow on that binding's queue is
 * counted as the binding's drop; anything else is foreign, charged as misrouted to the binding
 * that holds the queue (steering drift). Returns whether it was foreign. */
static __always_inline int foreign_on_queue(void *data, void *end, __u32 q, struct knod_config *cfg,
                                            const struct knod_config *c, int decided) {
    if (decided == DECIDED_MALFORMED || decided == DECIDED_FRAGMENT) {
        /* One of the queue's own flows, malformed or fragmented: dropped as the binding's, not
         * drift (whoever can send on the flow could otherwise end the binding with one packet). */
        long own = tuple_slot(data, end, c);
        if (own >= 0 && own < KNOD_MAX_BINDINGS && *(volatile __u32 *)&cfg->epoch == c->epoch) {
            __u32 own_id = own;
            struct knod_slot *os = bpf_map_lookup_elem(&slots, &own_id);
            if (os && os->state == KNOD_SLOT_ACTIVE && os->queue == q) {
                struct knod_counters *cnt = bpf_map_lookup_elem(&counters, &own_id);
                if (cnt) cnt->drops += 1;
                return 0;
            }
        }
    }
    /* Charged to the binding that holds the queue (reread: the slot may have changed). */
    __u32 *owner = bpf_map_lookup_elem(&bound_queues, &q);
    if (owner && *owner) {
        __u32 holder = *owner - 1;
        struct knod_counters *cnt = bpf_map_lookup_elem(&counters, &holder);
        if (cnt) cnt->misrouted += 1;
    }
    count(KNOD_STAT_MISROUTED);
    return 1;
}

SEC("tc")
int knod_devmem_guard(struct __sk_buff *skb) {
    /* Drivers record the RX queue as queue_mapping = queue + 1 (skb_record_rx_queue). */
    return guard(skb, (long)skb->queue_mapping - 1);
}

/* The same guard behind the sim's XDP filter, on the sim NIC's tc ingress: the filter recorded
 * the RX queue in the packet's metadata (knod_rx_meta); a packet without it was not passed by
 * the filter (the sim's own stack traffic) and has no queue. */
SEC("tc")
int knod_sim_guard(struct __sk_buff *skb) {
    struct knod_rx_meta *m = (void *)(long)skb->data_meta;
    long queue = -1;
    if ((void *)(m + 1) <= (void *)(long)skb->data && m->magic == KNOD_RX_META_MAGIC)
        queue = m->queue;
    return guard(skb, queue); /* one inlined copy of the guard: the stack holds one */
}

/* BPF_PROG_TEST_RUN cannot set queue_mapping: the tests give the queue in cb[0] to the same
 * guard. Never attached. */
SEC("tc")
int knod_devmem_guard_test(struct __sk_buff *skb) {
    return guard(skb, (long)skb->cb[0]);
}
