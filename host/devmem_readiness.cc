#include "host/devmem_readiness.h"

#include "knod/unique_fd.h"
#include "knod/untrusted.h"

#include <bpf/bpf.h>
#include <linux/ethtool.h>
#include <linux/ethtool_netlink.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netlink/attr.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>

namespace knod::host {
namespace {

// From include/uapi/linux/ethtool_netlink.h of Linux 6.13+; Debian 12's headers stop at
// ETHTOOL_A_RINGS_TX_PUSH.
enum : int {
    a_rings_tcp_data_split = 11,
    a_rings_hds_thresh = 17,
    a_rings_max = 18,
};
constexpr std::uint8_t split_off = 1, split_on = 2;

using SockPtr = std::unique_ptr<nl_sock, decltype(&nl_socket_free)>;
using MsgPtr = std::unique_ptr<nl_msg, decltype(&nlmsg_free)>;

Result<SockPtr> connect(int protocol) {
    SockPtr sock(nl_socket_alloc(), nl_socket_free);
    if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket");
    if (int r = nl_connect(sock.get(), protocol); r < 0)
        return make_error(Errc::io, std::string("netlink: ") + nl_geterror(r));
    return sock;
}

template <typename T> struct Reply {
    std::optional<Result<T>> value;
    Result<T> (*parse)(nlmsghdr *);
};

template <typename T> int on_reply(nl_msg *msg, void *arg) {
    auto *r = static_cast<Reply<T> *>(arg);
    r->value = r->parse(nlmsg_hdr(msg));
    return NL_OK;
}

// Sends `msg` and parses the one reply it brings.
template <typename T>
Result<T> ask(nl_sock *sock, nl_msg *msg, Result<T> (*parse)(nlmsghdr *), const std::string &what) {
    Reply<T> reply{std::nullopt, parse};
    nl_socket_modify_cb(sock, NL_CB_VALID, NL_CB_CUSTOM, on_reply<T>, &reply);
    if (int r = nl_send_auto(sock, msg); r < 0)
        return make_error(Errc::io, what + ": send: " + nl_geterror(r));
    if (int r = nl_recvmsgs_default(sock); r < 0) {
        Errc code = r == -NLE_OPNOTSUPP                         ? Errc::unavailable
                    : r == -NLE_NODEV || r == -NLE_OBJ_NOTFOUND ? Errc::not_found
                                                                : Errc::io;
        return make_error(code, what + ": " + nl_geterror(r));
    }
    if (!reply.value) return make_error(Errc::io, what + ": no reply");
    return std::move(*reply.value);
}

std::string xdp_owner(const XdpAttachment &x) {
    std::string who = "program id " + std::to_string(x.prog_id);
    if (!x.prog_name.empty()) who += " (" + quote_untrusted(x.prog_name) + ")";
    // BPF object names are cut to 15 characters: knod_flow_filter shows as knod_flow_filte.
    if (x.prog_name.rfind("knod_flow_filt", 0) == 0) who += ", knod's own flow filter";
    return who;
}

const char *xdp_mode(std::uint8_t mode) {
    switch (mode) {
    case XDP_ATTACHED_DRV:
        return "native";
    case XDP_ATTACHED_SKB:
        return "generic";
    case XDP_ATTACHED_HW:
        return "offloaded";
    case XDP_ATTACHED_MULTI:
        return "several modes";
    }
    return "unknown mode";
}

} // namespace

std::vector<std::string> held_rx_queues(const std::vector<driver::NetdevQueue> &queues) {
    std::vector<const driver::NetdevQueue *> rx;
    for (auto &q : queues)
        if (q.type == driver::NetdevQueue::Type::rx && q.owned()) rx.push_back(&q);
    std::sort(rx.begin(), rx.end(), [](auto *a, auto *b) { return a->id < b->id; });
    std::vector<std::string> out;
    for (auto *q : rx) {
        // A queue has one memory provider at most, but AF_XDP may sit beside none of them only;
        // name every holder the kernel reported rather than assume.
        std::vector<std::string> by;
        if (q->dmabuf)
            by.push_back("a devmem dma-buf (binding " + std::to_string(*q->dmabuf) + ")");
        if (q->io_uring) by.push_back("io_uring zero-copy receive");
        if (q->xsk) by.push_back("an AF_XDP socket");
        std::string line = "queue " + std::to_string(q->id) + " is held by ";
        for (std::size_t i = 0; i < by.size(); ++i)
            line += (i ? " and " : "") + by[i];
        out.push_back(line);
    }
    return out;
}

std::vector<std::uint32_t> queues_outside_rss(const DevmemFacts &f) {
    std::vector<std::uint32_t> out;
    std::set<std::uint32_t> reached;
    if (f.rss) reached.insert(f.rss->begin(), f.rss->end());
    for (std::uint32_t q = 1; q < f.rx_queues; ++q)
        if (!reached.count(q)) out.push_back(q);
    return out;
}

std::vector<DevmemProblem> devmem_problems(const DevmemFacts &f) {
    std::vector<DevmemProblem> out;
    const std::string dev = f.netdev;
    if (!f.split) {
        out.push_back({"header-split",
                       "cannot read the ring settings (ethtool rings-get): " + f.split_error +
                           "; devmem TCP needs header split (tcp-data-split)",
                       "use a NIC whose driver supports devmem TCP (gve, bnxt_en, mlx5_core, "
                       "fbnic)",
                       true});
    } else if (!f.split->tcp_data_split) {
        out.push_back({"header-split",
                       "the driver reports no header split (tcp-data-split): devmem TCP puts "
                       "headers in host memory and payload in the dma-buf, so it needs one",
                       "use a NIC whose driver supports header split and devmem TCP (gve, "
                       "bnxt_en, mlx5_core, fbnic)",
                       true});
    } else if (*f.split->tcp_data_split != split_on) {
        out.push_back({"header-split",
                       std::string("header split (tcp-data-split) is ") +
                           (*f.split->tcp_data_split == split_off ? "off" : "auto") +
                           ": bind-rx refuses a device that does not split headers",
                       "ethtool -G " + dev + " tcp-data-split on", true});
    }
    if (f.split && f.split->hds_thresh && *f.split->hds_thresh != 0)
        out.push_back({"hds-thresh",
                       "hds-thresh is " + std::to_string(*f.split->hds_thresh) +
                           ": payloads below it stay with the headers in host memory, and "
                           "bind-rx refuses a threshold other than 0",
                       "ethtool -G " + dev + " hds-thresh 0", true});
    if (!f.xdp)
        out.push_back(
            {"xdp", "cannot tell whether an XDP program is attached: " + f.xdp_error, "", true});
    else if (f.xdp->attached())
        out.push_back({"xdp",
                       std::string("an XDP program is attached (") + xdp_mode(f.xdp->mode) + ", " +
                           xdp_owner(*f.xdp) + "): bind-rx refuses a device with XDP (EEXIST)",
                       "detach it (ip link set dev " + dev +
                           " xdp off, or xdpgeneric off), or use another NIC",
                       true});
    if (f.rx_queues == 1)
        out.push_back({"queues",
                       "one active RX queue: it carries the host's own traffic, so no queue can "
                       "be isolated for a binding",
                       "ethtool -L " + dev + " combined N (N > 1), or use a multi-queue NIC"});
    if (!f.rss_error.empty())
        out.push_back({"rss", "cannot read the RSS indirection table: " + f.rss_error,
                       "run as root; a binding's queue must be outside RSS"});
    else if (f.rx_queues > 1 && queues_outside_rss(f).empty())
        out.push_back({"rss",
                       "RSS spreads traffic onto every RX queue past 0, so any flow could land in "
                       "a binding's memory",
                       "keep RSS off the top queue: ethtool -X " + dev + " equal " +
                           std::to_string(f.rx_queues - 1)});
    return out;
}

Result<HeaderSplit> parse_rings_reply(nlmsghdr *reply) {
    nlattr *tb[a_rings_max + 1] = {};
    if (genlmsg_parse(reply, 0, tb, a_rings_max, nullptr) < 0)
        return make_error(Errc::corrupt, "ethtool rings-get: unparsable reply");
    HeaderSplit h;
    if (tb[a_rings_tcp_data_split]) {
        if (nla_len(tb[a_rings_tcp_data_split]) < 1)
            return make_error(Errc::corrupt, "ethtool rings-get: short tcp-data-split");
        h.tcp_data_split = nla_get_u8(tb[a_rings_tcp_data_split]);
    }
    if (tb[a_rings_hds_thresh]) {
        if (nla_len(tb[a_rings_hds_thresh]) < 4)
            return make_error(Errc::corrupt, "ethtool rings-get: short hds-thresh");
        h.hds_thresh = nla_get_u32(tb[a_rings_hds_thresh]);
    }
    return h;
}

Result<XdpAttachment> parse_link_xdp(nlmsghdr *reply) {
    nlattr *tb[IFLA_MAX + 1] = {};
    if (nlmsg_parse(reply, sizeof(ifinfomsg), tb, IFLA_MAX, nullptr) < 0)
        return make_error(Errc::corrupt, "rtnetlink getlink: unparsable reply");
    XdpAttachment x;
    if (!tb[IFLA_XDP]) return x; // a kernel without XDP: nothing can be attached
    nlattr *xdp[IFLA_XDP_MAX + 1] = {};
    // With a policy, libnl refuses an attribute shorter than its type instead of reading on.
    nla_policy policy[IFLA_XDP_MAX + 1] = {};
    policy[IFLA_XDP_ATTACHED].type = NLA_U8;
    for (int a :
         {IFLA_XDP_PROG_ID, IFLA_XDP_DRV_PROG_ID, IFLA_XDP_SKB_PROG_ID, IFLA_XDP_HW_PROG_ID})
        policy[a].type = NLA_U32;
    if (nla_parse_nested(xdp, IFLA_XDP_MAX, tb[IFLA_XDP], policy) < 0)
        return make_error(Errc::corrupt, "rtnetlink getlink: unparsable IFLA_XDP");
    if (xdp[IFLA_XDP_ATTACHED]) x.mode = nla_get_u8(xdp[IFLA_XDP_ATTACHED]);
    if (xdp[IFLA_XDP_PROG_ID]) x.prog_id = nla_get_u32(xdp[IFLA_XDP_PROG_ID]);
    // Several modes at once: IFLA_XDP_PROG_ID is absent, name one of them.
    for (int a : {IFLA_XDP_DRV_PROG_ID, IFLA_XDP_SKB_PROG_ID, IFLA_XDP_HW_PROG_ID})
        if (!x.prog_id && xdp[a]) x.prog_id = nla_get_u32(xdp[a]);
    return x;
}

Result<HeaderSplit> read_header_split(int ifindex) {
    SockPtr sock(nl_socket_alloc(), nl_socket_free);
    if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket");
    if (int r = genl_connect(sock.get()); r < 0)
        return make_error(Errc::io, std::string("genetlink: ") + nl_geterror(r));
    int family = genl_ctrl_resolve(sock.get(), ETHTOOL_GENL_NAME);
    if (family < 0)
        return make_error(Errc::unavailable, "the kernel has no ethtool netlink family");
    MsgPtr msg(nlmsg_alloc(), nlmsg_free);
    if (!msg || !genlmsg_put(msg.get(), NL_AUTO_PORT, NL_AUTO_SEQ, family, 0, 0,
                             ETHTOOL_MSG_RINGS_GET, ETHTOOL_GENL_VERSION))
        return make_error(Errc::io, "cannot build an ethtool request");
    nlattr *hdr = nla_nest_start(msg.get(), ETHTOOL_A_RINGS_HEADER);
    if (!hdr ||
        nla_put_u32(msg.get(), ETHTOOL_A_HEADER_DEV_INDEX, static_cast<std::uint32_t>(ifindex)) < 0)
        return make_error(Errc::io, "cannot build an ethtool request");
    nla_nest_end(msg.get(), hdr);
    return ask<HeaderSplit>(sock.get(), msg.get(), parse_rings_reply, "ethtool rings-get");
}

Result<XdpAttachment> read_xdp(int ifindex) {
    auto sock = connect(NETLINK_ROUTE);
    if (!sock) return std::move(sock).error();
    MsgPtr msg(nlmsg_alloc_simple(RTM_GETLINK, 0), nlmsg_free);
    ifinfomsg ifi{};
    ifi.ifi_family = AF_UNSPEC;
    ifi.ifi_index = ifindex;
    if (!msg || nlmsg_append(msg.get(), &ifi, sizeof ifi, NLMSG_ALIGNTO) < 0 ||
        nla_put_u32(msg.get(), IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS) < 0)
        return make_error(Errc::io, "cannot build an rtnetlink request");
    auto x = ask<XdpAttachment>(sock->get(), msg.get(), parse_link_xdp, "rtnetlink getlink");
    if (!x || !x->prog_id) return x;
    // Whose program: its name, where the BPF object can be opened (root).
    UniqueFd prog(bpf_prog_get_fd_by_id(x->prog_id));
    if (prog.valid()) {
        bpf_prog_info info{};
        std::uint32_t len = sizeof info;
        if (bpf_obj_get_info_by_fd(prog.get(), &info, &len) == 0)
            x->prog_name.assign(info.name, strnlen(info.name, sizeof info.name));
    }
    return x;
}

Result<std::optional<std::vector<std::uint32_t>>> read_rss_table(const std::string &ifname) {
    // ioctl(SIOCETHTOOL) needs a socket of some family; netlink is the one the unit allows.
    UniqueFd fd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    if (!fd.valid()) return make_error(Errc::io, std::string("socket: ") + std::strerror(errno));
    auto ask_table = [&](std::vector<std::uint32_t> &buf, std::uint32_t size) {
        buf.assign(2 + size, 0); // struct ethtool_rxfh_indir: cmd, size, ring_index[size]
        buf[0] = ETHTOOL_GRXFHINDIR;
        buf[1] = size;
        ifreq ifr{};
        std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
        ifr.ifr_data = reinterpret_cast<char *>(buf.data());
        return ioctl(fd.get(), SIOCETHTOOL, &ifr) == 0 ? 0 : errno;
    };
    std::vector<std::uint32_t> buf;
    int e = ask_table(buf, 0);
    if (e == EOPNOTSUPP) return std::optional<std::vector<std::uint32_t>>{};
    if (e == 0 && buf[1] > 0 && buf[1] <= 65536) e = ask_table(buf, buf[1]);
    if (e != 0)
        return make_error(Errc::driver_failure,
                          "cannot read the RSS table of " + ifname + ": " + std::strerror(e));
    return std::optional<std::vector<std::uint32_t>>(
        std::vector<std::uint32_t>(buf.begin() + 2, buf.end()));
}

DevmemFacts read_devmem_facts(int ifindex, const std::string &ifname, std::uint32_t rx_queues) {
    DevmemFacts f;
    f.netdev = ifname;
    f.rx_queues = rx_queues;
    if (auto s = read_header_split(ifindex))
        f.split = *s;
    else
        f.split_error = s.error().message;
    if (auto x = read_xdp(ifindex))
        f.xdp = *x;
    else
        f.xdp_error = x.error().message;
    if (auto r = read_rss_table(ifname))
        f.rss = *r;
    else
        f.rss_error = r.error().message;
    return f;
}

std::vector<policy::Diagnostic> devmem_policy_warnings(const policy::Policy &p) {
    std::vector<policy::Diagnostic> out;
    auto single = [](const policy::PortRange &r) { return r.any() || r.lo == r.hi; };
    for (auto &rule : p.rules) {
        if (rule.action != policy::Action::allow) continue;
        std::string bad;
        std::size_t unservable = 0;
        for (auto &f : rule.flows) {
            std::string why;
            if (f.protocol != policy::Protocol::tcp)
                why = "not TCP (devmem receives TCP only)";
            else if (!single(f.src.ports) || !single(f.dst.ports))
                why = "a port range (no ntuple rule form)";
            if (why.empty()) continue;
            ++unservable;
            bad += (bad.empty() ? "" : "; ") + f.to_string() + ": " + why;
        }
        if (!unservable) continue;
        std::string what = unservable == rule.flows.size()
                               ? "can never be served by the devmem driver"
                               : "has flows the devmem driver never serves";
        out.push_back({policy::Severity::warning, rule.where,
                       "rule '" + rule.name + "' " + what + ": " + bad});
    }
    return out;
}

Result<void> require_devmem_ready(int ifindex, const std::string &ifname) {
    DevmemFacts f = read_devmem_facts(ifindex, ifname, 0);
    f.rss_error.clear(); // the backend checks RSS against the queue it picks
    std::string why, fixes;
    for (auto &p : devmem_problems(f)) {
        if (!p.refuses_bind) continue;
        why += (why.empty() ? "" : "; ") + p.message;
        if (!p.fix.empty()) fixes += (fixes.empty() ? "" : "; ") + p.fix;
    }
    if (why.empty()) return {};
    return make_error(Errc::driver_failure, "devmem: " + quote_untrusted(ifname) +
                                                " cannot carry a binding: " + why +
                                                (fixes.empty() ? "" : " (fix: " + fixes + ")"));
}

} // namespace knod::host
