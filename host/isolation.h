// IOMMU isolation from sysfs: which IOMMU group a PCI device is in, the group's domain type,
// and who else shares it; plus the kernel facts that bear on it. Roots are parameters so tests
// run on fixture trees. Decides whether a rule's `iommu` requirement holds for a NIC and a GPU.
#pragma once

#include "policy/policy.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace knod::host {

enum class DomainType { none, identity, dma, dma_fq, blocked, unmanaged, unknown };
const char *to_string(DomainType t);

struct DeviceIsolation {
    std::string pci;          // "0000:c1:00.0"; empty for a simulated device
    std::optional<int> group; // none: no IOMMU translates this device
    DomainType type = DomainType::none;
    std::vector<std::string> peers; // other devices in the group, other functions excluded
};

struct KernelFacts {
    // Some IOMMU group has an identity (pass-through) domain: its devices' DMA is untranslated.
    // Read from the groups' type, which iommu=pt, iommu.passthrough=1, a kernel built with
    // IOMMU_DEFAULT_PASSTHROUGH or a per-group sysfs write all set; the command line alone
    // misses all but the first.
    bool iommu_passthrough = false;
    std::map<std::string, std::size_t> iommu_domains; // group type ("DMA-FQ") -> groups
    std::string iommu_cmdline; // "iommu=pt" or "iommu.passthrough=1" as given; empty: neither
    bool knod_enabled = false; // amdgpu.knod_enable=1
    bool knod_class = false;   // /sys/class/knod exists
};

struct Verdict {
    bool ok = false;
    std::string reason; // names the device and the group
    std::string fix;    // what an admin can do
};

class SysfsHost {
  public:
    explicit SysfsHost(std::string sysfs_root = "/sys", std::string proc_root = "/proc")
        : sysfs_(std::move(sysfs_root)), proc_(std::move(proc_root)) {}
    DeviceIsolation device(const std::string &pci) const;
    KernelFacts kernel() const;

  private:
    std::string sysfs_, proc_;
};

// Whether `requirement` holds for a binding of `nic` to `gpu`.
Verdict check(policy::IommuRequirement requirement, const DeviceIsolation &nic,
              const DeviceIsolation &gpu);

} // namespace knod::host
