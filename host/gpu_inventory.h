// GPUs on the host: PCI address, ids, render node, driver, VRAM, and whether KNOD supports the
// chip (the article: CDNA2 and newer, Radeon Pro W7900/W6800; consumer RDNA3 works but is not
// guaranteed). On the live machine libdrm lists the devices and libdrm_amdgpu reads VRAM and
// the marketing name; on fixture trees sysfs alone does (amdgpu's mem_info_vram_total).
#pragma once

#include "host/paths.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace knod::host {

enum class GpuSupport { supported, possible, unsupported };
const char *to_string(GpuSupport s);

struct Gpu {
    std::string pci;
    std::uint16_t vendor = 0, device = 0;
    std::string driver;
    std::string render_node; // "/dev/dri/renderD128"; empty without DRM
    std::string model;       // "AMD Instinct MI250X", from libdrm or the id table
    std::string family;      // "CDNA2", "RDNA3", ...
    std::uint64_t vram_bytes = 0;
    GpuSupport support = GpuSupport::unsupported;
    std::string support_note;
};

// What the article's support matrix says about one PCI id.
void classify(Gpu &gpu);

std::vector<Gpu> list_gpus(const HostPaths &paths);

// Every name a GPU goes by in requests and in rules' `gpus` globs: its PCI address, then its
// render node when it has one. The daemon's hardware backends and `knod-policy explain` both
// resolve names here, so a rule naming either one matches a request naming the other.
std::vector<std::string> names_of(const Gpu &gpu);

// The GPU among `gpus` that goes by `name` (any of names_of); nullptr when none does.
const Gpu *find_gpu(const std::vector<Gpu> &gpus, const std::string &name);

struct RocmVersion {
    std::string text; // "6.2.1-112"; empty when ROCm is not installed
    int major = 0, minor = 0;
    bool at_least(int maj, int min) const { return major > maj || (major == maj && minor >= min); }
};
std::optional<RocmVersion> rocm_version(const HostPaths &paths);

} // namespace knod::host
