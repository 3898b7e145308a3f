// IOMMU isolation checks on fixture sysfs trees shaped like real machines: built by the test in
// a temporary folder (groups, types, device links), removed afterwards.
#include "host/isolation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace knod;
using namespace knod::host;
using policy::IommuRequirement;
namespace fs = std::filesystem;

namespace {

class FixtureHost {
  public:
    FixtureHost() : root_(fs::temp_directory_path() / ("knod-sysfs-" + std::to_string(getpid()))) {
        fs::remove_all(root_);
        fs::create_directories(root_ / "sys/bus/pci/devices");
        fs::create_directories(root_ / "proc");
        cmdline("console=ttyS0");
    }
    ~FixtureHost() { fs::remove_all(root_); }

    // Puts `devices` in IOMMU group `group` with domain `type`, as the kernel lays it out.
    void group(int group, const std::string &type, std::vector<std::string> devices) {
        fs::path g = root_ / "sys/kernel/iommu_groups" / std::to_string(group);
        fs::create_directories(g / "devices");
        std::ofstream(g / "type") << type << "\n";
        for (auto &d : devices) {
            fs::path dev = root_ / "sys/devices/pci0000:00" / d;
            fs::create_directories(dev);
            fs::create_symlink(fs::relative(g, dev),
                               dev / "iommu_group"); // relative, as sysfs has it
            fs::create_directory_symlink(dev, g / "devices" / d);
            if (!fs::exists(root_ / "sys/bus/pci/devices" / d))
                fs::create_directory_symlink(dev, root_ / "sys/bus/pci/devices" / d);
        }
    }
    void device_without_iommu(const std::string &d) {
        fs::path dev = root_ / "sys/devices/pci0000:00" / d;
        fs::create_directories(dev);
        fs::create_directory_symlink(dev, root_ / "sys/bus/pci/devices" / d);
    }
    void cmdline(const std::string &text) { std::ofstream(root_ / "proc/cmdline") << text << "\n"; }
    SysfsHost host() const {
        return SysfsHost((root_ / "sys").string(), (root_ / "proc").string());
    }

  private:
    fs::path root_;
};

const std::string gpu = "0000:c1:00.0", gpu_audio = "0000:c1:00.1", nic = "0000:c2:00.0";

} // namespace

TEST(Isolation, Mi250xAndConnectX6InGroupsOfTheirOwn) {
    FixtureHost f;
    f.group(12, "DMA-FQ", {gpu, gpu_audio}); // a GPU's other function shares by nature
    f.group(13, "DMA", {nic});
    auto h = f.host();
    DeviceIsolation g = h.device(gpu), n = h.device(nic);
    EXPECT_EQ(g.group, 12);
    EXPECT_EQ(g.type, DomainType::dma_fq);
    EXPECT_TRUE(g.peers.empty());
    EXPECT_TRUE(check(IommuRequirement::translated, n, g).ok);
    EXPECT_TRUE(check(IommuRequirement::passthrough_ok, n, g).ok);
}

TEST(Isolation, GpuSharingItsGroupIsAViolationNamingThePeer) {
    FixtureHost f;
    f.group(7, "DMA", {gpu, "0000:c3:00.0"});
    f.group(8, "DMA", {nic});
    auto h = f.host();
    Verdict v = check(IommuRequirement::translated, h.device(nic), h.device(gpu));
    EXPECT_FALSE(v.ok);
    EXPECT_NE(
        v.reason.find("GPU 0000:c1:00.0 (IOMMU group 7, DMA) shares its group with 0000:c3:00.0"),
        std::string::npos)
        << v.reason;
    EXPECT_NE(v.fix.find("ACS"), std::string::npos);
    EXPECT_TRUE(check(IommuRequirement::any, h.device(nic), h.device(gpu)).ok);
}

TEST(Isolation, NicAndGpuInOneGroupIsAViolation) {
    FixtureHost f;
    f.group(5, "DMA", {gpu, nic});
    auto h = f.host();
    EXPECT_FALSE(check(IommuRequirement::translated, h.device(nic), h.device(gpu)).ok);
}

TEST(Isolation, IdentityDomainsPassOnlyPassthroughOk) {
    FixtureHost f;
    f.group(3, "identity", {gpu});
    f.group(4, "identity", {nic});
    f.cmdline("root=/dev/sda1 iommu=pt amdgpu.knod_enable=1");
    auto h = f.host();
    Verdict strict = check(IommuRequirement::translated, h.device(nic), h.device(gpu));
    EXPECT_FALSE(strict.ok);
    EXPECT_NE(strict.reason.find("pass-through"), std::string::npos) << strict.reason;
    EXPECT_TRUE(check(IommuRequirement::passthrough_ok, h.device(nic), h.device(gpu)).ok);
    KernelFacts k = h.kernel();
    EXPECT_TRUE(k.iommu_passthrough);
    EXPECT_TRUE(k.knod_enabled);
    EXPECT_FALSE(k.knod_class);
}

TEST(Isolation, NoIommuAtAllLikeTheseVms) {
    FixtureHost f;
    f.device_without_iommu(gpu);
    f.device_without_iommu(nic);
    auto h = f.host();
    EXPECT_FALSE(h.device(gpu).group.has_value());
    for (auto req : {IommuRequirement::translated, IommuRequirement::passthrough_ok}) {
        Verdict v = check(req, h.device(nic), h.device(gpu));
        EXPECT_FALSE(v.ok);
        EXPECT_NE(v.reason.find("not behind an IOMMU"), std::string::npos) << v.reason;
    }
    EXPECT_TRUE(check(IommuRequirement::any, h.device(nic), h.device(gpu)).ok);
}

TEST(Isolation, SimulatedDevicesNeedIommuAny) {
    DeviceIsolation sim; // no PCI address
    Verdict v = check(IommuRequirement::translated, sim, sim);
    EXPECT_FALSE(v.ok);
    EXPECT_NE(v.fix.find("iommu = \"any\""), std::string::npos);
    EXPECT_TRUE(check(IommuRequirement::any, sim, sim).ok);
}
