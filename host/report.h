// The host report: inventory (GPUs, netdevs, kernel, ROCm) and every isolation check with
// pass/warn/fail and the fix. `knod-policy doctor` prints it; the daemon's GetHostReport
// returns the same JSON.
#pragma once

#include "host/gpu_inventory.h"
#include "host/isolation.h"
#include "host/kernel_config.h"
#include "host/netdev_inventory.h"
#include "host/paths.h"
#include "host/pci.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace knod::host {

enum class CheckStatus { pass, info, warn, fail };
const char *to_string(CheckStatus s);

struct HostCheck {
    std::string id;      // "kernel.pci_p2pdma", "pair.acs", "gpu.support"
    std::string subject; // what it is about: "0000:03:00.0", "eth2 -> 0000:03:00.0"
    CheckStatus status = CheckStatus::info;
    std::string message;
    std::string fix; // empty when there is nothing to do
};

struct HostReport {
    std::vector<Gpu> gpus;
    std::vector<Netdev> netdevs;
    std::string netdev_error; // why the netdev list is missing, if it is
    KernelFacts kernel;
    KernelConfig config;
    std::optional<RocmVersion> rocm;
    std::size_t iommu_groups = 0;
    std::vector<HostCheck> checks;

    bool failed() const;
    nlohmann::json to_json() const;
};

// NIC and GPU to check as a pair: a PCI address or a netdev name for the NIC, a PCI address or
// render node for the GPU. Empty: every PCI netdev with every GPU.
struct PairSelection {
    std::string nic, gpu;
};

Result<HostReport> build_report(const HostPaths &paths, const PairSelection &pairs = {});

} // namespace knod::host
