/* The flow filter's maps as the BPF program and its loader both see them. C, shared by
 * flow_filter.bpf.c (clang -target bpf) and the C++ loader. Changing a layout changes both. */
#ifndef KNOD_FLOW_FILTER_ABI_H
#define KNOD_FLOW_FILTER_ABI_H

#include <linux/types.h>

#define KNOD_MAX_BINDINGS 65536 /* binding slots */
#define KNOD_MAX_EXACT 262144   /* exact 5-tuple entries, both generations together */
#define KNOD_MAX_BUCKETS 65536  /* LPM buckets, both generations together */
#define KNOD_BUCKET_RULES 16    /* prefix rules that may cover one destination prefix */

/* Binding slot states. */
#define KNOD_SLOT_FREE 0     /* no binding: its leftover rules never match */
#define KNOD_SLOT_INACTIVE 1 /* granted but not activated, or being torn down: drop */
#define KNOD_SLOT_ACTIVE 2   /* deliver to the binding's offload queue */

/* What to do with traffic no binding claims. */
#define KNOD_UNMATCHED_PASS 0
#define KNOD_UNMATCHED_DROP 1

/* Rule sets are double-buffered: every key carries a generation bit, the config says which
 * generation packets use, and the loader flips it only once the new generation is complete.
 * A packet reads the generation once, so it sees the old rule set or the new one. */
struct knod_config {
    __u32 generation; /* 0 or 1 */
    __u32 unmatched;  /* KNOD_UNMATCHED_* */
    __u32 prefixes4;  /* buckets in the IPv4 trie for this generation; 0 skips the lookup */
    __u32 prefixes6;
};

/* IPv4 exact 5-tuples: protocol and generation live in the value, so the key is the packet's
 * own 12 bytes (three words to hash, no copying or swapping of ports). The loader writes only
 * the idle generation's slots; a packet reads the slot of its protocol and generation. */
struct knod_exact4_key {
    __be16 src_port;
    __be16 dst_port;
    __u8 src[4];
    __u8 dst[4];
};

#define KNOD_NO_SLOT 0xffffffffu /* no rule for this protocol in this generation */
#define KNOD_EXACT4_UDP 0
#define KNOD_EXACT4_TCP 1
struct knod_exact4_value {
    __u32 slot[2][2]; /* [KNOD_EXACT4_UDP or _TCP][generation] */
};

/* IPv6 exact 5-tuples: generation and protocol in the key. */

struct knod_exact6_key {
    __u8 generation;
    __u8 protocol;
    __be16 src_port;
    __be16 dst_port;
    __u8 pad[2];
    __u8 src[16];
    __u8 dst[16];
};

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
    __u64 packets; /* delivered toward the offload queue */
    __u64 bytes;
    __u64 drops; /* matched, but inactive, wrong queue, or no socket */
};

/* Filter-wide counters, per CPU, indexed by these. */
#define KNOD_STAT_PASSED 0    /* unmatched, passed to the stack */
#define KNOD_STAT_DROPPED 1   /* unmatched, dropped by setting */
#define KNOD_STAT_MALFORMED 2 /* truncated or malformed headers */
#define KNOD_STAT_FRAGMENT 3  /* IP fragments: never offloaded */
#define KNOD_STAT_BINDING_DROP 4
#define KNOD_STAT_COUNT 5

#endif
