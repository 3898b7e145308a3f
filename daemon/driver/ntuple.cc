#include "daemon/driver/ntuple.h"

#include "host/devmem_readiness.h"
#include "knod/unique_fd.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace knod::driver {
namespace {

Result<void> port(const policy::PortRange &r, __be16 &value, __be16 &mask, const char *which) {
    if (r.any()) return {};
    if (r.lo != r.hi)
        return make_error(Errc::invalid_argument, std::string("flow steering: the ") + which +
                                                      " port range " + r.to_string() +
                                                      " has no NIC rule form; use one port or *");
    value = htons(r.lo);
    mask = 0xffff;
    return {};
}

void prefix_mask(const policy::Prefix &p, std::uint8_t *value, std::uint8_t *mask, int bytes) {
    for (int i = 0; i < bytes; ++i) {
        int bits = std::min(8, std::max(0, p.length - i * 8));
        mask[i] = static_cast<std::uint8_t>(bits ? 0xff << (8 - bits) : 0);
        value[i] = p.addr[static_cast<std::size_t>(i)] & mask[i];
    }
}

// ioctl(SIOCETHTOOL) needs a socket of some family; netlink is the one the unit allows.
Result<UniqueFd> ethtool_socket() {
    UniqueFd fd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    if (!fd.valid()) return make_error(Errc::io, std::string("socket: ") + std::strerror(errno));
    return fd;
}

int ethtool(int fd, const std::string &ifname, ethtool_rxnfc &nfc) {
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
    ifr.ifr_data = reinterpret_cast<char *>(&nfc);
    return ioctl(fd, SIOCETHTOOL, &ifr) == 0 ? 0 : errno;
}

} // namespace

Result<ethtool_rx_flow_spec> to_rx_flow_spec(const policy::FlowSpec &flow, std::uint32_t queue,
                                             policy::Family family) {
    ethtool_rx_flow_spec fs{};
    fs.ring_cookie = queue;
    fs.location = RX_CLS_LOC_ANY;
    bool v6 = family == policy::Family::ipv6;
    if (flow.protocol == policy::Protocol::any) {
        if (!flow.src.ports.any() || !flow.dst.ports.any())
            return make_error(Errc::invalid_argument,
                              "flow steering: ports need a protocol (udp or tcp): " +
                                  flow.to_string());
        fs.flow_type = v6 ? IPV6_USER_FLOW : IPV4_USER_FLOW;
        if (v6) {
            prefix_mask(flow.src.prefix,
                        reinterpret_cast<std::uint8_t *>(fs.h_u.usr_ip6_spec.ip6src),
                        reinterpret_cast<std::uint8_t *>(fs.m_u.usr_ip6_spec.ip6src), 16);
            prefix_mask(flow.dst.prefix,
                        reinterpret_cast<std::uint8_t *>(fs.h_u.usr_ip6_spec.ip6dst),
                        reinterpret_cast<std::uint8_t *>(fs.m_u.usr_ip6_spec.ip6dst), 16);
        } else {
            fs.h_u.usr_ip4_spec.ip_ver = ETH_RX_NFC_IP4;
            prefix_mask(flow.src.prefix,
                        reinterpret_cast<std::uint8_t *>(&fs.h_u.usr_ip4_spec.ip4src),
                        reinterpret_cast<std::uint8_t *>(&fs.m_u.usr_ip4_spec.ip4src), 4);
            prefix_mask(flow.dst.prefix,
                        reinterpret_cast<std::uint8_t *>(&fs.h_u.usr_ip4_spec.ip4dst),
                        reinterpret_cast<std::uint8_t *>(&fs.m_u.usr_ip4_spec.ip4dst), 4);
        }
        return fs;
    }
    bool udp = flow.protocol == policy::Protocol::udp;
    if (v6) {
        fs.flow_type = udp ? UDP_V6_FLOW : TCP_V6_FLOW;
        auto &h = fs.h_u.udp_ip6_spec;
        auto &m = fs.m_u.udp_ip6_spec;
        prefix_mask(flow.src.prefix, reinterpret_cast<std::uint8_t *>(h.ip6src),
                    reinterpret_cast<std::uint8_t *>(m.ip6src), 16);
        prefix_mask(flow.dst.prefix, reinterpret_cast<std::uint8_t *>(h.ip6dst),
                    reinterpret_cast<std::uint8_t *>(m.ip6dst), 16);
        if (auto r = port(flow.src.ports, h.psrc, m.psrc, "source"); !r)
            return std::move(r).error();
        if (auto r = port(flow.dst.ports, h.pdst, m.pdst, "destination"); !r)
            return std::move(r).error();
    } else {
        fs.flow_type = udp ? UDP_V4_FLOW : TCP_V4_FLOW;
        auto &h = fs.h_u.udp_ip4_spec;
        auto &m = fs.m_u.udp_ip4_spec;
        prefix_mask(flow.src.prefix, reinterpret_cast<std::uint8_t *>(&h.ip4src),
                    reinterpret_cast<std::uint8_t *>(&m.ip4src), 4);
        prefix_mask(flow.dst.prefix, reinterpret_cast<std::uint8_t *>(&h.ip4dst),
                    reinterpret_cast<std::uint8_t *>(&m.ip4dst), 4);
        if (auto r = port(flow.src.ports, h.psrc, m.psrc, "source"); !r)
            return std::move(r).error();
        if (auto r = port(flow.dst.ports, h.pdst, m.pdst, "destination"); !r)
            return std::move(r).error();
    }
    return fs;
}

Result<std::vector<std::uint32_t>> FlowSteering::steer(const std::string &ifname,
                                                       const std::vector<policy::FlowSpec> &flows,
                                                       std::uint32_t queue) {
    auto fd = ethtool_socket();
    if (!fd) return std::move(fd).error();
    std::vector<std::uint32_t> placed;
    for (auto &flow : flows)
        for (auto family : {policy::Family::ipv4, policy::Family::ipv6}) {
            if (flow.family() != policy::Family::any && flow.family() != family) continue;
            auto fs = to_rx_flow_spec(flow, queue, family);
            if (!fs) {
                remove(ifname, placed);
                return std::move(fs).error();
            }
            ethtool_rxnfc nfc{};
            nfc.cmd = ETHTOOL_SRXCLSRLINS;
            nfc.fs = *fs;
            if (int err = ethtool(fd->get(), ifname, nfc); err != 0) {
                remove(ifname, placed);
                return make_error(Errc::driver_failure,
                                  "flow steering on " + ifname +
                                      ": cannot insert an ntuple rule for " + flow.to_string() +
                                      ": " + std::strerror(err) +
                                      (err == EOPNOTSUPP ? " (the NIC has no ntuple filters, or "
                                                           "they are off: ethtool -K " +
                                                               ifname + " ntuple on)"
                                                         : ""));
            }
            placed.push_back(nfc.fs.location);
        }
    return placed;
}

bool rss_reaches(const std::vector<std::uint32_t> &table, std::uint32_t queue) {
    return std::find(table.begin(), table.end(), queue) != table.end();
}

Result<void> FlowSteering::check_not_in_rss(const std::string &ifname, std::uint32_t queue) {
    auto table = host::read_rss_table(ifname);
    if (!table) return std::move(table).error().context("devmem");
    // A device without an RSS table spreads nothing.
    if (*table && rss_reaches(**table, queue))
        return make_error(Errc::driver_failure,
                          "devmem: RSS spreads traffic onto queue " + std::to_string(queue) +
                              " of " + ifname +
                              ", so other flows would land in the binding's memory; keep RSS "
                              "off the queues bindings use (ethtool -X " +
                              ifname + " equal " + std::to_string(queue) + ")");
    return {};
}

Result<std::vector<std::uint32_t>> FlowSteering::rules_to_queue(const std::string &ifname,
                                                                std::uint32_t queue) {
    auto fd = ethtool_socket();
    if (!fd) return std::move(fd).error();
    ethtool_rxnfc count{};
    count.cmd = ETHTOOL_GRXCLSRLCNT;
    if (int e = ethtool(fd->get(), ifname, count); e != 0) {
        if (e == EOPNOTSUPP) return std::vector<std::uint32_t>{};
        return make_error(Errc::driver_failure,
                          "cannot count the ntuple rules of " + ifname + ": " + std::strerror(e));
    }
    std::uint32_t n = std::min<std::uint32_t>(count.rule_cnt, 65536);
    // struct ethtool_rxnfc with rule_locs[n] after it.
    std::vector<std::uint8_t> buf(sizeof(ethtool_rxnfc) + n * sizeof(std::uint32_t));
    auto *all = reinterpret_cast<ethtool_rxnfc *>(buf.data());
    all->cmd = ETHTOOL_GRXCLSRLALL;
    all->rule_cnt = n;
    if (int e = ethtool(fd->get(), ifname, *all); e != 0)
        return make_error(Errc::driver_failure,
                          "cannot list the ntuple rules of " + ifname + ": " + std::strerror(e));
    std::vector<std::uint32_t> out;
    for (std::uint32_t i = 0; i < std::min(n, all->rule_cnt); ++i) {
        ethtool_rxnfc rule{};
        rule.cmd = ETHTOOL_GRXCLSRULE;
        rule.fs.location = all->rule_locs[i];
        if (ethtool(fd->get(), ifname, rule) != 0) continue; // removed meanwhile
        if (rule.fs.ring_cookie == RX_CLS_FLOW_DISC) continue;
        if (ethtool_get_flow_spec_ring(rule.fs.ring_cookie) == queue)
            out.push_back(rule.fs.location);
    }
    return out;
}

void FlowSteering::remove(const std::string &ifname, const std::vector<std::uint32_t> &locations) {
    auto fd = ethtool_socket();
    if (!fd) return;
    for (auto loc : locations) {
        ethtool_rxnfc nfc{};
        nfc.cmd = ETHTOOL_SRXCLSRLDEL;
        nfc.fs.location = loc;
        ethtool(fd->get(), ifname, nfc);
    }
}

} // namespace knod::driver
