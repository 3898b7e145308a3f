// knod.distributed's data path on devmem (docs/collectives.md): a message from one rank to
// another travels on the TCP stream the sender opened to the receiver's flow, as a header and
// then the payload. On a devmem NIC the payload lands in the receiver's dma-buf (the binding's
// region) and the socket says where; here it is read off the dma-buf's CPU mapping and copied or
// reduced into place, and every fragment is given back to the NIC before the call returns, so
// the receive ring never fills with buffers nobody releases.
//
// A receive asks the kernel for no more than what is left of the message, so the next message's
// bytes stay in the socket: every call starts on a header. Every header is checked against the
// message the receiver expects (magic, message number, source rank, length), and every fragment
// against the binding's dma-buf (its id and bounds): a stream that carries anything else is an
// error naming it, never a wrong tensor. After any error the stream is out of step: close it.
#pragma once

#include "client/devmem_rx.h"
#include "knod/result.h"

#include <cstdint>
#include <span>

namespace knod::client {

// The header before each message's payload: little-endian uint32 magic (KNOD_CHUNK_MAGIC),
// message number, source rank, zero; uint64 payload length.
inline constexpr std::size_t stream_header_size = 24;
// The largest message: far above any tensor, far below where header + length would wrap.
inline constexpr std::uint64_t stream_max_total = std::uint64_t{1} << 48;

struct StreamHeader {
    std::uint32_t msg = 0;
    std::uint32_t source = 0;
    std::uint64_t total = 0;
};

// Where a received message goes: `total` bytes applied to `dst` with the C API's element type
// and operation (KNOD_CHUNK_*).
struct StreamTarget {
    void *dst = nullptr;
    int dtype = 0;
    int op = 0;
};

// The binding's dma-buf as the receiver sees it: its CPU mapping, and the id the kernel gave it
// at bind-rx (every fragment of it carries that id; 0: unknown, and then no fragment is taken).
struct DevmemRegion {
    std::span<const std::uint8_t> mapping;
    std::uint32_t dmabuf_id = 0;
};

// How long a whole message may take (timeout_ms < 0: no limit), and an fd whose readability
// stops the call at once (cancel_fd < 0: none): another thread's way to end a wait.
struct StreamWait {
    int timeout_ms = -1;
    int cancel_fd = -1;
};

struct StreamReceived {
    std::uint64_t dmabuf_bytes = 0; // payload (and header) bytes the NIC placed in the dma-buf
    std::uint64_t linear_bytes = 0; // bytes that came through the socket as usual
    std::uint64_t fragments = 0;    // fragments read and given back
};

// Sends message `h` (`h.total` bytes at `data`) on the connected TCP socket `fd`: the header,
// then the payload, whole. One sender per socket: two at once interleave their bytes. Errc::io
// naming how many bytes went (the peer closed or reset the stream), Errc::unavailable when the
// time ran out, Errc::revoked when cancelled.
Result<void> send_stream_message(int fd, const void *data, const StreamHeader &h, StreamWait wait);

// Receives message `h` on `source`: its header, then its payload, applied to `target` as it
// arrives. `scratch` takes the linear bytes of each receive (at least 64 bytes).
//   Errc::corrupt: the stream does not carry the message expected, or the kernel said what
//     cannot be (a fragment of another dma-buf or outside this one, runs that do not add up);
//   Errc::io: the stream ended (or failed) before the message did, naming how far it got;
//   Errc::unavailable: the time ran out; Errc::revoked: cancelled;
//   Errc::invalid_argument: an element type, operation or length that cannot be applied.
// The source's own errors pass through. Every fragment received is released, on every path.
Result<StreamReceived> receive_stream_message(DevmemSource &source, const DevmemRegion &region,
                                              std::span<std::uint8_t> scratch,
                                              const StreamHeader &h, const StreamTarget &target,
                                              StreamWait wait);

} // namespace knod::client
