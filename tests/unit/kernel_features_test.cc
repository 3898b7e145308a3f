// The kernel-feature probes (issue 50) against the running kernel: a helper an XDP program may
// never call is reported missing in the kernel's own words; the probe of bpf_xdp_adjust_meta
// agrees with the kernel's verdict on the real program that calls it (the sim's tc-path filter),
// so the daemon's choice of guard path rests on what the kernel does, whichever kernel this is;
// each loader loads only its own programs, so a refused one takes down only what needs it.
// Needs root (CAP_BPF); skipped otherwise.
#include "bpf/flow_filter.h"
#include "host/kernel_features.h"

#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

using namespace knod;

namespace {

class KernelFeatures : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "BPF probes need root";
    }
};

TEST_F(KernelFeatures, AHelperTheProgramTypeCannotUseIsMissingInTheKernelsWords) {
    // bpf_skb_vlan_push is tc's: no kernel gives it to XDP programs.
    auto p = host::probe_bpf_helper(BPF_PROG_TYPE_XDP, BPF_FUNC_skb_vlan_push);
    EXPECT_TRUE(p.missing()) << p.detail;
    EXPECT_NE(p.detail.find("skb_vlan_push"), std::string::npos) << p.detail;
    // ... and one every XDP filter uses is there.
    auto redirect = host::probe_bpf_helper(BPF_PROG_TYPE_XDP, BPF_FUNC_redirect_map);
    EXPECT_TRUE(redirect.available()) << redirect.detail;
    EXPECT_TRUE(host::probe_bpf_prog_type(BPF_PROG_TYPE_XDP).available());
    EXPECT_TRUE(host::probe_bpf_map_type(BPF_MAP_TYPE_LPM_TRIE).available());
}

TEST_F(KernelFeatures, TheXdpMetadataProbeAgreesWithTheKernelOnTheRealProgram) {
    auto probe = host::probe_bpf_helper(BPF_PROG_TYPE_XDP, BPF_FUNC_xdp_adjust_meta);
    ASSERT_NE(probe.state, host::FeatureProbe::State::unknown) << probe.detail;
    std::cout << "# this kernel " << (probe.available() ? "allows" : "refuses")
              << " bpf_xdp_adjust_meta to XDP programs " << probe.detail << "\n";
    // Under tests/tools/refuse_xdp_meta.c (KNOD_EXPECT_META_REFUSED): a shim that failed to load
    // would otherwise turn this into the allowing kernel's test.
    if (getenv("KNOD_EXPECT_META_REFUSED")) {
        EXPECT_TRUE(probe.missing()) << "the refusing kernel's shim is not in effect";
        EXPECT_NE(probe.detail.find("cannot use helper bpf_xdp_adjust_meta"), std::string::npos)
            << probe.detail;
    }
    bpf::FilterOptions tc;
    tc.sim_guard = bpf::SimGuardPath::tc;
    auto loaded = bpf::FlowFilter::load(tc);
    EXPECT_EQ(loaded.ok(), probe.available())
        << (loaded.ok() ? "the tc path loaded" : loaded.error().message);
    if (!loaded.ok()) {
        // The refusal names the program and the kernel's reason, not "root and BPF support".
        EXPECT_NE(loaded.error().message.find("knod_flow_filter_meta"), std::string::npos)
            << loaded.error().message;
        EXPECT_NE(loaded.error().message.find("xdp_adjust_meta"), std::string::npos)
            << loaded.error().message;
    }
    // The other path holds no call to the helper: it loads on every kernel.
    auto xdp = bpf::FlowFilter::load();
    ASSERT_TRUE(xdp.ok()) << xdp.error().message;
    EXPECT_EQ((*xdp)->sim_guard(), bpf::SimGuardPath::xdp);
    EXPECT_GE((*xdp)->program_fd(), 0);
    EXPECT_GE((*xdp)->guard_test_program_fd(), 0);
}

TEST_F(KernelFeatures, TheDoctorsChecksNameWhatEachMissingFeatureCosts) {
    auto features = host::probe_kernel_features();
    auto checks = host::kernel_feature_checks(features);
    ASSERT_EQ(checks.size(), features.size());
    bool saw_meta = false;
    for (std::size_t i = 0; i < checks.size(); ++i) {
        EXPECT_EQ(checks[i].id, "kernel.feature." + features[i].id);
        if (features[i].probe.missing()) {
            EXPECT_NE(checks[i].status, host::CheckStatus::pass) << checks[i].message;
            EXPECT_NE(checks[i].message.find(features[i].cost), std::string::npos);
            EXPECT_FALSE(checks[i].fix.empty());
        }
        if (features[i].probe.available()) {
            EXPECT_EQ(checks[i].status, host::CheckStatus::pass) << checks[i].message;
        }
        if (features[i].id == "bpf.helper.xdp_adjust_meta") {
            saw_meta = true;
            // A refused helper the sim works around is information, not a failure.
            if (features[i].probe.missing()) {
                EXPECT_EQ(checks[i].status, host::CheckStatus::info);
                EXPECT_NE(checks[i].message.find("--sim-guard=xdp"), std::string::npos);
            }
        }
    }
    EXPECT_TRUE(saw_meta);
}

TEST_F(KernelFeatures, TcBpfIsProbedInANamespaceOfItsOwn) {
    auto before = host::probe_tc_bpf();
    EXPECT_TRUE(before.available()) << before.detail;
    // The host's loopback got no clsact qdisc from the probe.
    FILE *tc = popen("tc qdisc show dev lo 2>&1", "r");
    ASSERT_NE(tc, nullptr);
    char buf[4096];
    std::string out;
    while (fgets(buf, sizeof buf, tc))
        out += buf;
    pclose(tc);
    EXPECT_EQ(out.find("clsact"), std::string::npos) << out;
}

} // namespace
