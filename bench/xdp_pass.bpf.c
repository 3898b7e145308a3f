// SPDX-License-Identifier: GPL-2.0
/* The floor for filter benchmarks: an XDP program that only passes. */
#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("xdp")
int xdp_pass(struct xdp_md *ctx) {
    (void)ctx;
    return XDP_PASS;
}

/* The floor for the devmem guard (tc): a classifier that only lets packets through. */
SEC("tc")
int tc_ok(struct __sk_buff *skb) {
    (void)skb;
    return 0; /* TC_ACT_OK */
}
