// knod.distributed's data path on devmem (docs/collectives.md): a message from one rank to
// another travels on the TCP stream the sender opened to the receiver's flow, as a header and
// then the payload. On a devmem NIC the payload lands in the receiver's dma-buf (the binding's
// region) and the socket says where; here it is read off the dma-buf's CPU mapping and copied or
// reduced into place, and every fragment is given back to the NIC before the call returns, so
// the receive ring never fills with buffers nobody releases.
//
// A receive asks the kernel for no more than what is left of the message, so the next message's
// bytes stay in the socket: every call starts on a header. Every header is checked against the
// message the receiver expects (magic, message number, source rank, length): a stream that
// carries anything else is an error naming it, never a wrong tensor.
#pragma once

#include "client/devmem_rx.h"
#include "knod/result.h"

#include <cstdint>
#include <span>

namespace knod::client {

// The header before each message's payload: little-endian uint32 magic (KNOD_CHUNK_MAGIC),
// message number, source rank, zero; uint64 payload length.
inline constexpr std::size_t stream_header_size = 24;

// What the receiver expects, and where it goes: `total` bytes applied to `dst` with the C
// API's element type and operation (KNOD_CHUNK_*).
struct StreamMessage {
    std::uint32_t msg = 0;
    std::uint32_t source = 0;
    std::uint64_t total = 0;
    void *dst = nullptr;
    int dtype = 0;
    int op = 0;
};

struct StreamReceived {
    std::uint64_t dmabuf_bytes = 0; // payload (and header) bytes the NIC placed in the dma-buf
    std::uint64_t linear_bytes = 0; // bytes that came through the socket as usual
    std::uint64_t fragments = 0;    // fragments read and given back
};

// Sends message `m.msg` (`m.total` bytes at `data`, from rank `m.source`) on the connected TCP
// socket `fd`: the header, then the payload, whole (blocking; EINTR retried). Errc::io naming
// how many bytes went.
Result<void> send_stream_message(int fd, const void *data, const StreamMessage &m);

// Receives message `m` from `source`: its header, then its payload, applied to m.dst as it
// arrives. `dmabuf` is the CPU mapping of the binding's dma-buf (fragments outside it are
// Errc::corrupt); `scratch` takes the linear bytes of each receive (at least 64 bytes).
// Errc::corrupt for a stream that does not carry the message expected, and for what the kernel
// said that cannot be (a fragment outside the dma-buf, linear bytes in no known order); Errc::io
// for a stream that ends before the message does; Errc::invalid_argument for an element type or
// operation that cannot be applied. The source's own errors pass through. Every fragment
// received is released, on every path.
Result<StreamReceived> receive_stream_message(DevmemSource &source,
                                              std::span<const std::uint8_t> dmabuf,
                                              std::span<std::uint8_t> scratch,
                                              const StreamMessage &m);

} // namespace knod::client
