// The kernel's `netdev` generic-netlink family (Documentation/netlink/specs/netdev.yaml),
// through libnl-genl: the devmem TCP interface. Queue inventory (which RX queues a dma-buf,
// io_uring or AF_XDP already owns) and bind-rx, whose binding lives exactly as long as the
// netlink socket that made it. Kernel extack messages travel in the errors.
#pragma once

#include "knod/result.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct nl_sock;
struct nlmsghdr;

namespace knod::driver {

struct NetdevQueue {
    std::uint32_t id = 0;
    enum class Type { rx = 0, tx = 1 } type = Type::rx;
    std::uint32_t napi_id = 0;
    std::optional<std::uint32_t> dmabuf; // devmem binding id owning it
    bool io_uring = false;
    bool xsk = false;
    bool owned() const { return dmabuf || io_uring || xsk; }
};

// One RX queue's hardware counters (netdev qstats-get, queue scope); each is absent when the
// driver does not report it.
struct QueueStats {
    std::uint32_t queue = 0;
    std::optional<std::uint64_t> rx_packets;
    std::optional<std::uint64_t> rx_bytes;
};

// One qstats-get reply: the stats when it is an RX queue's (queue scope), nullopt for a TX
// queue's or a device-scope reply.
std::optional<QueueStats> parse_qstats_reply(nlmsghdr *reply);

struct NetdevDevice {
    int ifindex = 0;
    std::uint64_t xdp_features = 0;
};

// One netlink socket speaking the family. Move-only; closing it ends every binding made on it.
class NetdevGenl {
  public:
    // Resolves the family; fails with `unavailable` when the kernel has no netdev family.
    static Result<NetdevGenl> open();
    NetdevGenl(NetdevGenl &&) noexcept;
    NetdevGenl &operator=(NetdevGenl &&) noexcept;
    ~NetdevGenl();

    int family() const { return family_; }
    // The socket's descriptor: a copy of it kept elsewhere (systemd's fd store) keeps the
    // bindings made on it alive after this object closes.
    int fd() const;
    Result<NetdevDevice> device(int ifindex);
    // Every queue of `ifindex`, RX and TX, in queue order.
    Result<std::vector<NetdevQueue>> queues(int ifindex);
    // The hardware counters of RX queue `queue` of `ifindex`; nullopt when the driver keeps no
    // per-queue stats (the kernel answers EOPNOTSUPP or an empty dump: veth, lo), which is not
    // an error.
    Result<std::optional<QueueStats>> rx_queue_stats(int ifindex, std::uint32_t queue);
    // Binds the dma-buf to the RX queues; returns the kernel's binding id. Errors carry the
    // kernel's own reason (extack) and errno. A netdev whose parent is not a PCI function is
    // refused without asking the kernel (require_dma_device).
    Result<std::uint32_t> bind_rx(int ifindex, const std::vector<std::uint32_t> &rx_queues,
                                  int dmabuf_fd);

  private:
    NetdevGenl(nl_sock *sock, int family) : sock_(sock), family_(family) {}
    nl_sock *sock_ = nullptr;
    int family_ = 0;
};

// What a bind-rx errno (and the kernel's extack text, when it sent one) means, for the error.
std::string bind_rx_hint(int error, const std::string &extack);

} // namespace knod::driver
