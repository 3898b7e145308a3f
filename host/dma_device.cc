#include "host/dma_device.h"

#include "knod/untrusted.h"

#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netlink/attr.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>

#include <memory>

namespace knod::driver {
namespace {

int on_link(nl_msg *msg, void *arg) {
    auto *out = static_cast<NetdevParent *>(arg);
    nlattr *tb[IFLA_MAX + 1] = {};
    // NLA_STRING makes libnl refuse a name without its NUL: nothing is read past an attribute,
    // and a reply that fails the policy leaves the parent unknown (not PCI: refused).
    nla_policy policy[IFLA_MAX + 1] = {};
    for (int a : {IFLA_IFNAME, IFLA_PARENT_DEV_NAME, IFLA_PARENT_DEV_BUS_NAME})
        policy[a].type = NLA_STRING;
    if (nlmsg_parse(nlmsg_hdr(msg), sizeof(ifinfomsg), tb, IFLA_MAX, policy) < 0) return NL_OK;
    if (tb[IFLA_IFNAME]) out->netdev = nla_get_string(tb[IFLA_IFNAME]);
    if (tb[IFLA_PARENT_DEV_NAME]) out->device = nla_get_string(tb[IFLA_PARENT_DEV_NAME]);
    if (tb[IFLA_PARENT_DEV_BUS_NAME]) out->bus = nla_get_string(tb[IFLA_PARENT_DEV_BUS_NAME]);
    return NL_OK;
}

} // namespace

Result<NetdevParent> netdev_parent(int ifindex) {
    std::unique_ptr<nl_sock, decltype(&nl_socket_free)> sock(nl_socket_alloc(), nl_socket_free);
    if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket");
    if (int r = nl_connect(sock.get(), NETLINK_ROUTE); r < 0)
        return make_error(Errc::io, std::string("rtnetlink: ") + nl_geterror(r));
    std::unique_ptr<nl_msg, decltype(&nlmsg_free)> msg(nlmsg_alloc_simple(RTM_GETLINK, 0),
                                                       nlmsg_free);
    ifinfomsg ifi{};
    ifi.ifi_family = AF_UNSPEC;
    ifi.ifi_index = ifindex;
    if (!msg || nlmsg_append(msg.get(), &ifi, sizeof ifi, NLMSG_ALIGNTO) < 0 ||
        nla_put_u32(msg.get(), IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS) < 0)
        return make_error(Errc::io, "cannot build an rtnetlink request");
    NetdevParent out;
    nl_socket_modify_cb(sock.get(), NL_CB_VALID, NL_CB_CUSTOM, on_link, &out);
    if (int r = nl_send_auto(sock.get(), msg.get()); r < 0)
        return make_error(Errc::io, std::string("rtnetlink getlink: ") + nl_geterror(r));
    if (int r = nl_recvmsgs_default(sock.get()); r < 0) {
        if (r == -NLE_OBJ_NOTFOUND || r == -NLE_NODEV)
            return make_error(Errc::not_found, "no netdev with ifindex " + std::to_string(ifindex) +
                                                   " in the daemon's network namespace");
        return make_error(Errc::io, std::string("rtnetlink getlink: ") + nl_geterror(r));
    }
    if (out.netdev.empty())
        return make_error(Errc::not_found, "no netdev with ifindex " + std::to_string(ifindex));
    return out;
}

Result<void> require_dma_device(int ifindex) {
    auto parent = netdev_parent(ifindex);
    if (!parent) return std::move(parent).error().context("devmem");
    if (parent->bus == "pci") return {};
    std::string name = quote_untrusted(parent->netdev);
    std::string why =
        parent->device.empty()
            ? name + " has no parent device (a virtual device such as veth, lo or a bridge)"
            : name + "'s parent device " + quote_untrusted(parent->device) + " is on the " +
                  quote_untrusted(parent->bus.empty() ? "unknown" : parent->bus) + " bus, not PCI";
    return make_error(Errc::driver_failure,
                      "devmem: " + why +
                          ", so it has no DMA device to map a dma-buf for; the kernel is not "
                          "asked (Linux 6.12 logs a WARNING for such a bind-rx). Name a PCI NIC "
                          "whose driver supports devmem TCP (gve, bnxt_en, mlx5_core, fbnic)");
}

} // namespace knod::driver
