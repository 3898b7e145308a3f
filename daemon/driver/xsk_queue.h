// One AF_XDP socket (copy mode) on one RX queue of the sim NIC, registered in the filter's
// XSKMAP so the filter's redirects for that queue land here. RX only.
#pragma once

#include "knod/result.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

struct xsk_socket;
struct xsk_umem;

namespace knod::driver {

class XskQueue {
  public:
    static Result<std::unique_ptr<XskQueue>> open(const std::string &ifname, std::uint32_t queue,
                                                  int xsks_map_fd);
    ~XskQueue();
    XskQueue(const XskQueue &) = delete;
    XskQueue &operator=(const XskQueue &) = delete;

    int fd() const;
    std::uint32_t queue() const { return queue_; }
    // Hands every received frame to `deliver`, returns the frames to the kernel, and says how
    // many there were. Frames come in batches (what the RX ring held at once): `flush`, if
    // given, is called after each batch's last `deliver`, while its frames are still valid (a
    // frame's bytes may be kept until then, not after).
    std::size_t drain(const std::function<void(std::span<const std::uint8_t>)> &deliver,
                      const std::function<void()> &flush = {});

  private:
    XskQueue() = default;
    struct Rings;
    std::unique_ptr<Rings> rings_;
    void *area_ = nullptr;
    std::size_t area_size_ = 0;
    xsk_umem *umem_ = nullptr;
    xsk_socket *socket_ = nullptr;
    int xsks_map_fd_ = -1;
    std::uint32_t queue_ = 0;
};

} // namespace knod::driver
