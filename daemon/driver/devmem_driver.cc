#include "daemon/driver/devmem_driver.h"

#include "daemon/driver/ntuple.h"
#include "host/devmem_readiness.h"
#include "knod/json.h"

#include <nlohmann/json.hpp>

#include <net/if.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>

namespace knod::driver {

Result<std::unique_ptr<DevmemDriver>> DevmemDriver::open(host::HostPaths paths, DeviceCheck check,
                                                         std::string pin_root) {
    auto probe = NetdevGenl::open();
    if (!probe) return std::move(probe).error();
    return std::unique_ptr<DevmemDriver>(new DevmemDriver(std::move(paths), std::move(*probe),
                                                          std::move(check), std::move(pin_root)));
}

Result<std::uint32_t> choose_rx_queue(const std::string &netdev,
                                      const std::vector<NetdevQueue> &queues,
                                      const std::function<bool(std::uint32_t)> &reserved) {
    // The highest free RX queue: queue 0 keeps the kernel's own traffic, and RSS spreads over
    // the low queues first.
    std::optional<std::uint32_t> chosen;
    std::size_t rx = 0;
    for (auto &q : queues) {
        if (q.type != NetdevQueue::Type::rx) continue;
        ++rx;
        if (q.owned() || q.id == 0 || reserved(q.id)) continue;
        if (!chosen || q.id > *chosen) chosen = q.id;
    }
    if (chosen) return *chosen;
    // One queue is not "all taken": nothing on such a NIC can ever be isolated.
    if (rx <= 1)
        return make_error(Errc::driver_failure,
                          "devmem: " + netdev + " has " + (rx ? "one RX queue" : "no RX queue") +
                              ": queue 0 carries the host's own traffic, so no queue can be "
                              "isolated for a binding (give it more with ethtool -L " +
                              netdev + " combined N, or use a multi-queue NIC)");
    return make_error(Errc::driver_failure,
                      "devmem: " + netdev + " has no free RX queue (each of its " +
                          std::to_string(rx - 1) +
                          " queues past 0 is bound to a dma-buf, io_uring or AF_XDP, or held by "
                          "another binding)");
}

Result<void> require_devmem_device(int ifindex) {
    if (auto dma = require_dma_device(ifindex); !dma) return dma;
    char name[IF_NAMESIZE] = {};
    if (!if_indextoname(static_cast<unsigned>(ifindex), name))
        return make_error(Errc::driver_failure,
                          "devmem: no netdev with ifindex " + std::to_string(ifindex));
    return host::require_devmem_ready(ifindex, name);
}

Result<void> require_tcp_flows(const std::vector<policy::FlowSpec> &flows) {
    for (auto &f : flows)
        if (f.protocol != policy::Protocol::tcp)
            return make_error(Errc::invalid_argument,
                              "devmem: the flow " + f.to_string() +
                                  " is not TCP, and devmem receives TCP only (the kernel puts "
                                  "nothing else in a dma-buf); grant it with the sim or knod "
                                  "driver, or name tcp in the request");
    return {};
}

// bind-rx takes a dma-buf fd and nothing else: the kernel's page pool places payload anywhere in
// the whole dma-buf (netdev.yaml bind-rx has no offset or length). A window smaller than the
// dma-buf would let the policy's max_region and quotas judge less than the NIC may write, and
// the NIC write over whatever else shares the buffer; so only the whole dma-buf is a region here.
Result<void> require_whole_region(const BindingPlan &plan) {
    struct stat st {};
    if (fstat(plan.region_fd, &st) != 0)
        return make_error(Errc::invalid_argument,
                          std::string("devmem: the region fd: ") + std::strerror(errno));
    auto whole = static_cast<std::uint64_t>(st.st_size); // a dma-buf's inode carries its size
    if (plan.offset != 0 || plan.length != whole)
        return make_error(
            Errc::invalid_argument,
            "devmem: the NIC writes anywhere in the whole dma-buf (" + std::to_string(whole) +
                " bytes), so a devmem region is the whole "
                "dma-buf: request offset 0 and length " +
                std::to_string(whole) + " (not offset " + std::to_string(plan.offset) +
                ", length " + std::to_string(plan.length) +
                "), or export a dma-buf of just the receive buffer");
    return {};
}

Result<std::vector<std::uint32_t>> DevmemDriver::attach(const BindingPlan &plan) {
    int ifindex = static_cast<int>(if_nametoindex(plan.netdev.c_str()));
    if (ifindex == 0) return make_error(Errc::driver_failure, "devmem: no netdev " + plan.netdev);
    // At request time already, not only at activation: a netdev bind-rx can never succeed on.
    if (auto dma = check_(ifindex); !dma) return std::move(dma).error();
    if (auto tcp = require_tcp_flows(plan.flows); !tcp) return std::move(tcp).error();
    if (auto whole = require_whole_region(plan); !whole) return std::move(whole).error();
    // Refuse flows the NIC cannot steer now, not at activation.
    for (auto &f : plan.flows)
        for (auto family : {policy::Family::ipv4, policy::Family::ipv6})
            if (f.family() == policy::Family::any || f.family() == family)
                if (auto fs = to_rx_flow_spec(f, 0, family); !fs)
                    return std::move(fs).error().context("devmem");
    auto queues = probe_.queues(ifindex);
    if (!queues) return std::move(queues).error().context("devmem: " + plan.netdev);
    auto chosen = choose_rx_queue(plan.netdev, *queues, [&](std::uint32_t q) {
        return std::any_of(bindings_.begin(), bindings_.end(), [&](auto &b) {
            return b.second.ifindex == ifindex && b.second.queue == q;
        });
    });
    if (!chosen) return std::move(chosen).error();
    if (auto rss = FlowSteering::check_not_in_rss(plan.netdev, *chosen); !rss) return rss.error();
    bindings_[plan.id] = Binding{plan, ifindex, *chosen, std::nullopt, {}, {}, std::nullopt};
    return std::vector<std::uint32_t>{*chosen};
}

Result<void> DevmemDriver::activate(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return make_error(Errc::not_found, "devmem: no binding " + id);
    Binding &b = it->second;
    auto sock = NetdevGenl::open();
    if (!sock) return std::move(sock).error();
    auto bound = sock->bind_rx(b.ifindex, {b.queue}, b.plan.region_fd);
    if (!bound)
        return std::move(bound).error().context("devmem: " + b.plan.netdev + " queue " +
                                                std::to_string(b.queue));
    // The guard before the steering: from the first steered packet on, whatever else lands on
    // the queue is dropped and counted.
    if (auto g = guards_.add(id, b.plan.netdev, b.queue, b.plan.flows, {}); !g)
        return std::move(g).error(); // the socket closes here: unbound again
    auto rules = FlowSteering::steer(b.plan.netdev, b.plan.flows, b.queue);
    if (!rules) {
        guards_.remove(id);
        return std::move(rules).error();
    }
    guards_.set_own_rules(id, *rules);
    b.socket = std::move(*sock);
    b.rules = std::move(*rules);
    b.dmabuf_id = *bound;
    return {};
}

std::optional<std::uint32_t> DevmemDriver::dmabuf_id(const std::string &id) const {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return std::nullopt;
    return it->second.dmabuf_id;
}

std::map<std::string, int> DevmemDriver::handles(const std::string &id) const {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return {};
    int fd = it->second.socket ? it->second.socket->fd() : it->second.kept.get();
    if (fd < 0) return {};
    return {{"nl", fd}};
}

std::optional<std::string> DevmemDriver::handoff(const std::string &id) const {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return std::nullopt;
    nlohmann::json j{
        {"ifindex", it->second.ifindex}, {"queue", it->second.queue}, {"rules", it->second.rules}};
    if (it->second.dmabuf_id) j["dmabuf_id"] = *it->second.dmabuf_id;
    return knod::dump_json(j);
}

Result<std::vector<std::uint32_t>> DevmemDriver::readopt(const BindingPlan &plan, bool active,
                                                         const std::string &handoff,
                                                         std::map<std::string, UniqueFd> handles) {
    Binding b{plan, 0, 0, std::nullopt, {}, {}, std::nullopt};
    try {
        auto j = nlohmann::json::parse(handoff);
        b.ifindex = j.at("ifindex").get<int>();
        b.queue = j.at("queue").get<std::uint32_t>();
        b.rules = j.at("rules").get<std::vector<std::uint32_t>>();
        // A record of a daemon before the id was kept has none: the binding then has none.
        if (auto d = j.find("dmabuf_id"); d != j.end()) b.dmabuf_id = d->get<std::uint32_t>();
    } catch (const std::exception &e) {
        return make_error(Errc::corrupt, std::string("devmem handoff: ") + e.what());
    }
    // The same device, not another one that took its name or index meanwhile.
    if (static_cast<int>(if_nametoindex(plan.netdev.c_str())) != b.ifindex)
        return make_error(Errc::not_found, "devmem: " + plan.netdev + " is not the same device");
    if (active) {
        auto nl = handles.find("nl");
        if (nl == handles.end() || !nl->second.valid())
            return make_error(Errc::not_found, "devmem: the binding's netlink socket did not come "
                                               "back, so the kernel unbound it");
        b.kept = std::move(nl->second);
        // The previous daemon's guard went with it: guard the queue again.
        if (auto g = guards_.add(plan.id, plan.netdev, b.queue, plan.flows, b.rules); !g)
            return std::move(g).error();
    } else {
        b.dmabuf_id.reset(); // not bound: activation binds and learns the id
    }
    std::uint32_t queue = b.queue;
    bindings_[plan.id] = std::move(b);
    return std::vector<std::uint32_t>{queue};
}

void DevmemDriver::abandon(const std::string &netdev, const std::string &handoff) {
    try {
        auto rules = nlohmann::json::parse(handoff).at("rules").get<std::vector<std::uint32_t>>();
        FlowSteering::remove(netdev, rules);
    } catch (const std::exception &) {
        // Unreadable: nothing to remove that we could name.
    }
}

Result<std::optional<QueueStats>> DevmemDriver::queue_stats(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return make_error(Errc::not_found, "no devmem binding " + id);
    return probe_.rx_queue_stats(it->second.ifindex, it->second.queue);
}

std::map<std::string, std::uint64_t> DevmemDriver::stats() const {
    std::map<std::string, std::uint64_t> out;
    for (auto &[id, b] : bindings_) {
        auto q = probe_.rx_queue_stats(b.ifindex, b.queue);
        if (!q || !*q) continue; // the driver keeps none: nothing to show, not an error
        std::string at = b.plan.netdev + ".rx-queue-" + std::to_string(b.queue) + ".";
        if ((*q)->rx_packets) out[at + "nic_rx_packets"] = *(*q)->rx_packets;
        if ((*q)->rx_bytes) out[at + "nic_rx_bytes"] = *(*q)->rx_bytes;
    }
    guards_.add_stats(out);
    return out;
}

void DevmemDriver::detach(const std::string &id) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    FlowSteering::remove(it->second.plan.netdev, it->second.rules);
    bindings_.erase(it); // closes the binding's netlink socket: the kernel unbinds the dma-buf
    guards_.remove(id);
}

std::map<std::string, std::string> DevmemDriver::drifted() {
    auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
                   .count();
    return guards_.drifted(now);
}

} // namespace knod::driver
