/* The flow filter's maps as the BPF program and its loader both see them. C, shared by
 * flow_filter.bpf.c (clang -target bpf) and the C++ loader. Changing a layout changes both. */
#ifndef KNOD_FLOW_FILTER_ABI_H
#define KNOD_FLOW_FILTER_ABI_H

#include <linux/types.h>

#define KNOD_MAX_BINDINGS 65536 /* binding slots */
#define KNOD_MAX_BUCKETS 65536  /* LPM buckets, both generations together */
#define KNOD_BUCKET_RULES 16    /* prefix rules that may cover one destination prefix */

/* Binding slot states. */
#define KNOD_SLOT_FREE 0     /* no binding: its leftover rules never match */
#define KNOD_SLOT_INACTIVE 1 /* granted but not activated, or being torn down: drop */
#define KNOD_SLOT_ACTIVE 2   /* deliver to the binding's offload queue */

/* What to do with traffic no binding claims. */
#define KNOD_UNMATCHED_PASS 0
#define KNOD_UNMATCHED_DROP 1

/* Rule sets are double-buffered: every rule exists per generation, the config says which
 * generation packets use, and the loader flips it only once the new generation is complete.
 * The loader rewrites a generation at the next change after it stopped being live, so a packet
 * that read the config before a flip and was held up (an interrupt, a preempted vCPU) could meet
 * a half-written bucket, or a slot already given to another binding. `epoch` closes that: the
 * loader bumps it before it writes a generation that was live and before every slot write
 * (slots are not per generation), and a packet whose decision straddles a bump (epoch reread
 * at the end differs) decides again, or is dropped if the rules changed again meanwhile. */
struct knod_config {
    __u32 generation; /* 0 or 1 */
    __u32 epoch;      /* bumped before the loader writes anything a decision may be reading */
    __u32 unmatched;  /* KNOD_UNMATCHED_* */
    __u32 prefixes4;  /* buckets in the IPv4 trie for this generation; 0 skips the lookup */
    __u32 prefixes6;
    __u32 record_queue; /* 1: a guard checks passed packets: in the filter, or behind it
                           (knod_rx_meta) */
};

/* Where the sim's guard checks a passed packet's RX queue: at tc ingress, the queue handed over
 * in XDP metadata (knod_flow_filter_meta + knod_sim_guard); or inside the XDP filter
 * (knod_flow_filter). The loader loads the XDP program of the path it runs. */
#define KNOD_SIM_GUARD_TC 0
#define KNOD_SIM_GUARD_XDP 1

/* What the XDP filter puts before a packet it passes when record_queue is on, for the guard
 * behind it at tc ingress (the sim runs the devmem guard that way). veth's skb path does not keep
 * the RX queue a packet arrived on (skb->queue_mapping reads 0 once XDP reallocated the skb), so
 * the filter, which knows it (rx_queue_index), hands it over. Metadata never comes from the wire:
 * only an XDP program on this host can write it. */
#define KNOD_RX_META_MAGIC 0x4b4e5251u /* "KNRQ" */
struct knod_rx_meta {
    __u32 magic;
    __u32 queue;
};

/* Exact 5-tuples live in tables of our own rather than kernel hash maps, one per family: an
 * ARRAY of buckets, each rule in one of two buckets its hashes choose (two-choice, cuckoo-style
 * placement by the loader). A lookup is two inlined array reads and at most eight compares,
 * whatever the number of rules; a kernel hash lookup measured about 12 ns, this about 4
 * (docs/flow-filter.md). Each map holds both generations: index = generation << BUCKET_BITS |
 * bucket. An entry's `meta` is KNOD_EXACT_USED | protocol << 16 | slot; 0 when the way is empty. */
#define KNOD_EXACT_USED 0x80000000u
#define KNOD_EXACT4_USED KNOD_EXACT_USED

#define KNOD_EXACT4_BUCKET_BITS 16
#define KNOD_EXACT4_BUCKETS (1u << KNOD_EXACT4_BUCKET_BITS) /* per generation */
#define KNOD_EXACT4_WAYS 4                                  /* entries per bucket: 64 bytes */

/* Ports and addresses exactly as the packet carries them (network order, loaded as words). */
struct knod_exact4_entry {
    __u32 ports; /* source port, then destination port */
    __u32 src;
    __u32 dst;
    __u32 meta;
};

struct knod_exact4_bucket {
    struct knod_exact4_entry way[KNOD_EXACT4_WAYS];
};

/* One of the two hash functions: multilinear over the entry's words, keyed by random
 * multipliers the loader draws at load time (rules cannot be chosen to collide):
 * bucket = (seed + mul[0] * (ports | protocol << 32) + mul[1] * src + mul[2] * dst) >> (64 - bits)
 */
struct knod_exact4_hash {
    __u64 mul[3];
    __u64 seed;
};

/* The bucket (within one generation) that hash `h` gives an entry. The BPF program and the
 * loader both use this one definition; `volatile` because the program reads `h` from .rodata. */
static inline __u32 knod_exact4_bucket_of(const volatile struct knod_exact4_hash *h, __u32 ports,
                                          __u32 src, __u32 dst, __u8 protocol) {
    __u64 sum =
        h->seed + h->mul[0] * (ports | (__u64)protocol << 32) + h->mul[1] * src + h->mul[2] * dst;
    return (__u32)(sum >> (64 - KNOD_EXACT4_BUCKET_BITS));
}

/* IPv6: the same scheme over 40-byte entries. 32,768 buckets of four per generation hold
 * 131,072 rules at most (about 118,000 at the 90 % the placement reaches); 10 MiB for both
 * generations. */
#define KNOD_EXACT6_BUCKET_BITS 15
#define KNOD_EXACT6_BUCKETS (1u << KNOD_EXACT6_BUCKET_BITS) /* per generation */
#define KNOD_EXACT6_WAYS 4                                  /* entries per bucket: 160 bytes */

struct knod_exact6_entry {
    __u32 ports; /* source port, then destination port, network order */
    __u32 src[4];
    __u32 dst[4];
    __u32 meta;
};

struct knod_exact6_bucket {
    struct knod_exact6_entry way[KNOD_EXACT6_WAYS];
};

/* bucket = (seed + mul[0] * (ports | protocol << 32) + sum mul[1 + i] * src[i]
 *           + sum mul[5 + i] * dst[i]) >> (64 - bits) */
struct knod_exact6_hash {
    __u64 mul[9];
    __u64 seed;
};

static inline __u32 knod_exact6_bucket_of(const volatile struct knod_exact6_hash *h, __u32 ports,
                                          const __u32 *src, const __u32 *dst, __u8 protocol) {
    __u64 sum = h->seed + h->mul[0] * (ports | (__u64)protocol << 32) + h->mul[1] * src[0] +
                h->mul[2] * src[1] + h->mul[3] * src[2] + h->mul[4] * src[3] + h->mul[5] * dst[0] +
                h->mul[6] * dst[1] + h->mul[7] * dst[2] + h->mul[8] * dst[3];
    return (__u32)(sum >> (64 - KNOD_EXACT6_BUCKET_BITS));
}

/* LPM keys on the destination: prefixlen counts bits from `generation`, so it is 32 plus the
 * address prefix length. */
struct knod_lpm4_key {
    __u32 prefixlen;
    __u8 generation;
    __u8 pad[3];
    __u8 addr[4];
};

struct knod_lpm6_key {
    __u32 prefixlen;
    __u8 generation;
    __u8 pad[3];
    __u8 addr[16];
};

struct knod_rule {
    __u32 slot;
    __u8 protocol; /* 0: any */
    __u8 src_len;  /* source prefix length in bits; 0: any */
    __u8 pad[2];
    __u8 src[16];
    __u16 src_port_lo, src_port_hi; /* host byte order */
    __u16 dst_port_lo, dst_port_hi;
};

/* Every prefix rule whose destination contains the bucket's prefix, most specific first, so
 * the longest-prefix lookup alone finds every candidate. */
struct knod_bucket {
    __u32 count;
    struct knod_rule rules[KNOD_BUCKET_RULES];
};

struct knod_slot {
    __u32 state; /* KNOD_SLOT_* */
    __u32 queue; /* the RX queue whose AF_XDP socket gets this binding's packets */
};

struct knod_counters {
    __u64 packets; /* delivered toward the offload queue (the guard: arrived on it) */
    __u64 bytes;
    __u64 drops;     /* matched, but inactive, wrong queue, or no socket */
    __u64 misrouted; /* the devmem guard: not this binding's, yet on its queue; dropped */
};

/* The devmem guard's reverse index: which binding slot holds each RX queue (slot + 1; 0: none). */
#define KNOD_MAX_QUEUES 1024

/* Filter-wide counters, per CPU, indexed by these. */
#define KNOD_STAT_PASSED 0    /* unmatched, passed to the stack */
#define KNOD_STAT_DROPPED 1   /* unmatched, dropped by setting */
#define KNOD_STAT_MALFORMED 2 /* truncated or malformed headers */
#define KNOD_STAT_FRAGMENT 3  /* IP fragments: never offloaded */
#define KNOD_STAT_BINDING_DROP 4
#define KNOD_STAT_REDECIDED 5 /* rules changed while deciding: decided again */
#define KNOD_STAT_RACED 6     /* ... and again: dropped */
#define KNOD_STAT_MISROUTED 7 /* the devmem guard: foreign packets on a bound queue, dropped */
#define KNOD_STAT_COUNT 8

#endif
