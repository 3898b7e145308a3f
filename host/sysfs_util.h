// Small readers for sysfs-shaped trees, shared by the host inventory and checks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace knod::host {

// The first line of a file, without its newline; empty when unreadable.
std::string read_line(const std::filesystem::path &p);
// A hex or decimal number such as sysfs writes ("0x1002", "8"); nothing when absent or bad.
std::optional<std::uint64_t> read_number(const std::filesystem::path &p);
// The name a symlink points at ("mlx5_core" for .../driver); empty when it is not a link.
std::string link_name(const std::filesystem::path &p);
// Whether `s` looks like a PCI address, "0000:c1:00.0".
bool is_pci_address(const std::string &s);

} // namespace knod::host
