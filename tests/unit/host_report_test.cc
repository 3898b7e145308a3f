// The host inventory, PCI topology and report on the fixture machines of tests/data/hosts
// (see make_hosts.py there): each check comes out as that machine would make it.
#include "daemon/driver/selection.h"
#include "host/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include <unistd.h>

using namespace knod;
using namespace knod::host;

namespace {

HostPaths fixture(const std::string &name) {
    return HostPaths::under(KNOD_SOURCE_DIR "/tests/data/hosts/" + name);
}

const HostCheck &find(const HostReport &r, const std::string &id, const std::string &subject = {}) {
    auto it = std::find_if(r.checks.begin(), r.checks.end(), [&](const HostCheck &c) {
        return c.id == id && (subject.empty() || c.subject.find(subject) != std::string::npos);
    });
    if (it == r.checks.end()) throw std::runtime_error("no check " + id + " " + subject);
    return *it;
}

} // namespace

TEST(PciTopology, UpstreamChainAndSwitchDistance) {
    PciTopology pci(fixture("mi250x-cx6").sysfs);
    std::string root;
    auto up = pci.upstream("0000:03:00.0", &root);
    EXPECT_EQ(root, "pci0000:00");
    EXPECT_EQ(up, (std::vector<std::string>{"0000:02:00.0", "0000:01:00.0", "0000:00:01.1"}));
    auto path = pci.path("0000:04:00.0", "0000:03:00.0");
    EXPECT_EQ(path.distance, P2pDistance::same_switch);
    EXPECT_EQ(path.turnaround, "0000:01:00.0");
    EXPECT_EQ(path.bridges,
              (std::vector<std::string>{"0000:02:01.0", "0000:01:00.0", "0000:02:00.0"}));
    EXPECT_EQ(pci.path("0000:04:00.0", "0000:04:00.1").distance, P2pDistance::same_device);
    EXPECT_TRUE(pci.upstream("0000:ff:00.0").empty());
}

TEST(PciTopology, CrossRootComplex) {
    PciTopology pci(fixture("identity").sysfs);
    auto path = pci.path("0000:c1:00.0", "0000:41:00.0");
    EXPECT_EQ(path.distance, P2pDistance::cross_root);
    EXPECT_STREQ(label(path.distance), "SYS");
    EXPECT_EQ(path.bridges, (std::vector<std::string>{"0000:c0:01.1", "0000:40:01.1"}));
}

TEST(PciTopology, AcsFromConfigSpace) {
    PciTopology on(fixture("mi250x-cx6").sysfs), off(fixture("shared-group").sysfs);
    auto a = on.acs("0000:02:00.0");
    EXPECT_EQ(a.state, AcsControl::State::enabled);
    EXPECT_EQ(a.describe(), "ACS SV RR CR UF");
    EXPECT_EQ(on.acs("0000:01:00.0").state, AcsControl::State::not_applicable)
        << "single-function switch upstream port";
    EXPECT_EQ(on.acs("0000:04:00.0").state, AcsControl::State::absent)
        << "a multi-function endpoint needs ACS between its functions";
    EXPECT_EQ(off.acs("0000:02:01.0").state, AcsControl::State::disabled);
    EXPECT_EQ(off.acs("0000:00:01.0").state, AcsControl::State::absent);
    EXPECT_EQ(on.acs("0000:ff:00.0").state, AcsControl::State::unreadable);
}

TEST(GpuInventory, ClassifiesTheArticlesSupportMatrix) {
    auto mi = list_gpus(fixture("mi250x-cx6"));
    ASSERT_EQ(mi.size(), 1u);
    EXPECT_EQ(mi[0].pci, "0000:03:00.0");
    EXPECT_EQ(mi[0].family, "CDNA2");
    EXPECT_EQ(mi[0].support, GpuSupport::supported);
    EXPECT_EQ(mi[0].vram_bytes, 68702699520ull);
    EXPECT_EQ(mi[0].render_node, "/dev/dri/renderD128");
    EXPECT_EQ(mi[0].driver, "amdgpu");
    auto xtx = list_gpus(fixture("shared-group"));
    ASSERT_EQ(xtx.size(), 1u) << "the HDMI audio function is not a GPU";
    EXPECT_EQ(xtx[0].support, GpuSupport::possible);
    Gpu other;
    other.vendor = 0x1002;
    other.device = 0x738c;
    classify(other);
    EXPECT_EQ(other.support, GpuSupport::unsupported) << "MI100 is CDNA1";
    Gpu nv;
    nv.vendor = 0x10de;
    nv.device = 0x2335;
    classify(nv);
    EXPECT_EQ(nv.support, GpuSupport::unsupported);
    EXPECT_TRUE(list_gpus(fixture("no-iommu")).empty());
}

TEST(NetdevInventory, FromSysfsWithParentPciAndDriver) {
    auto list = list_netdevs(fixture("no-iommu"));
    ASSERT_TRUE(list);
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].name, "eth0");
    EXPECT_EQ((*list)[0].pci, "0000:00:03.0")
        << "virtio's netdev sits one level below its PCI function";
    EXPECT_EQ((*list)[0].driver, "virtio_net");
    EXPECT_EQ((*list)[0].rx_queues, 2u);
    auto cx = list_netdevs(fixture("mi250x-cx6"));
    ASSERT_TRUE(cx);
    ASSERT_EQ(cx->size(), 2u);
    EXPECT_EQ((*cx)[0].driver, "mlx5_core");
    EXPECT_TRUE(devmem_capable_driver((*cx)[0].driver));
    EXPECT_FALSE(devmem_capable_driver("virtio_net"));
}

TEST(KernelConfig, FromProcConfigGzFromBootOrNothing) {
    auto gz = read_kernel_config(fixture("mi250x-cx6"));
    EXPECT_EQ(gz.get("CONFIG_PCI_P2PDMA"), ConfigValue::yes);
    EXPECT_NE(gz.source.find("proc/config.gz"), std::string::npos);
    auto boot = read_kernel_config(fixture("shared-group"));
    EXPECT_EQ(boot.release, "6.8.0-45-generic");
    EXPECT_NE(boot.source.find("boot/config-6.8.0-45-generic"), std::string::npos);
    EXPECT_EQ(boot.get("CONFIG_PCI_P2PDMA"), ConfigValue::no);
    auto none = read_kernel_config(fixture("no-iommu"));
    EXPECT_EQ(none.get("CONFIG_PCI_P2PDMA"), ConfigValue::unknown);
}

TEST(HostReport, SwitchWithAcsPassesEverything) {
    auto r = build_report(fixture("mi250x-cx6"), {"eth2", ""});
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_FALSE(r->failed()) << r->to_json().dump(2);
    EXPECT_EQ(find(*r, "pair.p2p").message.substr(0, 4), "PIX:");
    EXPECT_EQ(find(*r, "pair.acs").status, CheckStatus::pass);
    EXPECT_EQ(find(*r, "rocm").status, CheckStatus::pass);
    EXPECT_EQ(find(*r, "knod.class").status, CheckStatus::pass);
    EXPECT_EQ(r->to_json()["result"], "pass");
}

TEST(HostReport, SharedGroupWithoutAcsFailsAndSaysWhy) {
    auto r = build_report(fixture("shared-group"));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_TRUE(r->failed());
    auto &iso = find(*r, "pair.iommu.translated");
    EXPECT_EQ(iso.status, CheckStatus::fail);
    EXPECT_NE(iso.message.find("shares its group with"), std::string::npos);
    EXPECT_NE(iso.message.find("0000:05:00.0"), std::string::npos) << "names the NVMe drive";
    auto &acs = find(*r, "pair.acs");
    EXPECT_EQ(acs.status, CheckStatus::fail);
    EXPECT_NE(acs.message.find("0000:02:01.0"), std::string::npos);
    EXPECT_EQ(acs.message.find("0000:01:00.0"), std::string::npos)
        << "the upstream port is where the traffic turns around";
    auto &p2p = find(*r, "kernel.pci_p2pdma");
    EXPECT_EQ(p2p.status, CheckStatus::warn);
    EXPECT_NE(p2p.message.find("pins it there, so packets land in CPU memory, not VRAM"),
              std::string::npos);
    EXPECT_EQ(find(*r, "rocm").status, CheckStatus::warn);
    EXPECT_EQ(find(*r, "gpu.support").status, CheckStatus::warn);
}

TEST(HostReport, IdentityDomainsFailTranslatedButPassPassthrough) {
    auto r = build_report(fixture("identity"));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(find(*r, "pair.iommu.translated").status, CheckStatus::fail);
    EXPECT_EQ(find(*r, "pair.iommu.passthrough-ok").status, CheckStatus::pass);
    EXPECT_EQ(find(*r, "kernel.iommu_pt").status, CheckStatus::warn);
    EXPECT_EQ(find(*r, "pair.p2p").status, CheckStatus::warn) << "across root complexes";
}

TEST(HostReport, NoIommuFails) {
    auto r = build_report(fixture("no-iommu"));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(find(*r, "iommu").status, CheckStatus::fail);
    EXPECT_EQ(find(*r, "kernel.config").status, CheckStatus::warn);
    EXPECT_EQ(find(*r, "gpu").status, CheckStatus::warn);
}

// Issue 17, item 4: on a live 6.12, iommu.passthrough=1 gives identity groups as iommu=pt does,
// and no IOMMU translates nothing; the command line's iommu=pt alone missed both.
TEST(HostReport, IommuPtReadsTheGroupsDomainNotTheCommandLine) {
    auto pt = build_report(fixture("passthrough-switch"));
    ASSERT_TRUE(pt) << pt.error().message;
    auto &c = find(*pt, "kernel.iommu_pt");
    EXPECT_EQ(c.status, CheckStatus::warn) << c.message;
    EXPECT_NE(c.message.find("identity"), std::string::npos) << c.message;
    EXPECT_NE(c.message.find("iommu.passthrough=1"), std::string::npos) << c.message;
    EXPECT_EQ(pt->to_json()["kernel"]["iommu_pt"], true);
    EXPECT_EQ(pt->to_json()["kernel"]["iommu_domains"]["identity"], 6);
    EXPECT_EQ(find(*pt, "pair.iommu.translated").status, CheckStatus::fail);

    auto none = build_report(fixture("no-iommu"));
    ASSERT_TRUE(none) << none.error().message;
    auto &n = find(*none, "kernel.iommu_pt");
    EXPECT_NE(n.status, CheckStatus::pass);
    EXPECT_EQ(n.message.find("DMA is translated"), std::string::npos) << n.message;
    EXPECT_NE(n.message.find("no IOMMU"), std::string::npos) << n.message;

    auto dma = build_report(fixture("mi250x-cx6"));
    ASSERT_TRUE(dma) << dma.error().message;
    auto &d = find(*dma, "kernel.iommu_pt");
    EXPECT_EQ(d.status, CheckStatus::pass);
    EXPECT_NE(d.message.find("4 DMA, 2 DMA-FQ"), std::string::npos) << d.message;
    EXPECT_EQ(dma->to_json()["kernel"]["iommu_pt"], false);
}

// Issue 17, item 7: Linux's pci_acs_enabled() asks no ACS of a single-function switch upstream
// port, and a redirect a port's ACS capability lacks counts as on.
TEST(HostReport, AcsFollowsLinuxWhereItIsNotApplicable) {
    PciTopology pci(fixture("passthrough-switch").sysfs);
    auto up = pci.acs("0000:01:00.0");
    EXPECT_EQ(up.state, AcsControl::State::not_applicable);
    EXPECT_EQ(up.port, "switch upstream port");
    EXPECT_EQ(pci.acs("0000:02:08.0").state, AcsControl::State::enabled);
    auto no_uf = pci.acs("0000:00:02.0");
    EXPECT_EQ(no_uf.state, AcsControl::State::enabled) << "UF is not in its capability";
    EXPECT_EQ(no_uf.port, "root port");
    auto path = pci.path("0000:03:00.0", "0000:04:00.0");
    EXPECT_EQ(path.distance, P2pDistance::host_bridge);
    EXPECT_EQ(path.bridges.size(), 4u) << "upstream port on the path, not the turnaround";

    auto r = build_report(fixture("passthrough-switch"));
    ASSERT_TRUE(r) << r.error().message;
    auto &acs = find(*r, "pair.acs");
    EXPECT_EQ(acs.status, CheckStatus::pass) << acs.message;
    EXPECT_NE(acs.message.find("0000:01:00.0 (single-function switch upstream port: ACS not "
                               "applicable)"),
              std::string::npos)
        << acs.message;
}

// Issue 17, item 6: a NIC with one RX queue is named as such, not as "every queue taken".
TEST(HostReport, OneQueueNicCannotIsolateAnything) {
    auto r = build_report(fixture("passthrough-switch"));
    ASSERT_TRUE(r) << r.error().message;
    auto &n = find(*r, "netdev", "enp3s0");
    EXPECT_EQ(n.status, CheckStatus::warn);
    EXPECT_NE(n.message.find("1 RX queue, "), std::string::npos) << n.message;
    EXPECT_NE(n.message.find("one RX queue"), std::string::npos) << n.message;
    EXPECT_NE(n.fix.find("ethtool -L enp3s0"), std::string::npos) << n.fix;
    auto cx = build_report(fixture("mi250x-cx6"));
    ASSERT_TRUE(cx);
    EXPECT_EQ(find(*cx, "netdev", "eth2").status, CheckStatus::pass) << "8 queues";
}

TEST(HostReport, UnknownSelectionIsAnError) {
    auto r = build_report(fixture("mi250x-cx6"), {"eth9", ""});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("eth9"), std::string::npos);
    EXPECT_FALSE(build_report(fixture("mi250x-cx6"), {"", "/dev/dri/renderD200"}));
}

// A PCI address this host does not have is a typo to report with the devices it does have,
// not a pair to fail with a fix that weakens the policy (issue 22).
TEST(HostReport, AbsentPciAddressIsAnErrorNamingTheHostsDevices) {
    auto gpu = build_report(fixture("mi250x-cx6"), {"", "0000:c1:00.0"});
    ASSERT_FALSE(gpu);
    EXPECT_EQ(gpu.error().code, Errc::not_found);
    EXPECT_NE(gpu.error().message.find("0000:03:00.0 (/dev/dri/renderD128)"), std::string::npos)
        << gpu.error().message;
    auto nic = build_report(fixture("mi250x-cx6"), {"0000:c2:00.0", ""});
    ASSERT_FALSE(nic);
    EXPECT_NE(nic.error().message.find("eth2 (0000:04:00.0)"), std::string::npos)
        << nic.error().message;
}

// The daemon and `explain` resolve a GPU's names here: a render node selects the same GPU as
// its PCI address.
TEST(GpuInventory, EveryNameResolvesToTheSameGpu) {
    auto gpus = list_gpus(fixture("mi250x-cx6"));
    ASSERT_EQ(gpus.size(), 1u);
    EXPECT_EQ(names_of(gpus[0]), (std::vector<std::string>{"0000:03:00.0", "/dev/dri/renderD128"}));
    ASSERT_NE(find_gpu(gpus, "/dev/dri/renderD128"), nullptr);
    EXPECT_EQ(find_gpu(gpus, "/dev/dri/renderD128")->pci, "0000:03:00.0");
    EXPECT_EQ(find_gpu(gpus, "0000:03:00.0"), find_gpu(gpus, "/dev/dri/renderD128"));
    EXPECT_EQ(find_gpu(gpus, "0000:c1:00.0"), nullptr);
    auto r = build_report(fixture("mi250x-cx6"), {"eth2", "/dev/dri/renderD128"});
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_TRUE(std::any_of(r->checks.begin(), r->checks.end(), [](const HostCheck &c) {
        return c.id == "pair.acs" && c.subject.ends_with("-> 0000:03:00.0");
    }));
}

TEST(DriverSelection, PicksKnodThenDevmemElseNone) {
    auto knod = driver::choose_driver(fixture("mi250x-cx6"));
    EXPECT_EQ(knod.driver, "knod") << knod.reason;
    EXPECT_NE(knod.reason.find("knod0, eth2 -> 0000:03:00.0"), std::string::npos) << knod.reason;
    // identity: no KNOD, an mlx5 NIC and a GPU; the live kernel has the netdev family.
    auto devmem = driver::choose_driver(fixture("identity"));
    EXPECT_EQ(devmem.driver, "devmem") << devmem.reason;
    EXPECT_NE(devmem.reason.find("ens1f0np0 (mlx5_core)"), std::string::npos) << devmem.reason;
    // Never the sim (#17 item 8: the hardened unit cannot run it): none, and why.
    auto none = driver::choose_driver(fixture("no-iommu"));
    EXPECT_EQ(none.driver, "none");
    EXPECT_NE(none.reason.find("no NIC's driver supports devmem TCP"), std::string::npos)
        << none.reason;
}

TEST(GpuInventory, LiveDrmAgreesWithSysfsOnThisMachine) {
    // libdrm lists what has a DRM driver; sysfs lists PCI display controllers. On a VM both are
    // empty; on a GPU machine with its driver bound, both name the same devices.
    std::vector<std::string> drm, pci;
    for (auto &g : list_gpus(HostPaths{}))
        drm.push_back(g.pci);
    HostPaths sysfs_only;
    sysfs_only.sysfs = "/sys/."; // not "/sys": the sysfs reader, on the live tree
    for (auto &g : list_gpus(sysfs_only))
        pci.push_back(g.pci);
    std::sort(drm.begin(), drm.end());
    EXPECT_EQ(drm, pci) << "the live list keeps display functions no DRM driver took";
}

// Issue 17, item 5: the active RX queue count (real_num_rx_queues), not the allocated one. A
// veth allocates 4 and runs 2 after `ethtool -L rx 2`; needs root (CAP_NET_ADMIN).
TEST(NetdevInventory, LiveCountsActiveRxQueuesNotAllocated) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make a veth";
    std::string a = "kq" + std::to_string(getpid() % 100000) + "a";
    std::string b = a.substr(0, a.size() - 1) + "b";
    auto sh = [](const std::string &cmd) {
        return std::system((cmd + " >/dev/null 2>&1").c_str());
    };
    if (sh("ip link add " + a + " numrxqueues 4 type veth peer name " + b + " numrxqueues 4") != 0)
        GTEST_SKIP() << "cannot make a veth here";
    int set = sh("ethtool -L " + a + " rx 2");
    auto list = list_netdevs(HostPaths{});
    sh("ip link del " + a);
    ASSERT_EQ(set, 0) << "ethtool -L failed";
    ASSERT_TRUE(list) << list.error().message;
    auto it =
        std::find_if(list->begin(), list->end(), [&](const Netdev &n) { return n.name == a; });
    ASSERT_NE(it, list->end());
    EXPECT_EQ(it->rx_queues, 2u);
    EXPECT_EQ(it->rx_queues_allocated, 4u);
    EXPECT_EQ(it->rx_queues_source, "sysfs");
}
