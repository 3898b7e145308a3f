#include "host/netdev_genl.h"

#include "host/dma_device.h"

#include <linux/netlink.h>
#include <netlink/attr.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <map>

namespace knod::driver {
namespace {

// From include/uapi/linux/netdev.h (Linux 6.18); Debian 12's headers predate most of it.
enum : int {
    cmd_dev_get = 1,
    cmd_queue_get = 10,
    cmd_qstats_get = 12,
    cmd_bind_rx = 13,
};
enum : int { a_dev_ifindex = 1, a_dev_xdp_features = 3 };
enum : int {
    a_queue_id = 1,
    a_queue_ifindex = 2,
    a_queue_type = 3,
    a_queue_napi_id = 4,
    a_queue_dmabuf = 5,
    a_queue_io_uring = 6,
    a_queue_xsk = 7,
    a_queue_max = 7,
};
enum : int {
    a_qstats_ifindex = 1,
    a_qstats_queue_type = 2,
    a_qstats_queue_id = 3,
    a_qstats_scope = 4,
    a_qstats_rx_packets = 8,
    a_qstats_rx_bytes = 9,
    a_qstats_max = 9, // the rest (tx, csum, gro, drops...) is not read
};
constexpr std::uint32_t qstats_scope_queue = 1;
enum : int { a_dmabuf_ifindex = 1, a_dmabuf_queues = 2, a_dmabuf_fd = 3, a_dmabuf_id = 4 };
constexpr int queue_type_rx = 0;

using MsgPtr = std::unique_ptr<nl_msg, decltype(&nlmsg_free)>;

// What one request brought back: the kernel's errno and extack text, and each reply message.
struct Exchange {
    int error = 0;
    bool finished = false; // the ACK of a request, or the end of a dump
    std::string extack;
    std::optional<std::uint32_t> bad_offset; // where in our request the kernel found fault
    std::function<void(nlattr **)> on_reply;
    int max_attr = 0;
};

// The extack attributes follow the echoed request inside NLMSG_ERROR (we ask for them with
// NETLINK_EXT_ACK and for a capped echo with NETLINK_CAP_ACK).
int on_error(sockaddr_nl *, nlmsgerr *err, void *arg) {
    auto *x = static_cast<Exchange *>(arg);
    x->error = err->error;
    x->finished = true;
    auto *hdr = reinterpret_cast<nlmsghdr *>(reinterpret_cast<char *>(err) - NLMSG_HDRLEN);
    if (hdr->nlmsg_flags & NLM_F_ACK_TLVS) {
        std::size_t skip = sizeof(nlmsgerr);
        if (!(hdr->nlmsg_flags & NLM_F_CAPPED)) skip += err->msg.nlmsg_len - NLMSG_HDRLEN;
        int len = static_cast<int>(hdr->nlmsg_len) - NLMSG_HDRLEN - static_cast<int>(skip);
        auto *attrs = reinterpret_cast<nlattr *>(reinterpret_cast<char *>(err) + skip);
        nlattr *a;
        int rem;
        if (len > 0) nla_for_each_attr(a, attrs, len, rem) {
                if (nla_type(a) == NLMSGERR_ATTR_MSG) x->extack = nla_get_string(a);
                if (nla_type(a) == NLMSGERR_ATTR_OFFS) x->bad_offset = nla_get_u32(a);
            }
    }
    return NL_STOP;
}

int on_valid(nl_msg *msg, void *arg) {
    auto *x = static_cast<Exchange *>(arg);
    std::vector<nlattr *> tb(static_cast<std::size_t>(x->max_attr) + 1, nullptr);
    if (genlmsg_parse(nlmsg_hdr(msg), 0, tb.data(), x->max_attr, nullptr) == 0 && x->on_reply)
        x->on_reply(tb.data());
    return NL_OK;
}

int on_finished(nl_msg *, void *arg) {
    static_cast<Exchange *>(arg)->finished = true;
    return NL_STOP;
}

// Which top-level attribute of `msg` starts at `offset` (the kernel's NLMSGERR_ATTR_OFFS).
int attribute_at(nl_msg *msg, std::uint32_t offset) {
    nlmsghdr *nlh = nlmsg_hdr(msg);
    nlattr *a;
    int rem;
    nla_for_each_attr(a, genlmsg_attrdata(static_cast<genlmsghdr *>(nlmsg_data(nlh)), 0),
                      genlmsg_attrlen(static_cast<genlmsghdr *>(nlmsg_data(nlh)), 0), rem) {
        auto at =
            static_cast<std::uint32_t>(reinterpret_cast<char *>(a) - reinterpret_cast<char *>(nlh));
        if (offset >= at && offset < at + a->nla_len) return nla_type(a);
    }
    return -1;
}

Error kernel_error(const char *what, const Exchange &x, nl_msg *msg,
                   const std::map<int, const char *> &names) {
    std::string msg_text = std::string(what) + ": " + std::strerror(-x.error);
    std::string kernel = x.extack;
    if (x.bad_offset) {
        auto it = names.find(attribute_at(msg, *x.bad_offset));
        if (it != names.end())
            kernel += (kernel.empty() ? "" : "; ") + std::string("bad attribute ") + it->second;
    }
    if (!kernel.empty()) msg_text += " (kernel: " + kernel + ")";
    return make_error(Errc::driver_failure, msg_text);
}

Result<void> exchange(nl_sock *sock, nl_msg *msg, Exchange &x, const char *what,
                      const std::map<int, const char *> &names = {}) {
    std::unique_ptr<nl_cb, decltype(&nl_cb_put)> cb(nl_cb_alloc(NL_CB_DEFAULT), nl_cb_put);
    if (!cb) return make_error(Errc::io, "cannot allocate netlink callbacks");
    nl_cb_set(cb.get(), NL_CB_VALID, NL_CB_CUSTOM, on_valid, &x);
    nl_cb_set(cb.get(), NL_CB_ACK, NL_CB_CUSTOM, on_finished, &x);
    nl_cb_set(cb.get(), NL_CB_FINISH, NL_CB_CUSTOM, on_finished, &x);
    nl_cb_err(cb.get(), NL_CB_CUSTOM, on_error, &x);
    if (int r = nl_send_auto(sock, msg); r < 0)
        return make_error(Errc::io, std::string(what) + ": send: " + nl_geterror(r));
    // A reply and its ACK may come in separate reads: read until one of them ends the exchange.
    while (!x.finished) {
        int r = nl_recvmsgs(sock, cb.get());
        if (x.error) return kernel_error(what, x, msg, names);
        if (r < 0) return make_error(Errc::io, std::string(what) + ": " + nl_geterror(r));
    }
    if (x.error) return kernel_error(what, x, msg, names);
    return {};
}

Result<MsgPtr> request(int family, int cmd, int flags) {
    MsgPtr msg(nlmsg_alloc(), nlmsg_free);
    if (!msg) return make_error(Errc::io, "cannot allocate a netlink message");
    // Dumps end with NLMSG_DONE; single requests ask for an ACK so errors always arrive.
    int ack = (flags & NLM_F_DUMP) ? 0 : NLM_F_ACK;
    if (!genlmsg_put(msg.get(), NL_AUTO_PORT, NL_AUTO_SEQ, family, 0, flags | ack, cmd, 1))
        return make_error(Errc::io, "cannot build a netlink message");
    return msg;
}

// qstats values are the kernel's NLA_UINT: 4 or 8 bytes, whichever holds the value.
std::optional<std::uint64_t> get_uint(nlattr *a) {
    if (!a) return std::nullopt;
    if (nla_len(a) == 8) return nla_get_u64(a);
    if (nla_len(a) == 4) return nla_get_u32(a);
    return std::nullopt;
}

// A u32 attribute's value; none for an absent or short one (parsed without a policy, an
// attribute's length is the sender's word: nla_get_u32 would read past it).
std::optional<std::uint32_t> get_u32(nlattr *a) {
    if (!a || nla_len(a) < 4) return std::nullopt;
    return nla_get_u32(a);
}

std::optional<QueueStats> qstats_of(nlattr **tb) {
    auto id = get_u32(tb[a_qstats_queue_id]), type = get_u32(tb[a_qstats_queue_type]);
    if (!id || !type) return std::nullopt; // device scope
    if (*type != queue_type_rx) return std::nullopt;
    QueueStats s;
    s.queue = *id;
    s.rx_packets = get_uint(tb[a_qstats_rx_packets]);
    s.rx_bytes = get_uint(tb[a_qstats_rx_bytes]);
    return s;
}

} // namespace

std::optional<QueueStats> parse_qstats_reply(nlmsghdr *reply) {
    nlattr *tb[a_qstats_max + 1] = {};
    if (genlmsg_parse(reply, 0, tb, a_qstats_max, nullptr) != 0) return std::nullopt;
    return qstats_of(tb);
}

// What each errno of bind-rx means on Linux 6.12 and newer (net/core/netdev-genl.c, devmem.c,
// netdev_rx_queue.c). The extack, when the kernel sent one, tells apart the causes an errno shares.
std::string bind_rx_hint(int error, const std::string &extack) {
    auto said = [&](const char *s) { return extack.find(s) != std::string::npos; };
    switch (error < 0 ? -error : error) {
    case EOPNOTSUPP:
        if (said("DMA")) return "the netdev has no DMA device to map the dma-buf for";
        return "the NIC's driver has no queue management for devmem TCP (upstream: gve, bnxt_en, "
               "mlx5_core, fbnic)";
    case ERANGE:
        return "a queue id is beyond the device's active RX queues";
    case EINVAL:
        if (said("Failed to bind dmabuf to device"))
            return "the netdev has no DMA device to attach the dma-buf to";
        if (said("tcp-data-split") || said("hds"))
            return "header split is off or hds-thresh is not 0 (ethtool -G DEV tcp-data-split on "
                   "hds-thresh 0)";
        return "the region is not a dma-buf, or the NIC cannot take it: header split off or "
               "hds-thresh not 0 (ethtool -G DEV tcp-data-split on hds-thresh 0)";
    case EEXIST:
        if (said("XDP")) return "an XDP program is attached to the device";
        if (said("memory provider"))
            return "the queue already has a memory provider (devmem or io_uring zero-copy receive)";
        return "an XDP program is attached, or the queue already has a memory provider (devmem or "
               "io_uring zero-copy receive)";
    case EBUSY:
        return "an AF_XDP socket uses the queue";
    case ENODATA:
        return "the queue's page pool cannot take unreadable memory";
    case ENODEV:
        return "no such device in the daemon's network namespace (it went away)";
    default:
        return "devmem bind-rx refused";
    }
}

Result<NetdevGenl> NetdevGenl::open() {
    nl_sock *sock = nl_socket_alloc();
    if (!sock) return make_error(Errc::io, "cannot allocate a netlink socket");
    if (int r = genl_connect(sock); r < 0) {
        nl_socket_free(sock);
        return make_error(Errc::io, std::string("generic netlink: ") + nl_geterror(r));
    }
    int one = 1;
    setsockopt(nl_socket_get_fd(sock), SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one);
    setsockopt(nl_socket_get_fd(sock), SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one);
    int family = genl_ctrl_resolve(sock, "netdev");
    if (family < 0) {
        nl_socket_free(sock);
        return make_error(Errc::unavailable,
                          std::string("the kernel has no netdev generic-netlink family (") +
                              nl_geterror(family) + "): devmem TCP needs Linux 6.12 or newer");
    }
    return NetdevGenl(sock, family);
}

int NetdevGenl::fd() const {
    return sock_ ? nl_socket_get_fd(sock_) : -1;
}

NetdevGenl::NetdevGenl(NetdevGenl &&o) noexcept : sock_(o.sock_), family_(o.family_) {
    o.sock_ = nullptr;
}

NetdevGenl &NetdevGenl::operator=(NetdevGenl &&o) noexcept {
    if (this != &o) {
        if (sock_) nl_socket_free(sock_);
        sock_ = o.sock_;
        family_ = o.family_;
        o.sock_ = nullptr;
    }
    return *this;
}

NetdevGenl::~NetdevGenl() {
    if (sock_) nl_socket_free(sock_); // closes the socket: the kernel unbinds what it bound
}

Result<NetdevDevice> NetdevGenl::device(int ifindex) {
    auto msg = request(family_, cmd_dev_get, 0);
    if (!msg) return std::move(msg).error();
    nla_put_u32(msg->get(), a_dev_ifindex, static_cast<std::uint32_t>(ifindex));
    NetdevDevice dev;
    bool got = false;
    Exchange x;
    x.max_attr = 6;
    x.on_reply = [&](nlattr **tb) {
        got = true;
        if (auto i = get_u32(tb[a_dev_ifindex])) dev.ifindex = static_cast<int>(*i);
        if (auto f = get_uint(tb[a_dev_xdp_features])) dev.xdp_features = *f;
    };
    if (auto r = exchange(sock_, msg->get(), x, "netdev dev-get"); !r) return std::move(r).error();
    if (!got)
        return make_error(Errc::not_found,
                          "netdev dev-get: no reply for ifindex " + std::to_string(ifindex));
    return dev;
}

Result<std::vector<NetdevQueue>> NetdevGenl::queues(int ifindex) {
    auto msg = request(family_, cmd_queue_get, NLM_F_DUMP);
    if (!msg) return std::move(msg).error();
    nla_put_u32(msg->get(), a_queue_ifindex, static_cast<std::uint32_t>(ifindex));
    std::vector<NetdevQueue> out;
    Exchange x;
    x.max_attr = a_queue_max;
    x.on_reply = [&](nlattr **tb) {
        auto id = get_u32(tb[a_queue_id]), type = get_u32(tb[a_queue_type]);
        if (!id || !type) return;
        if (tb[a_queue_ifindex] &&
            get_u32(tb[a_queue_ifindex]) != static_cast<std::uint32_t>(ifindex))
            return;
        NetdevQueue q;
        q.id = *id;
        q.type = *type == queue_type_rx ? NetdevQueue::Type::rx : NetdevQueue::Type::tx;
        if (auto n = get_u32(tb[a_queue_napi_id])) q.napi_id = *n;
        if (tb[a_queue_dmabuf]) q.dmabuf = get_u32(tb[a_queue_dmabuf]).value_or(0);
        q.io_uring = tb[a_queue_io_uring] != nullptr;
        q.xsk = tb[a_queue_xsk] != nullptr;
        out.push_back(q);
    };
    if (auto r = exchange(sock_, msg->get(), x, "netdev queue-get"); !r)
        return std::move(r).error();
    return out;
}

Result<std::optional<QueueStats>> NetdevGenl::rx_queue_stats(int ifindex, std::uint32_t queue) {
    auto msg = request(family_, cmd_qstats_get, NLM_F_DUMP);
    if (!msg) return std::move(msg).error();
    nla_put_u32(msg->get(), a_qstats_ifindex, static_cast<std::uint32_t>(ifindex));
    nla_put_u32(msg->get(), a_qstats_scope, qstats_scope_queue);
    std::optional<QueueStats> found;
    Exchange x;
    x.max_attr = a_qstats_max;
    x.on_reply = [&](nlattr **tb) {
        if (tb[a_qstats_ifindex] &&
            get_u32(tb[a_qstats_ifindex]) != static_cast<std::uint32_t>(ifindex))
            return;
        if (auto s = qstats_of(tb); s && s->queue == queue) found = s;
    };
    if (auto r = exchange(sock_, msg->get(), x, "netdev qstats-get"); !r) {
        // A driver without per-queue stats: nothing to read, not a failure.
        if (x.error == -EOPNOTSUPP) return std::optional<QueueStats>();
        return std::move(r).error();
    }
    return found;
}

Result<std::uint32_t> NetdevGenl::bind_rx(int ifindex, const std::vector<std::uint32_t> &rx_queues,
                                          int dmabuf_fd) {
    // Never ask for a netdev without a DMA device: 6.12 answers with a kernel WARNING.
    if (auto dma = require_dma_device(ifindex); !dma) return std::move(dma).error();
    auto msg = request(family_, cmd_bind_rx, 0);
    if (!msg) return std::move(msg).error();
    nla_put_u32(msg->get(), a_dmabuf_ifindex, static_cast<std::uint32_t>(ifindex));
    nla_put_u32(msg->get(), a_dmabuf_fd, static_cast<std::uint32_t>(dmabuf_fd));
    for (auto q : rx_queues) {
        nlattr *nest = nla_nest_start(msg->get(), a_dmabuf_queues | NLA_F_NESTED);
        nla_put_u32(msg->get(), a_queue_id, q);
        nla_put_u32(msg->get(), a_queue_type, queue_type_rx);
        nla_nest_end(msg->get(), nest);
    }
    std::optional<std::uint32_t> id;
    Exchange x;
    x.max_attr = a_dmabuf_id;
    x.on_reply = [&](nlattr **tb) {
        if (tb[a_dmabuf_id]) id = nla_get_u32(tb[a_dmabuf_id]);
    };
    static const std::map<int, const char *> names = {
        {a_dmabuf_ifindex, "ifindex"}, {a_dmabuf_queues, "queues"}, {a_dmabuf_fd, "fd"}};
    if (auto r = exchange(sock_, msg->get(), x, "netdev bind-rx", names); !r)
        return std::move(r).error().context(bind_rx_hint(x.error, x.extack));
    if (!id) return make_error(Errc::driver_failure, "netdev bind-rx: the reply has no binding id");
    return *id;
}

} // namespace knod::driver
