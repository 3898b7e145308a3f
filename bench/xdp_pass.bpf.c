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
