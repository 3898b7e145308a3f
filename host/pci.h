// The PCI topology from sysfs: functions, the bridge chain above each, PCIe ACS control bits
// read from config space, and how far apart two devices are for peer-to-peer DMA. NIC-to-VRAM
// writes are peer-to-peer: where they turn around, and whether ACS sends them up through the
// IOMMU, decides whether the IOMMU sees them at all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace knod::host {

struct PciFunction {
    std::string address; // "0000:c1:00.0"
    std::uint16_t vendor = 0, device = 0;
    std::uint32_t class_code = 0; // 0x030000: VGA, 0x038000: display, 0x020000: Ethernet
    std::string driver;           // "amdgpu", "mlx5_core"; empty when unbound
    bool bridge() const { return (class_code >> 8) == 0x0604; }
};

// ACS control register bits (PCIe base spec, 7.7.8).
struct AcsControl {
    enum : std::uint16_t {
        source_validation = 1 << 0,
        translation_blocking = 1 << 1,
        request_redirect = 1 << 2,
        completion_redirect = 1 << 3,
        upstream_forwarding = 1 << 4,
        egress_control = 1 << 5,
        direct_translated = 1 << 6,
    };
    // not_applicable: PCIe asks no ACS of this function (a single-function switch upstream port
    // or endpoint), and Linux's pci_acs_enabled() counts it as isolating.
    enum class State {
        enabled,
        disabled,
        absent,
        not_applicable,
        unreadable
    } state = State::unreadable;
    std::uint16_t capability = 0, control = 0;
    std::string port; // "root port", "downstream port", "upstream port", "endpoint", ...
    bool multifunction = false;
    // The bits that send peer-to-peer requests up to the root complex and its IOMMU.
    static constexpr std::uint16_t isolating =
        source_validation | request_redirect | completion_redirect | upstream_forwarding;
    std::string describe() const; // "SV RR CR UF" or why not
};

// Where peer-to-peer traffic between two devices turns around (nvidia-smi's topo labels).
enum class P2pDistance {
    same_device,    // two functions of one device
    same_switch,    // PIX: under one PCIe switch
    same_root_port, // PXB: several switches, one root port
    host_bridge,    // PHB: through the root complex
    cross_root,     // SYS: between root complexes (sockets)
    unknown,
};
const char *to_string(P2pDistance d);
const char *label(P2pDistance d); // PIX, PXB, PHB, SYS

struct P2pPath {
    P2pDistance distance = P2pDistance::unknown;
    std::vector<std::string> bridges; // bridges the traffic crosses, in order from the first device
    std::string turnaround; // the bridge where it turns back down; empty: the root complex
};

class PciTopology {
  public:
    explicit PciTopology(std::string sysfs_root = "/sys") : sysfs_(std::move(sysfs_root)) {}
    std::optional<PciFunction> function(const std::string &address) const;
    std::vector<PciFunction> functions() const;
    // The PCI functions above `address`, nearest first, ending at the root port; empty when
    // the device is unknown. `root` gets the host bridge ("pci0000:00").
    std::vector<std::string> upstream(const std::string &address,
                                      std::string *root = nullptr) const;
    P2pPath path(const std::string &a, const std::string &b) const;
    // ACS of one function as Linux's pci_acs_enabled() judges it: root and downstream ports
    // need ACS; upstream ports and endpoints only when multi-function; PCI bridges never
    // isolate; a redirect the port cannot do (absent from its ACS capability) counts as on.
    // Reads the PCIe and ACS capabilities from the `config` file (past 64 bytes only with
    // CAP_SYS_ADMIN).
    AcsControl acs(const std::string &address) const;

  private:
    std::string sysfs_;
};

} // namespace knod::host
