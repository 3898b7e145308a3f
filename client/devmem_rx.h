// Receiving on a devmem binding (Linux device-memory TCP), for the holder: with devmem the NIC
// writes the payload of the binding's TCP flows straight into the holder's dma-buf, and the
// holder's own TCP socket hands out where it landed instead of the bytes.
//
//   DevmemReceiver rx(tcp_fd);               // the holder's connected or accepted TCP socket
//   std::array<std::uint8_t, 4096> linear;   // for bytes the NIC could not split off
//   auto got = rx.receive(linear);           // one recvmsg(MSG_SOCK_DEVMEM)
//   for (auto &f : got->fragments)           // f.offset, f.size: payload in the dma-buf
//       consume(f);                          // (a GPU kernel reads it there)
//   rx.release(got->fragments);              // gives the buffers back (SO_DEVMEM_DONTNEED)
//
// Fragments stay the holder's until released: the NIC cannot reuse their memory, so a holder
// that never releases stops its own flow. Bytes the kernel could not place in the dma-buf (the
// header split failed, SCM_DEVMEM_LINEAR) arrive in `linear` as with a plain recv. Use the
// binding's counters (Client::wait_for_data) to learn that data arrived without a socket, or
// rx.wait_for_data(timeout_ms) on the socket itself (no round trip to the daemon).
// Kernel interface: Documentation/networking/devmem.rst (Linux 6.12).
#pragma once

#include "knod/result.h"

#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <vector>

namespace knod::client {

// From Linux 6.12 uapi (asm-generic/socket.h, linux/socket.h, linux/uio.h); older headers
// lack them.
inline constexpr int so_devmem_linear = 78; // also SCM_DEVMEM_LINEAR
inline constexpr int so_devmem_dmabuf = 79; // also SCM_DEVMEM_DMABUF
inline constexpr int so_devmem_dontneed = 80;
inline constexpr int msg_sock_devmem = 0x2000000;

struct DmabufCmsg { // struct dmabuf_cmsg
    std::uint64_t frag_offset;
    std::uint32_t frag_size;
    std::uint32_t frag_token;
    std::uint32_t dmabuf_id;
    std::uint32_t flags;
};
struct DmabufToken { // struct dmabuf_token
    std::uint32_t token_start;
    std::uint32_t token_count;
};
static_assert(sizeof(DmabufCmsg) == 24 && sizeof(DmabufToken) == 8, "the kernel's layouts");

// A piece of received payload in the dma-buf: `size` bytes at `offset`.
struct DevmemFragment {
    std::uint64_t offset = 0;
    std::uint32_t size = 0;
    std::uint32_t token = 0; // what release() gives back
    std::uint32_t dmabuf_id = 0;
};

// One run of a receive's payload in stream order: `size` linear bytes (the next ones of the
// caller's buffer) or the next fragment.
struct DevmemRun {
    bool linear = false;
    std::size_t size = 0;
};

struct DevmemReceived {
    std::vector<DevmemFragment> fragments; // in stream order
    std::size_t linear_bytes = 0;          // bytes copied into the caller's buffer, in order
    std::size_t bytes() const;             // payload bytes of this call, both kinds
    // Linear bytes and fragments interleaved as the stream had them (the kernel copies an skb's
    // linear part, SCM_DEVMEM_LINEAR, before its fragments). Empty when that order is unknown:
    // linear bytes no SCM_DEVMEM_LINEAR described, beside fragments.
    std::vector<DevmemRun> order;
};

// The control messages of one recvmsg(MSG_SOCK_DEVMEM) that returned `received` bytes. Bytes no
// SCM_DEVMEM_DMABUF accounts for are linear (SCM_DEVMEM_LINEAR, or readable data the kernel
// copied as usual). Fails (Errc::corrupt) on a truncated control buffer (MSG_CTRUNC: fragments
// would be lost, their tokens never returned) or a malformed message.
// `tokens`, when given, gets the token of every fragment the messages named, even when parsing
// fails: the caller can still give those buffers back.
Result<DevmemReceived> parse_devmem_cmsgs(const msghdr &msg, std::size_t received,
                                          std::vector<std::uint32_t> *tokens = nullptr);

// SO_DEVMEM_DONTNEED arguments for `tokens`: consecutive tokens merged into ranges, at most
// `max_ranges` ranges and `max_tokens` tokens per call (the kernel's limits: 128 and 1024).
std::vector<std::vector<DmabufToken>> devmem_token_batches(const std::vector<std::uint32_t> &tokens,
                                                           std::size_t max_ranges = 128,
                                                           std::size_t max_tokens = 1024);

// Whether `fd` can carry devmem receive: a TCP stream socket (IPv4 or IPv6), connected or not.
// devmem receive is TCP only: on any other socket recvmsg(MSG_SOCK_DEVMEM) hands out plain bytes
// and SO_DEVMEM_DONTNEED fails (EBADF), so a holder would learn of the mistake only at release.
// Errc::invalid_argument naming what the fd is instead (not a socket, UDP, a Unix socket, ...).
Result<void> check_devmem_socket(int fd);

// Whether a wait on a socket ended with it ready, the time run out, or a cancel fd readable.
enum class Ready { data, timeout, cancelled };

// Waits up to `timeout_ms` (< 0: for ever) for `events` (POLLIN, POLLOUT) on `fd`, or until
// `cancel_fd` (< 0: none) is readable; EINTR retried. A hang-up or error counts as ready: the
// next call on the socket answers at once. Errc::invalid_argument for an fd that is not open.
Result<Ready> wait_ready(int fd, short events, int timeout_ms, int cancel_fd);

// What receives devmem payload: a DevmemReceiver on a socket, or a test's crafted fragments.
class DevmemSource {
  public:
    using Ready = client::Ready;
    virtual ~DevmemSource() = default;
    // Waits up to `timeout_ms` (< 0: for ever) until receive() will not block, or `cancel_fd`
    // (< 0: none) is readable.
    virtual Result<Ready> wait(int timeout_ms, int cancel_fd) = 0;
    // One receive of at most linear.size() payload bytes, both kinds together. Zero bytes and no
    // fragment: the peer closed the stream.
    virtual Result<DevmemReceived> receive(std::span<std::uint8_t> linear) = 0;
    // Gives the fragments' buffers back to the NIC.
    virtual Result<void> release(const std::vector<DevmemFragment> &fragments) = 0;
};

class DevmemReceiver : public DevmemSource {
  public:
    explicit DevmemReceiver(int tcp_fd) : fd_(tcp_fd) {}
    // One recvmsg(MSG_SOCK_DEVMEM). Zero bytes and no fragment: the peer closed the stream.
    // EAGAIN on a non-blocking socket is Errc::unavailable.
    Result<DevmemReceived> receive(std::span<std::uint8_t> linear) override;
    // The devmem wait_for_data: waits up to `timeout_ms` (-1: forever) for the socket to have
    // something to receive (fragments, linear bytes or the peer's close), without the daemon.
    // true: receive() will not block; false: the time ran out.
    Result<bool> wait_for_data(int timeout_ms);
    Result<Ready> wait(int timeout_ms, int cancel_fd) override;
    // Gives the fragments' buffers back to the NIC.
    Result<void> release(const std::vector<DevmemFragment> &fragments) override;

  private:
    int fd_;
    std::vector<std::uint8_t> control_ =
        std::vector<std::uint8_t>(CMSG_SPACE(sizeof(DmabufCmsg)) * 256);
};

} // namespace knod::client
