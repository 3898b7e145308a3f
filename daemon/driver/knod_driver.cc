#include "daemon/driver/knod_driver.h"
#include "knod/dir.h"

#include "knod/untrusted.h"

#include "host/sysfs_util.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace knod::driver {

std::vector<KnodDevice> knod_devices(const host::HostPaths &paths) {
    std::vector<KnodDevice> out;
    std::error_code ec;
    for (auto &e : knod::list_dir(fs::path(paths.sysfs) / "class/knod", ec)) {
        KnodDevice d;
        d.name = e.filename().string();
        d.netdev = host::read_line(e / "netdev");
        d.gpu = host::read_line(e / "gpu");
        d.rx_queues = static_cast<std::uint32_t>(host::read_number(e / "rx_queues").value_or(0));
        if (!d.netdev.empty() && !d.gpu.empty() && d.rx_queues > 1) out.push_back(std::move(d));
    }
    std::sort(out.begin(), out.end(),
              [](const KnodDevice &a, const KnodDevice &b) { return a.name < b.name; });
    return out;
}

Result<std::unique_ptr<KnodDriver>> KnodDriver::open(host::HostPaths paths) {
    auto devices = knod_devices(paths);
    if (devices.empty())
        return make_error(Errc::unavailable, "no KNOD device under " + paths.sysfs +
                                                 "/class/knod (module not loaded, or no NIC "
                                                 "paired with a GPU)");
    return std::unique_ptr<KnodDriver>(new KnodDriver(std::move(paths), std::move(devices)));
}

std::vector<GpuInfo> KnodDriver::gpus() const {
    std::vector<GpuInfo> out;
    for (auto &g : inventory_.gpus())
        if (std::any_of(devices_.begin(), devices_.end(), [&](auto &d) { return d.gpu == g.pci; }))
            out.push_back(g);
    return out;
}

std::vector<NetdevInfo> KnodDriver::netdevs() const {
    std::vector<NetdevInfo> out;
    auto all = inventory_.netdevs();
    for (auto &d : devices_) {
        NetdevInfo n{d.netdev, d.rx_queues, {}};
        for (auto &i : all)
            if (i.name == d.netdev) n.pci = i.pci;
        if (std::none_of(out.begin(), out.end(), [&](auto &x) { return x.name == n.name; }))
            out.push_back(n);
    }
    return out;
}

Result<GpuInfo> KnodDriver::gpu(const std::string &name) const {
    for (auto &g : gpus())
        if (std::find(g.names.begin(), g.names.end(), name) != g.names.end()) return g;
    return make_error(Errc::invalid_argument, "gpu: no KNOD-paired GPU named " +
                                                  quote_untrusted(name) +
                                                  " (see /sys/class/knod/*/gpu)");
}

Result<NetdevInfo> KnodDriver::netdev(const std::string &name) const {
    for (auto &n : netdevs())
        if (n.name == name) return n;
    return make_error(Errc::invalid_argument, "netdev: no KNOD-offloaded netdev named " +
                                                  quote_untrusted(name) +
                                                  " (see /sys/class/knod/*/netdev)");
}

const KnodDevice *KnodDriver::device_for(const std::string &netdev, const std::string &gpu) const {
    for (auto &d : devices_)
        if (d.netdev == netdev && d.gpu == gpu) return &d;
    return nullptr;
}

Result<void> KnodDriver::write_control(const KnodDevice &d, const char *file,
                                       const std::string &line) const {
    fs::path p = fs::path(inventory_.paths().sysfs) / "class/knod" / d.name / file;
    std::ofstream out(p, std::ios::app);
    out << line << "\n";
    out.flush();
    if (!out)
        return make_error(Errc::driver_failure,
                          "knod: writing " + p.string() + ": " + std::strerror(errno));
    return {};
}

Result<std::vector<std::uint32_t>> KnodDriver::attach(const BindingPlan &plan) {
    auto g = gpu(plan.gpu);
    if (!g) return std::move(g).error();
    const KnodDevice *d = device_for(plan.netdev, g->pci);
    if (!d)
        return make_error(Errc::driver_failure, "knod: " + plan.netdev + " is not paired with " +
                                                    g->pci + " under /sys/class/knod");
    for (std::uint32_t q = d->rx_queues - 1; q >= 1; --q) {
        bool taken = std::any_of(bindings_.begin(), bindings_.end(), [&](auto &b) {
            return b.second.device == d && b.second.queue == q;
        });
        if (!taken) {
            bindings_[plan.id] = Binding{plan, d, q, false};
            return std::vector<std::uint32_t>{q};
        }
    }
    return make_error(Errc::driver_failure, "knod: every offload queue of " + d->name + " (" +
                                                plan.netdev + ") is bound");
}

Result<void> KnodDriver::activate(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return make_error(Errc::not_found, "knod: no binding " + id);
    Binding &b = it->second;
    std::string flows;
    for (auto &f : b.plan.flows)
        flows += (flows.empty() ? "" : ";") + f.to_string();
    std::ostringstream line;
    line << id << ' ' << b.queue << ' ' << b.plan.region_fd << ' ' << b.plan.offset << ' '
         << b.plan.length << ' ' << flows;
    if (auto r = write_control(*b.device, "bind", line.str()); !r) return r;
    b.active = true;
    return {};
}

void KnodDriver::detach(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    if (it->second.active) (void)write_control(*it->second.device, "unbind", id);
    bindings_.erase(it);
}

Counters KnodDriver::counters(const std::string &id) const {
    Counters c;
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return c;
    std::ifstream in(fs::path(inventory_.paths().sysfs) / "class/knod" / it->second.device->name /
                     "stats");
    for (std::string line; std::getline(in, line);) {
        std::istringstream s(line);
        std::string who;
        Counters row;
        if (s >> who >> row.rx_bytes >> row.rx_packets >> row.dropped_packets && who == id) c = row;
    }
    return c;
}

} // namespace knod::driver
