#include "daemon/driver/xsk_queue.h"
#include "knod/system_error.h"

#include <bpf/bpf.h>
#include <linux/if_xdp.h>
#include <sys/mman.h>
#include <xdp/xsk.h>

#include <cstring>

namespace knod::driver {
namespace {

constexpr std::uint32_t frame_count = 1024;
constexpr std::uint32_t frame_size = XSK_UMEM__DEFAULT_FRAME_SIZE; // 4096
constexpr std::uint32_t ring_size = 512;

} // namespace

struct XskQueue::Rings {
    xsk_ring_prod fill{};
    xsk_ring_cons completion{};
    xsk_ring_cons rx{};
};

Result<std::unique_ptr<XskQueue>> XskQueue::open(const std::string &ifname, std::uint32_t queue,
                                                 int xsks_map_fd) {
    std::unique_ptr<XskQueue> q(new XskQueue());
    q->rings_ = std::make_unique<Rings>();
    q->queue_ = queue;
    q->area_size_ = std::size_t{frame_count} * frame_size;
    q->area_ =
        mmap(nullptr, q->area_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q->area_ == MAP_FAILED) {
        q->area_ = nullptr;
        return system_error(Errc::driver_failure, errno, "AF_XDP: cannot map the UMEM area");
    }
    xsk_umem_config ucfg{};
    ucfg.fill_size = ring_size * 2;
    ucfg.comp_size = ring_size;
    ucfg.frame_size = frame_size;
    ucfg.frame_headroom = 0;
    // libxdp returns the errno of its last step, which is not always the one that failed (at
    // the fd limit it says ENOENT): a resource errno left behind names the cause instead.
    auto failure = [](const std::string &what, int r) {
        int err = exhausted_resource(errno) ? errno : -r;
        return system_error(Errc::driver_failure, err, what);
    };
    errno = 0;
    int r = xsk_umem__create(&q->umem_, q->area_, q->area_size_, &q->rings_->fill,
                             &q->rings_->completion, &ucfg);
    if (r != 0) return failure("AF_XDP umem", r);
    xsk_socket_config scfg{};
    scfg.rx_size = ring_size;
    scfg.tx_size = 0;
    scfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD; // the flow filter is our program
    scfg.bind_flags = XDP_COPY;
    errno = 0;
    r = xsk_socket__create(&q->socket_, ifname.c_str(), queue, q->umem_, &q->rings_->rx, nullptr,
                           &scfg);
    if (r != 0) return failure("AF_XDP socket on " + ifname + " queue " + std::to_string(queue), r);
    std::uint32_t idx = 0;
    std::uint32_t n = xsk_ring_prod__reserve(&q->rings_->fill, ring_size * 2, &idx);
    for (std::uint32_t i = 0; i < n; ++i)
        *xsk_ring_prod__fill_addr(&q->rings_->fill, idx + i) = std::uint64_t{i} * frame_size;
    xsk_ring_prod__submit(&q->rings_->fill, n);
    int fd = xsk_socket__fd(q->socket_);
    if (bpf_map_update_elem(xsks_map_fd, &queue, &fd, 0) != 0)
        return make_error(Errc::driver_failure, "AF_XDP: cannot register the socket in the XSKMAP");
    q->xsks_map_fd_ = xsks_map_fd;
    return q;
}

XskQueue::~XskQueue() {
    if (xsks_map_fd_ >= 0) bpf_map_delete_elem(xsks_map_fd_, &queue_);
    if (socket_) xsk_socket__delete(socket_);
    if (umem_) xsk_umem__delete(umem_);
    if (area_) munmap(area_, area_size_);
}

int XskQueue::fd() const {
    return xsk_socket__fd(socket_);
}

std::size_t XskQueue::drain(const std::function<void(std::span<const std::uint8_t>)> &deliver,
                            const std::function<void()> &flush) {
    std::size_t total = 0;
    for (;;) {
        std::uint32_t idx = 0;
        std::uint32_t n = xsk_ring_cons__peek(&rings_->rx, ring_size, &idx);
        if (n == 0) return total;
        // Every frame taken goes straight back to the fill ring once read. The ring holds every
        // frame of the UMEM, so there is always room for the ones just received.
        std::uint32_t fill_idx = 0;
        bool refill = xsk_ring_prod__reserve(&rings_->fill, n, &fill_idx) == n;
        for (std::uint32_t i = 0; i < n; ++i) {
            const xdp_desc *d = xsk_ring_cons__rx_desc(&rings_->rx, idx + i);
            auto *data = static_cast<const std::uint8_t *>(xsk_umem__get_data(area_, d->addr));
            deliver({data, d->len});
            if (refill)
                *xsk_ring_prod__fill_addr(&rings_->fill, fill_idx + i) =
                    xsk_umem__extract_addr(d->addr);
        }
        if (flush) flush();
        if (refill) xsk_ring_prod__submit(&rings_->fill, n);
        xsk_ring_cons__release(&rings_->rx, n);
        total += n;
    }
}

} // namespace knod::driver
