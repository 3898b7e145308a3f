#include "host/kernel_config.h"

#include "host/sysfs_util.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

void parse_line(std::string line, KernelConfig &c) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
        line.pop_back();
    if (line.rfind("CONFIG_", 0) != 0) return; // comments, "# CONFIG_X is not set"
    auto eq = line.find('=');
    if (eq != std::string::npos) c.options[line.substr(0, eq)] = line.substr(eq + 1);
}

bool read_gz(const fs::path &p, KernelConfig &c) {
    gzFile f = gzopen(p.c_str(), "rb");
    if (!f) return false;
    char buf[4096];
    bool any = false;
    while (gzgets(f, buf, sizeof buf)) {
        parse_line(buf, c);
        any = true;
    }
    gzclose(f);
    return any;
}

bool read_plain(const fs::path &p, KernelConfig &c) {
    std::ifstream in(p);
    if (!in) return false;
    for (std::string line; std::getline(in, line);)
        parse_line(line, c);
    return true;
}

} // namespace

const char *to_string(ConfigValue v) {
    switch (v) {
    case ConfigValue::yes:
        return "y";
    case ConfigValue::module:
        return "m";
    case ConfigValue::no:
        return "not set";
    case ConfigValue::unknown:
        return "unknown";
    }
    return "?";
}

ConfigValue KernelConfig::get(const std::string &option) const {
    if (source.empty()) return ConfigValue::unknown;
    auto it = options.find(option);
    if (it == options.end()) return ConfigValue::no;
    if (it->second == "y") return ConfigValue::yes;
    if (it->second == "m") return ConfigValue::module;
    return ConfigValue::no;
}

KernelConfig read_kernel_config(const HostPaths &paths) {
    KernelConfig c;
    c.release = read_line(fs::path(paths.proc) / "sys/kernel/osrelease");
    fs::path gz = fs::path(paths.proc) / "config.gz";
    if (read_gz(gz, c)) {
        c.source = gz.string();
        return c;
    }
    if (!c.release.empty()) {
        fs::path boot = fs::path(paths.boot) / ("config-" + c.release);
        if (read_plain(boot, c)) c.source = boot.string();
    }
    return c;
}

} // namespace knod::host
