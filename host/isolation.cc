#include "host/isolation.h"
#include "knod/dir.h"

#include "host/sysfs_util.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

DomainType parse_type(const std::string &t) {
    if (t == "identity") return DomainType::identity;
    if (t == "DMA") return DomainType::dma;
    if (t == "DMA-FQ") return DomainType::dma_fq;
    if (t == "blocked") return DomainType::blocked;
    if (t == "unmanaged") return DomainType::unmanaged;
    return DomainType::unknown;
}

// "0000:c1:00.1" and "0000:c1:00.0" are functions of one device: they share a group by nature.
bool same_device(const std::string &a, const std::string &b) {
    auto slot = [](const std::string &s) { return s.substr(0, s.rfind('.')); };
    return slot(a) == slot(b);
}

std::string describe(const DeviceIsolation &d, const char *role) {
    std::string name = std::string(role) + " " + (d.pci.empty() ? "(simulated)" : d.pci);
    if (!d.group) return name;
    return name + " (IOMMU group " + std::to_string(*d.group) + ", " + to_string(d.type) + ")";
}

// Checks one device; an empty reason means it passes.
Verdict check_one(policy::IommuRequirement req, const DeviceIsolation &d, const char *role) {
    if (d.pci.empty())
        return {false, describe(d, role) + " has no IOMMU: it is simulated",
                "for simulated devices set iommu = \"any\" in the rule"};
    if (!d.group)
        return {false, describe(d, role) + " is not behind an IOMMU",
                "enable the IOMMU in firmware and on the kernel command line (amd_iommu=on or "
                "intel_iommu=on), or set iommu = \"any\" to accept untranslated DMA"};
    if (!d.peers.empty()) {
        std::string peers;
        for (auto &p : d.peers)
            peers += (peers.empty() ? "" : ", ") + p;
        return {false, describe(d, role) + " shares its group with " + peers,
                "move the device to a slot of its own or behind an ACS-capable switch so that it "
                "gets its own IOMMU group"};
    }
    bool translated = d.type == DomainType::dma || d.type == DomainType::dma_fq;
    if (translated) return {true, {}, {}};
    if (d.type == DomainType::identity && req == policy::IommuRequirement::passthrough_ok)
        return {true, {}, {}};
    if (d.type == DomainType::identity)
        return {
            false, describe(d, role) + " is in pass-through (identity) mode",
            "drop iommu=pt and iommu.passthrough=1 from the kernel command line, or set iommu = "
            "\"passthrough-ok\" in the rule"};
    return {false, describe(d, role) + " is in a " + to_string(d.type) + " domain",
            "release the device from whatever owns its group (VFIO, another driver)"};
}

} // namespace

const char *to_string(DomainType t) {
    switch (t) {
    case DomainType::none:
        return "no IOMMU";
    case DomainType::identity:
        return "identity";
    case DomainType::dma:
        return "DMA";
    case DomainType::dma_fq:
        return "DMA-FQ";
    case DomainType::blocked:
        return "blocked";
    case DomainType::unmanaged:
        return "unmanaged";
    case DomainType::unknown:
        return "unknown";
    }
    return "?";
}

DeviceIsolation SysfsHost::device(const std::string &pci) const {
    DeviceIsolation d;
    d.pci = pci;
    if (pci.empty()) return d;
    std::error_code ec;
    fs::path link = fs::path(sysfs_) / "bus/pci/devices" / pci / "iommu_group";
    fs::path target = fs::read_symlink(link, ec);
    if (ec) return d; // no IOMMU group: not translated
    fs::path group_dir = fs::weakly_canonical(link.parent_path() / target, ec);
    try {
        d.group = std::stoi(group_dir.filename().string());
    } catch (...) {
        return d;
    }
    d.type = parse_type(read_line(group_dir / "type"));
    for (auto &member : knod::list_dir(group_dir / "devices", ec)) {
        std::string name = member.filename().string();
        if (!same_device(name, pci)) d.peers.push_back(name);
    }
    std::sort(d.peers.begin(), d.peers.end());
    return d;
}

KernelFacts SysfsHost::kernel() const {
    KernelFacts k;
    std::istringstream cmdline(read_line(fs::path(proc_) / "cmdline"));
    for (std::string word; cmdline >> word;) {
        if (word == "iommu=pt" || word.rfind("iommu.passthrough=", 0) == 0) k.iommu_cmdline = word;
        if (word == "amdgpu.knod_enable=1") k.knod_enabled = true;
    }
    std::error_code ec;
    for (auto &g : fs::directory_iterator(fs::path(sysfs_) / "kernel/iommu_groups", ec)) {
        std::string type = read_line(g.path() / "type");
        ++k.iommu_domains[type.empty() ? "unknown" : type];
    }
    k.iommu_passthrough = k.iommu_domains.contains("identity");
    k.knod_class = fs::exists(fs::path(sysfs_) / "class/knod", ec);
    return k;
}

Verdict check(policy::IommuRequirement requirement, const DeviceIsolation &nic,
              const DeviceIsolation &gpu) {
    if (requirement == policy::IommuRequirement::any) return {true, {}, {}};
    for (auto [d, role] : {std::pair{&nic, "NIC"}, std::pair{&gpu, "GPU"}}) {
        Verdict v = check_one(requirement, *d, role);
        if (!v.ok) return v;
    }
    if (nic.group && gpu.group && *nic.group == *gpu.group)
        return {false,
                "NIC " + nic.pci + " and GPU " + gpu.pci + " share IOMMU group " +
                    std::to_string(*nic.group),
                "put them in separate groups (different slots, ACS enabled on the bridge)"};
    return {true, {}, {}};
}

} // namespace knod::host
