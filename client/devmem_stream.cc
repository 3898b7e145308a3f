#include "client/devmem_stream.h"

#include "client/elementwise.h"
#include "knod/client.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace knod::client {

namespace {

std::array<std::uint8_t, stream_header_size> header_of(const StreamMessage &m) {
    std::array<std::uint8_t, stream_header_size> h{};
    std::uint32_t words[4] = {KNOD_CHUNK_MAGIC, m.msg, m.source, 0};
    std::memcpy(h.data(), words, sizeof words); // little-endian hosts only, as the chunks
    std::memcpy(h.data() + 16, &m.total, sizeof m.total);
    return h;
}

// The stream's bytes of one message, in order, as they come: the header is collected and
// checked, the payload applied to the destination. A reduction whose element a run splits keeps
// the element's first bytes until the rest comes.
class MessageAssembler {
  public:
    explicit MessageAssembler(const StreamMessage &m)
        : m_(m), size_(element_size(m.dtype)), expected_(header_of(m)) {}

    std::uint64_t left() const { return stream_header_size + m_.total - at_; }

    Result<void> take(const std::uint8_t *p, std::size_t n) {
        while (n) {
            if (at_ < stream_header_size) {
                std::size_t k = std::min<std::size_t>(n, stream_header_size - at_);
                std::memcpy(header_.data() + at_, p, k);
                at_ += k;
                p += k;
                n -= k;
                if (at_ == stream_header_size)
                    if (auto ok = check_header(); !ok) return ok;
                continue;
            }
            apply(p, n);
            at_ += n;
            n = 0;
        }
        return {};
    }

  private:
    Result<void> check_header() const {
        if (header_ == expected_) return {};
        std::uint32_t w[4];
        std::uint64_t total;
        std::memcpy(w, header_.data(), sizeof w);
        std::memcpy(&total, header_.data() + 16, sizeof total);
        char text[320];
        std::snprintf(text, sizeof text,
                      "the stream from rank %u does not carry message %u (magic %#x, message %u, "
                      "source %u, flags %#x, %llu bytes; expected %llu bytes): a foreign or "
                      "out-of-step sender",
                      m_.source, m_.msg, w[0], w[1], w[2], w[3],
                      static_cast<unsigned long long>(total),
                      static_cast<unsigned long long>(m_.total));
        return make_error(Errc::corrupt, text);
    }

    // Payload bytes [at_ - header, + n) of the message.
    void apply(const std::uint8_t *p, std::size_t n) {
        auto *dst = static_cast<std::uint8_t *>(m_.dst);
        std::uint64_t q = at_ - stream_header_size;
        if (m_.op == KNOD_CHUNK_COPY || size_ <= 1) {
            apply_elements(dst + q, p, n, m_.dtype, m_.op);
            return;
        }
        if (carried_) { // finish the element the last run split
            std::size_t k = std::min(n, size_ - carried_);
            std::memcpy(carry_.data() + carried_, p, k);
            carried_ += k;
            p += k;
            n -= k;
            q += k;
            if (carried_ < size_) return;
            apply_elements(dst + q - size_, carry_.data(), size_, m_.dtype, m_.op);
            carried_ = 0;
        }
        std::size_t whole = n - n % size_;
        apply_elements(dst + q, p, whole, m_.dtype, m_.op);
        carried_ = n - whole;
        std::memcpy(carry_.data(), p + whole, carried_);
    }

    StreamMessage m_;
    std::size_t size_;
    std::array<std::uint8_t, stream_header_size> expected_;
    std::array<std::uint8_t, stream_header_size> header_{};
    std::uint64_t at_ = 0;
    std::array<std::uint8_t, 8> carry_{};
    std::size_t carried_ = 0;
};

// Feeds one receive's runs to the assembler in stream order.
Result<void> take_runs(MessageAssembler &message, const DevmemReceived &got,
                       std::span<const std::uint8_t> dmabuf, std::span<const std::uint8_t> linear,
                       StreamReceived &stats) {
    if (got.order.empty() && got.bytes())
        return make_error(Errc::corrupt,
                          "devmem receive: " + std::to_string(got.linear_bytes) +
                              " linear bytes came beside " + std::to_string(got.fragments.size()) +
                              " fragment(s) without SCM_DEVMEM_LINEAR: their order is unknown");
    std::size_t lin = 0, frag = 0;
    for (const auto &run : got.order) {
        if (run.linear) {
            if (run.size > got.linear_bytes - lin)
                return make_error(Errc::corrupt, "devmem receive: linear runs exceed the bytes "
                                                 "received");
            if (auto ok = message.take(linear.data() + lin, run.size); !ok) return ok;
            lin += run.size;
            stats.linear_bytes += run.size;
            continue;
        }
        if (frag >= got.fragments.size())
            return make_error(Errc::corrupt, "devmem receive: more fragment runs than fragments");
        const auto &f = got.fragments[frag++];
        if (f.offset > dmabuf.size() || f.size > dmabuf.size() - f.offset)
            return make_error(Errc::corrupt, "devmem receive: a fragment of " +
                                                 std::to_string(f.size) + " bytes at offset " +
                                                 std::to_string(f.offset) +
                                                 " lies outside the binding's dma-buf (" +
                                                 std::to_string(dmabuf.size()) + " bytes)");
        if (auto ok = message.take(dmabuf.data() + f.offset, f.size); !ok) return ok;
        stats.dmabuf_bytes += f.size;
    }
    return {};
}

} // namespace

Result<void> send_stream_message(int fd, const void *data, const StreamMessage &m) {
    auto header = header_of(m);
    iovec iov[2] = {{header.data(), header.size()}, {const_cast<void *>(data), m.total}};
    std::uint64_t want = header.size() + m.total, sent = 0;
    int first = 0;
    while (sent < want) {
        msghdr msg{};
        msg.msg_iov = iov + first;
        msg.msg_iovlen = 2 - first;
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return make_error(Errc::io, "sending message " + std::to_string(m.msg) + " to its " +
                                            "stream: " + std::strerror(errno) + " after " +
                                            std::to_string(sent) + " of " + std::to_string(want) +
                                            " bytes");
        }
        sent += static_cast<std::uint64_t>(n);
        for (auto k = static_cast<std::size_t>(n); k && first < 2;) {
            std::size_t step = std::min(k, iov[first].iov_len);
            iov[first].iov_base = static_cast<std::uint8_t *>(iov[first].iov_base) + step;
            iov[first].iov_len -= step;
            k -= step;
            if (iov[first].iov_len == 0) ++first;
        }
    }
    return {};
}

Result<StreamReceived> receive_stream_message(DevmemSource &source,
                                              std::span<const std::uint8_t> dmabuf,
                                              std::span<std::uint8_t> scratch,
                                              const StreamMessage &m) {
    if (!valid_operation(m.dtype, m.op))
        return make_error(Errc::invalid_argument, "unknown element type " +
                                                      std::to_string(m.dtype) + " or operation " +
                                                      std::to_string(m.op));
    if (m.op != KNOD_CHUNK_COPY && m.total % element_size(m.dtype))
        return make_error(Errc::invalid_argument,
                          std::to_string(m.total) + " bytes are not whole elements of " +
                              std::to_string(element_size(m.dtype)) + " bytes");
    if (scratch.size() < 64)
        return make_error(Errc::invalid_argument, "a devmem stream receive needs at least 64 "
                                                  "bytes of scratch for linear bytes");
    if (!m.dst && m.total) return make_error(Errc::invalid_argument, "no destination");
    MessageAssembler message(m);
    StreamReceived stats;
    while (message.left()) {
        // Never more than the message: the next one's header stays in the socket.
        auto want =
            static_cast<std::size_t>(std::min<std::uint64_t>(message.left(), scratch.size()));
        auto got = source.receive(scratch.first(want));
        if (!got)
            return got.error().context("message " + std::to_string(m.msg) + " from rank " +
                                       std::to_string(m.source));
        if (got->bytes() == 0 && got->fragments.empty())
            return make_error(Errc::io,
                              "rank " + std::to_string(m.source) + " closed its stream after " +
                                  std::to_string(stream_header_size + m.total - message.left()) +
                                  " of " + std::to_string(stream_header_size + m.total) +
                                  " bytes of message " + std::to_string(m.msg));
        if (got->bytes() > want) {
            (void)source.release(got->fragments); // best effort: the error below is the news
            return make_error(Errc::corrupt, "devmem receive: " + std::to_string(got->bytes()) +
                                                 " bytes for a receive of at most " +
                                                 std::to_string(want));
        }
        auto taken = take_runs(message, *got, dmabuf, scratch.first(got->linear_bytes), stats);
        stats.fragments += got->fragments.size();
        auto released = got->fragments.empty() ? Result<void>{} : source.release(got->fragments);
        if (!taken) return taken.error();
        if (!released) return released.error();
    }
    return stats;
}

} // namespace knod::client
