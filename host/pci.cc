#include "host/pci.h"
#include "knod/dir.h"

#include "host/sysfs_util.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

constexpr std::uint16_t acs_capability_id = 0x000d;
constexpr std::uint8_t pcie_capability_id = 0x10;

// PCI Express Capabilities register, Device/Port Type (PCIe base spec 7.5.3.2).
enum PciePortType : unsigned {
    pcie_endpoint = 0,
    pcie_legacy_endpoint = 1,
    pcie_root_port = 4,
    pcie_upstream = 5,
    pcie_downstream = 6,
    pcie_to_pci_bridge = 7,
    pci_to_pcie_bridge = 8,
    pcie_rc_endpoint = 9,
    pcie_rc_event_collector = 10,
};

const char *port_name(unsigned type) {
    switch (type) {
    case pcie_endpoint:
    case pcie_legacy_endpoint:
    case pcie_rc_endpoint:
        return "endpoint";
    case pcie_root_port:
        return "root port";
    case pcie_upstream:
        return "switch upstream port";
    case pcie_downstream:
        return "switch downstream port";
    case pcie_to_pci_bridge:
    case pci_to_pcie_bridge:
        return "PCIe/PCI bridge";
    case pcie_rc_event_collector:
        return "root complex event collector";
    }
    return "PCIe function";
}

// The port type from the standard capability list; nullopt: not PCI Express.
std::optional<unsigned> pcie_port_type(const std::string &cfg) {
    if (cfg.size() < 0x40 || !(static_cast<std::uint8_t>(cfg[0x06]) & 0x10)) return std::nullopt;
    std::size_t off = static_cast<std::uint8_t>(cfg[0x34]) & 0xfc;
    for (int guard = 0; guard < 48 && off >= 0x40 && off + 4 <= cfg.size(); ++guard) {
        if (static_cast<std::uint8_t>(cfg[off]) == pcie_capability_id)
            return (static_cast<std::uint8_t>(cfg[off + 2]) >> 4) & 0xf;
        off = static_cast<std::uint8_t>(cfg[off + 1]) & 0xfc;
    }
    return std::nullopt;
}

std::string slot_of(const std::string &address) {
    return address.substr(0, address.rfind('.'));
}

std::uint32_t le32(const std::string &b, std::size_t off) {
    return static_cast<std::uint8_t>(b[off]) | static_cast<std::uint8_t>(b[off + 1]) << 8 |
           static_cast<std::uint8_t>(b[off + 2]) << 16 |
           static_cast<std::uint32_t>(static_cast<std::uint8_t>(b[off + 3])) << 24;
}

} // namespace

const char *to_string(P2pDistance d) {
    switch (d) {
    case P2pDistance::same_device:
        return "same device";
    case P2pDistance::same_switch:
        return "one PCIe switch";
    case P2pDistance::same_root_port:
        return "several PCIe bridges below one root port";
    case P2pDistance::host_bridge:
        return "through the host bridge (root complex)";
    case P2pDistance::cross_root:
        return "between root complexes";
    case P2pDistance::unknown:
        return "unknown";
    }
    return "?";
}

const char *label(P2pDistance d) {
    switch (d) {
    case P2pDistance::same_device:
    case P2pDistance::same_switch:
        return "PIX";
    case P2pDistance::same_root_port:
        return "PXB";
    case P2pDistance::host_bridge:
        return "PHB";
    case P2pDistance::cross_root:
        return "SYS";
    case P2pDistance::unknown:
        return "?";
    }
    return "?";
}

std::string AcsControl::describe() const {
    switch (state) {
    case State::absent:
        return port.empty() || port == "root port" || port == "switch downstream port"
                   ? "no ACS capability"
                   : port + ": no ACS";
    case State::not_applicable:
        return "single-function " + port + ": ACS not applicable";
    case State::unreadable:
        return "config space unreadable past 64 bytes (needs CAP_SYS_ADMIN: run as root)";
    case State::enabled:
    case State::disabled:
        break;
    }
    static const std::pair<std::uint16_t, const char *> bits[] = {
        {source_validation, "SV"},   {translation_blocking, "TB"}, {request_redirect, "RR"},
        {completion_redirect, "CR"}, {upstream_forwarding, "UF"},  {egress_control, "EC"},
        {direct_translated, "DT"}};
    std::string on;
    for (auto [bit, name] : bits)
        if (control & bit) on += (on.empty() ? "" : " ") + std::string(name);
    return on.empty() ? "ACS present, all controls off" : "ACS " + on;
}

std::optional<PciFunction> PciTopology::function(const std::string &address) const {
    fs::path dir = fs::path(sysfs_) / "bus/pci/devices" / address;
    std::error_code ec;
    if (!is_pci_address(address) || !fs::exists(dir, ec)) return std::nullopt;
    PciFunction f;
    f.address = address;
    f.vendor = static_cast<std::uint16_t>(read_number(dir / "vendor").value_or(0));
    f.device = static_cast<std::uint16_t>(read_number(dir / "device").value_or(0));
    f.class_code = static_cast<std::uint32_t>(read_number(dir / "class").value_or(0));
    f.driver = link_name(dir / "driver");
    return f;
}

std::vector<PciFunction> PciTopology::functions() const {
    std::vector<PciFunction> out;
    std::error_code ec;
    for (auto &e : knod::list_dir(fs::path(sysfs_) / "bus/pci/devices", ec))
        if (auto f = function(e.filename().string())) out.push_back(std::move(*f));
    std::sort(out.begin(), out.end(),
              [](const PciFunction &a, const PciFunction &b) { return a.address < b.address; });
    return out;
}

std::vector<std::string> PciTopology::upstream(const std::string &address,
                                               std::string *root) const {
    std::error_code ec;
    fs::path real = fs::canonical(fs::path(sysfs_) / "bus/pci/devices" / address, ec);
    if (ec) return {};
    std::vector<std::string> chain;
    for (auto &part : real) {
        std::string s = part.string();
        if (s.rfind("pci", 0) == 0 && s.size() > 3 && s.find(':') != std::string::npos) {
            chain.clear(); // the host bridge starts the chain
            if (root) *root = s;
        } else if (is_pci_address(s)) {
            chain.push_back(s);
        }
    }
    if (chain.empty() || chain.back() != address) return {};
    chain.pop_back();
    std::reverse(chain.begin(), chain.end());
    return chain;
}

P2pPath PciTopology::path(const std::string &a, const std::string &b) const {
    P2pPath p;
    std::string root_a, root_b;
    auto up_a = upstream(a, &root_a), up_b = upstream(b, &root_b);
    if (root_a.empty() || root_b.empty()) return p;
    if (slot_of(a) == slot_of(b)) {
        p.distance = P2pDistance::same_device;
        return p;
    }
    auto down_b = [&](std::size_t upto) { // b's bridges from `upto` (exclusive) down to b
        for (std::size_t i = upto; i-- > 0;)
            p.bridges.push_back(up_b[i]);
    };
    if (root_a != root_b) {
        p.distance = P2pDistance::cross_root;
        p.bridges = up_a;
        down_b(up_b.size());
        return p;
    }
    for (std::size_t i = 0; i < up_a.size(); ++i) {
        auto j = std::find(up_b.begin(), up_b.end(), up_a[i]);
        if (j == up_b.end()) continue;
        std::size_t jb = static_cast<std::size_t>(j - up_b.begin());
        p.bridges.assign(up_a.begin(), up_a.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        down_b(jb);
        p.turnaround = up_a[i];
        bool root_port = i + 1 == up_a.size();
        p.distance = !root_port && i == 1 && jb == 1 ? P2pDistance::same_switch
                                                     : P2pDistance::same_root_port;
        return p;
    }
    p.distance = P2pDistance::host_bridge;
    p.bridges = up_a;
    down_b(up_b.size());
    return p;
}

AcsControl PciTopology::acs(const std::string &address) const {
    AcsControl acs;
    std::ifstream in(fs::path(sysfs_) / "bus/pci/devices" / address / "config", std::ios::binary);
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Unprivileged readers get 64 bytes: neither the PCIe nor the ACS capability is in them.
    if (cfg.size() <= 0x40) return acs;
    acs.multifunction = static_cast<std::uint8_t>(cfg[0x0e]) & 0x80;
    auto type = pcie_port_type(cfg);
    if (!type) { // conventional PCI: a shared bus, every device can reach every other
        acs.state = AcsControl::State::absent;
        acs.port = "conventional PCI function";
        return acs;
    }
    acs.port = port_name(*type);
    switch (*type) {
    case pcie_root_port:
    case pcie_downstream:
        break;
    case pcie_endpoint:
    case pcie_legacy_endpoint:
    case pcie_upstream:
    case pcie_rc_endpoint:
        if (acs.multifunction) break;
        acs.state = AcsControl::State::not_applicable;
        return acs;
    default: // PCIe/PCI bridges and the rest: never isolating, as in Linux
        acs.state = AcsControl::State::absent;
        return acs;
    }
    if (cfg.size() < 0x100 + 8) {
        acs.state = AcsControl::State::unreadable;
        return acs;
    }
    std::size_t off = 0x100;
    for (int guard = 0; guard < 96 && off + 8 <= cfg.size(); ++guard) {
        std::uint32_t header = le32(cfg, off);
        if (header == 0 || header == 0xffffffff) break;
        if ((header & 0xffff) == acs_capability_id) {
            std::uint32_t reg = le32(cfg, off + 4);
            acs.capability = static_cast<std::uint16_t>(reg & 0xffff);
            acs.control = static_cast<std::uint16_t>(reg >> 16);
            // A redirect the port cannot do is hard-wired on (pci_acs_flags_enabled()).
            std::uint16_t needed = AcsControl::isolating & acs.capability;
            acs.state = (acs.control & needed) == needed ? AcsControl::State::enabled
                                                         : AcsControl::State::disabled;
            return acs;
        }
        std::size_t next = (header >> 20) & 0xffc;
        if (next < 0x100) break; // the guard stops a pointer loop
        off = next;
    }
    acs.state = AcsControl::State::absent;
    return acs;
}

} // namespace knod::host
