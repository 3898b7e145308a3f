#include "host/gpu_inventory.h"
#include "knod/dir.h"

#include "host/sysfs_util.h"

#include <amdgpu.h>
#include <amdgpu_drm.h>
#include <fcntl.h>
#include <unistd.h>
#include <xf86drm.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

constexpr std::uint16_t amd_vendor = 0x1002;

struct KnownChip {
    const char *model;
    const char *family;
    GpuSupport support;
};

// PCI device ids of the chips the article names, and the generations around them.
const std::map<std::uint16_t, KnownChip> &known_chips() {
    static const std::map<std::uint16_t, KnownChip> chips = {
        {0x738c, {"AMD Instinct MI100", "CDNA", GpuSupport::unsupported}},
        {0x7408, {"AMD Instinct MI250X", "CDNA2", GpuSupport::supported}},
        {0x740c, {"AMD Instinct MI250X/MI250", "CDNA2", GpuSupport::supported}},
        {0x740f, {"AMD Instinct MI210", "CDNA2", GpuSupport::supported}},
        {0x74a0, {"AMD Instinct MI300A", "CDNA3", GpuSupport::supported}},
        {0x74a1, {"AMD Instinct MI300X", "CDNA3", GpuSupport::supported}},
        {0x74a5, {"AMD Instinct MI325X", "CDNA3", GpuSupport::supported}},
        {0x7448, {"AMD Radeon Pro W7900", "RDNA3", GpuSupport::supported}},
        {0x73a3, {"AMD Radeon Pro W6800", "RDNA2", GpuSupport::supported}},
        {0x744c, {"AMD Radeon RX 7900 XTX/XT", "RDNA3", GpuSupport::possible}},
    };
    return chips;
}

std::string pci_address(const drmPciBusInfo &b) {
    char s[32];
    std::snprintf(s, sizeof s, "%04x:%02x:%02x.%u", b.domain, b.bus, b.dev, b.func);
    return s;
}

bool is_display_class(std::uint32_t class_code) {
    return (class_code >> 16) == 0x03; // VGA, 3D or other display controller
}

// From the sysfs device directory: driver, render node, VRAM (amdgpu writes it there).
void read_sysfs(const fs::path &dir, Gpu &g) {
    g.driver = link_name(dir / "driver");
    if (g.render_node.empty()) {
        std::error_code ec;
        for (auto &e : knod::list_dir(dir / "drm", ec)) {
            std::string n = e.filename().string();
            if (n.rfind("renderD", 0) == 0) g.render_node = "/dev/dri/" + n;
        }
    }
    if (!g.vram_bytes) g.vram_bytes = read_number(dir / "mem_info_vram_total").value_or(0);
}

// libdrm_amdgpu on the render node: VRAM and the marketing name, when we may open it.
void read_amdgpu(Gpu &g) {
    int fd = ::open(g.render_node.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    std::uint32_t major = 0, minor = 0;
    amdgpu_device_handle dev = nullptr;
    if (amdgpu_device_initialize(fd, &major, &minor, &dev) == 0) {
        drm_amdgpu_info_vram_gtt vram{};
        if (amdgpu_query_info(dev, AMDGPU_INFO_VRAM_GTT, sizeof vram, &vram) == 0)
            g.vram_bytes = vram.vram_size;
        if (const char *name = amdgpu_get_marketing_name(dev)) g.model = name;
        // The id table names the generations KNOD cares about; the kernel's family id says
        // the rest (141: gfx9, Vega and CDNA; 143: RDNA1/2; 145: RDNA3; 152: RDNA4).
        amdgpu_gpu_info info{};
        if (g.family.empty() && amdgpu_query_gpu_info(dev, &info) == 0)
            g.family = "amdgpu family " + std::to_string(info.family_id);
        amdgpu_device_deinitialize(dev);
    }
    ::close(fd);
}

std::vector<Gpu> from_drm(const HostPaths &paths) {
    std::vector<Gpu> out;
    int n = drmGetDevices2(0, nullptr, 0);
    if (n <= 0) return out;
    std::vector<drmDevicePtr> devices(static_cast<std::size_t>(n));
    n = drmGetDevices2(0, devices.data(), n);
    for (int i = 0; i < n; ++i) {
        drmDevicePtr d = devices[static_cast<std::size_t>(i)];
        if (d->bustype != DRM_BUS_PCI) continue;
        Gpu g;
        g.pci = pci_address(*d->businfo.pci);
        g.vendor = d->deviceinfo.pci->vendor_id;
        g.device = d->deviceinfo.pci->device_id;
        if (d->available_nodes & (1 << DRM_NODE_RENDER)) g.render_node = d->nodes[DRM_NODE_RENDER];
        classify(g);
        read_sysfs(fs::path(paths.sysfs) / "bus/pci/devices" / g.pci, g);
        if (g.driver == "amdgpu") read_amdgpu(g);
        out.push_back(std::move(g));
    }
    drmFreeDevices(devices.data(), n);
    return out;
}

std::vector<Gpu> from_sysfs(const HostPaths &paths) {
    std::vector<Gpu> out;
    std::error_code ec;
    for (auto &e : knod::list_dir(fs::path(paths.sysfs) / "bus/pci/devices", ec)) {
        auto cls = read_number(e / "class");
        if (!cls || !is_display_class(static_cast<std::uint32_t>(*cls))) continue;
        Gpu g;
        g.pci = e.filename().string();
        g.vendor = static_cast<std::uint16_t>(read_number(e / "vendor").value_or(0));
        g.device = static_cast<std::uint16_t>(read_number(e / "device").value_or(0));
        classify(g);
        read_sysfs(e, g);
        out.push_back(std::move(g));
    }
    return out;
}

} // namespace

const char *to_string(GpuSupport s) {
    switch (s) {
    case GpuSupport::supported:
        return "supported";
    case GpuSupport::possible:
        return "possible, unsupported";
    case GpuSupport::unsupported:
        return "unsupported";
    }
    return "?";
}

void classify(Gpu &g) {
    auto it = g.vendor == amd_vendor ? known_chips().find(g.device) : known_chips().end();
    if (it == known_chips().end()) {
        g.support = GpuSupport::unsupported;
        g.support_note = g.vendor == amd_vendor
                             ? "an AMD GPU outside KNOD's list (CDNA2 and newer, Radeon Pro "
                               "W7900/W6800)"
                             : "KNOD drives AMD GPUs only";
        return;
    }
    if (g.model.empty()) g.model = it->second.model;
    g.family = it->second.family;
    g.support = it->second.support;
    switch (g.support) {
    case GpuSupport::supported:
        g.support_note = std::string(it->second.family) + ": on KNOD's supported list";
        break;
    case GpuSupport::possible:
        g.support_note = "consumer RDNA3: works through dma-buf, not guaranteed by KNOD";
        break;
    case GpuSupport::unsupported:
        g.support_note = std::string(it->second.family) + ": older than CDNA2";
        break;
    }
}

std::vector<Gpu> list_gpus(const HostPaths &paths) {
    auto out = from_sysfs(paths);
    if (paths.live()) {
        // libdrm sees only devices a DRM driver took; a GPU whose driver did not load is still
        // a GPU (and still a peer of the NIC): keep the display-class functions it missed.
        auto drm = from_drm(paths);
        for (auto &g : out)
            if (std::none_of(drm.begin(), drm.end(), [&](const Gpu &d) { return d.pci == g.pci; }))
                drm.push_back(std::move(g));
        out = std::move(drm);
    }
    std::sort(out.begin(), out.end(), [](const Gpu &a, const Gpu &b) { return a.pci < b.pci; });
    return out;
}

std::vector<std::string> names_of(const Gpu &gpu) {
    std::vector<std::string> names{gpu.pci};
    if (!gpu.render_node.empty()) names.push_back(gpu.render_node);
    return names;
}

const Gpu *find_gpu(const std::vector<Gpu> &gpus, const std::string &name) {
    for (auto &g : gpus) {
        auto names = names_of(g);
        if (std::find(names.begin(), names.end(), name) != names.end()) return &g;
    }
    return nullptr;
}

std::optional<RocmVersion> rocm_version(const HostPaths &paths) {
    std::string text = read_line(fs::path(paths.rocm) / ".info/version");
    if (text.empty()) return std::nullopt;
    RocmVersion v;
    v.text = text;
    if (std::sscanf(text.c_str(), "%d.%d", &v.major, &v.minor) != 2) v.major = v.minor = 0;
    return v;
}

} // namespace knod::host
