#include "host/netdev_inventory.h"
#include "knod/dir.h"

#include "host/sysfs_util.h"

#include "knod/unique_fd.h"

#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netlink/netlink.h>
#include <netlink/route/link.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

#include <algorithm>
#include <filesystem>
#include <memory>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

// Driver and parent PCI function from class/net/NAME/device (virtio devices sit one level
// below their PCI function).
void read_parent(const HostPaths &paths, Netdev &n) {
    fs::path dev = fs::path(paths.sysfs) / "class/net" / n.name / "device";
    n.driver = link_name(dev / "driver");
    std::error_code ec;
    fs::path real = fs::canonical(dev, ec);
    for (; !ec && !real.empty() && real != real.root_path(); real = real.parent_path())
        if (is_pci_address(real.filename().string())) {
            n.pci = real.filename().string();
            break;
        }
}

// The active RX queue count: sysfs has one queues/rx-N per real RX queue (the kernel adds and
// removes them with netif_set_real_num_rx_queues); a netdev sysfs does not show (another
// namespace's sysfs) asks ethtool's channels (RX + combined); nothing else: the allocated count.
void read_rx_queues(const HostPaths &paths, Netdev &n) {
    std::error_code ec;
    std::uint32_t rx = 0;
    fs::path queues = fs::path(paths.sysfs) / "class/net" / n.name / "queues";
    for (auto &q : fs::directory_iterator(queues, ec))
        if (q.path().filename().string().rfind("rx-", 0) == 0) ++rx;
    if (!ec && rx) {
        n.rx_queues = rx;
        n.rx_queues_source = "sysfs";
        return;
    }
    UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    ethtool_channels ch{};
    ch.cmd = ETHTOOL_GCHANNELS;
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, n.name.c_str(), IFNAMSIZ - 1);
    ifr.ifr_data = reinterpret_cast<char *>(&ch);
    if (s.valid() && ::ioctl(s.get(), SIOCETHTOOL, &ifr) == 0 &&
        ch.rx_count + ch.combined_count > 0) {
        n.rx_queues = ch.rx_count + ch.combined_count;
        n.rx_queues_source = "ethtool";
        return;
    }
    n.rx_queues = n.rx_queues_allocated;
    n.rx_queues_source = "allocated";
}

Result<std::vector<Netdev>> from_netlink(const HostPaths &paths) {
    std::unique_ptr<nl_sock, decltype(&nl_socket_free)> sock(nl_socket_alloc(), nl_socket_free);
    if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket");
    if (int r = nl_connect(sock.get(), NETLINK_ROUTE); r < 0)
        return make_error(Errc::io, std::string("rtnetlink: ") + nl_geterror(r));
    nl_cache *raw = nullptr;
    if (int r = rtnl_link_alloc_cache(sock.get(), AF_UNSPEC, &raw); r < 0)
        return make_error(Errc::io, std::string("rtnetlink link dump: ") + nl_geterror(r));
    std::unique_ptr<nl_cache, decltype(&nl_cache_free)> cache(raw, nl_cache_free);
    std::vector<Netdev> out;
    for (nl_object *o = nl_cache_get_first(cache.get()); o; o = nl_cache_get_next(o)) {
        auto *link = reinterpret_cast<rtnl_link *>(o);
        Netdev n;
        n.name = rtnl_link_get_name(link);
        n.ifindex = rtnl_link_get_ifindex(link);
        char state[32];
        n.state = rtnl_link_operstate2str(rtnl_link_get_operstate(link), state, sizeof state);
        n.admin_up = rtnl_link_get_flags(link) & IFF_UP;
        n.rx_queues_allocated = rtnl_link_get_num_rx_queues(link);
        if (const char *kind = rtnl_link_get_type(link)) n.kind = kind;
        read_parent(paths, n);
        read_rx_queues(paths, n);
        out.push_back(std::move(n));
    }
    return out;
}

std::vector<Netdev> from_sysfs(const HostPaths &paths) {
    std::vector<Netdev> out;
    std::error_code ec;
    for (auto &e : knod::list_dir(fs::path(paths.sysfs) / "class/net", ec)) {
        Netdev n;
        n.name = e.filename().string();
        n.ifindex = static_cast<int>(read_number(e / "ifindex").value_or(0));
        n.state = read_line(e / "operstate");
        n.admin_up = read_number(e / "flags").value_or(0) & IFF_UP;
        std::error_code qec;
        for (auto &q : knod::list_dir(e / "queues", qec))
            if (q.filename().string().rfind("rx-", 0) == 0) ++n.rx_queues;
        n.rx_queues_source = "sysfs";
        read_parent(paths, n);
        out.push_back(std::move(n));
    }
    return out;
}

} // namespace

bool devmem_capable_driver(const std::string &driver) {
    // Upstream devmem TCP RX as of Linux 6.18: Google gve, Broadcom bnxt, NVIDIA mlx5, Meta fbnic.
    static const char *drivers[] = {"gve", "bnxt_en", "mlx5_core", "fbnic"};
    return std::find(std::begin(drivers), std::end(drivers), driver) != std::end(drivers);
}

Result<std::vector<Netdev>> list_netdevs(const HostPaths &paths) {
    std::vector<Netdev> out;
    if (paths.live()) {
        auto live = from_netlink(paths);
        if (!live) return std::move(live).error();
        out = std::move(*live);
    } else {
        out = from_sysfs(paths);
    }
    std::sort(out.begin(), out.end(),
              [](const Netdev &a, const Netdev &b) { return a.ifindex < b.ifindex; });
    return out;
}

} // namespace knod::host
