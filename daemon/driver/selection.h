// --driver=auto: knod where the KNOD module offers devices, else devmem where the kernel speaks
// devmem TCP and a NIC's driver supports it and there is a GPU, else none: the daemon serves
// status, the host report and the audit API and refuses bindings. Never the sim, which is a
// demo and test backend that runs only when asked for (--driver=sim). Says why.
#pragma once

#include "host/paths.h"

#include <string>

namespace knod::driver {

struct DriverChoice {
    std::string driver; // "knod", "devmem" or "none"
    std::string reason; // one line a person can act on
};

DriverChoice choose_driver(const host::HostPaths &paths);

} // namespace knod::driver
