#include "daemon/driver/no_driver.h"

namespace knod::driver {

NoDriver::NoDriver(std::string why)
    : why_("no KNOD or devmem-capable NIC on this host (" + std::move(why) +
           "); the sim runs only when asked for (--driver=sim); see knod-policyd(8) and "
           "docs/drivers.md") {}

Result<GpuInfo> NoDriver::gpu(const std::string &) const {
    return make_error(Errc::driver_failure, why_);
}

Result<NetdevInfo> NoDriver::netdev(const std::string &) const {
    return make_error(Errc::driver_failure, why_);
}

Result<std::vector<std::uint32_t>> NoDriver::attach(const BindingPlan &) {
    return make_error(Errc::driver_failure, why_);
}

Result<void> NoDriver::activate(const std::string &) {
    return make_error(Errc::driver_failure, why_);
}

} // namespace knod::driver
