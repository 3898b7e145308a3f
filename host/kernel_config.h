// The running kernel's build configuration, from /proc/config.gz or /boot/config-RELEASE:
// PCI_P2PDMA and DMABUF_MOVE_NOTIFY decide whether amdgpu can hand a NIC its VRAM at all.
#pragma once

#include "host/paths.h"

#include <map>
#include <string>

namespace knod::host {

enum class ConfigValue { yes, module, no, unknown };
const char *to_string(ConfigValue v);

struct KernelConfig {
    std::string release; // from proc/sys/kernel/osrelease
    std::string source;  // the file it was read from; empty when none was readable
    std::map<std::string, std::string> options; // "CONFIG_PCI_P2PDMA" -> "y"
    // `no` when the file was read and the option is absent or "is not set".
    ConfigValue get(const std::string &option) const;
};

KernelConfig read_kernel_config(const HostPaths &paths);

} // namespace knod::host
