// Where the host's facts are read from. Everything is rooted so that tests (and
// `knod-policy doctor --host-root`) run on fixture trees shaped like real machines.
#pragma once

#include <string>

namespace knod::host {

struct HostPaths {
    std::string sysfs = "/sys";
    std::string proc = "/proc";
    std::string boot = "/boot";
    std::string rocm = "/opt/rocm";

    // The live machine: inventories also ask the kernel (netlink, DRM), not only files.
    bool live() const { return sysfs == "/sys"; }
    // A fixture tree laid out as DIR/sys, DIR/proc, DIR/boot, DIR/opt/rocm.
    static HostPaths under(const std::string &dir) {
        return {dir + "/sys", dir + "/proc", dir + "/boot", dir + "/opt/rocm"};
    }
};

} // namespace knod::host
