#include "host/sysfs_util.h"

#include <fstream>
#include <regex>

namespace fs = std::filesystem;

namespace knod::host {

std::string read_line(const fs::path &p) {
    std::ifstream in(p);
    std::string line;
    std::getline(in, line);
    return line;
}

std::optional<std::uint64_t> read_number(const fs::path &p) {
    std::string s = read_line(p);
    if (s.empty()) return std::nullopt;
    try {
        std::size_t used = 0;
        std::uint64_t v = std::stoull(s, &used, 0);
        if (used != s.size()) return std::nullopt;
        return v;
    } catch (...) {
        return std::nullopt;
    }
}

std::string link_name(const fs::path &p) {
    std::error_code ec;
    fs::path target = fs::read_symlink(p, ec);
    return ec ? std::string() : target.filename().string();
}

bool is_pci_address(const std::string &s) {
    static const std::regex bdf("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]");
    return std::regex_match(s, bdf);
}

} // namespace knod::host
