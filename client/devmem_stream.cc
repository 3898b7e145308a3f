#include "client/devmem_stream.h"

#include "client/elementwise.h"
#include "knod/client.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace knod::client {

namespace {

std::array<std::uint8_t, stream_header_size> header_of(const StreamHeader &m) {
    std::array<std::uint8_t, stream_header_size> h{};
    std::uint32_t words[4] = {KNOD_CHUNK_MAGIC, m.msg, m.source, 0};
    std::memcpy(h.data(), words, sizeof words); // little-endian hosts only, as the chunks
    std::memcpy(h.data() + 16, &m.total, sizeof m.total);
    return h;
}

using Clock = std::chrono::steady_clock;

// What is left of a wait's budget, in poll(2)'s terms (-1: no limit).
int remaining_ms(const std::optional<Clock::time_point> &deadline) {
    if (!deadline) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
    return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, INT32_MAX));
}

std::optional<Clock::time_point> deadline_of(StreamWait wait) {
    if (wait.timeout_ms < 0) return std::nullopt;
    return Clock::now() + std::chrono::milliseconds(wait.timeout_ms);
}

// The stream's bytes of one message, in order, as they come: the header is collected and
// checked, the payload applied to the destination. A reduction whose element a run splits keeps
// the element's first bytes until the rest comes.
class MessageAssembler {
  public:
    MessageAssembler(const StreamHeader &m, const StreamTarget &t)
        : m_(m), t_(t), size_(element_size(t.dtype)), expected_(header_of(m)) {}

    std::uint64_t left() const { return stream_header_size + m_.total - at_; }
    std::uint64_t at() const { return at_; }

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
        auto *dst = static_cast<std::uint8_t *>(t_.dst);
        std::uint64_t q = at_ - stream_header_size;
        if (t_.op == KNOD_CHUNK_COPY || size_ <= 1) {
            apply_elements(dst + q, p, n, t_.dtype, t_.op);
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
            apply_elements(dst + q - size_, carry_.data(), size_, t_.dtype, t_.op);
            carried_ = 0;
        }
        std::size_t whole = n - n % size_;
        apply_elements(dst + q, p, whole, t_.dtype, t_.op);
        carried_ = n - whole;
        std::memcpy(carry_.data(), p + whole, carried_);
    }

    StreamHeader m_;
    StreamTarget t_;
    std::size_t size_;
    std::array<std::uint8_t, stream_header_size> expected_;
    std::array<std::uint8_t, stream_header_size> header_{};
    std::uint64_t at_ = 0;
    std::array<std::uint8_t, 8> carry_{};
    std::size_t carried_ = 0;
};

// Feeds one receive's runs to the assembler in stream order.
Result<void> take_runs(MessageAssembler &message, const DevmemReceived &got,
                       const DevmemRegion &region, std::span<const std::uint8_t> linear,
                       StreamReceived &stats) {
    if (got.order.empty() && got.bytes())
        return make_error(Errc::corrupt,
                          "devmem receive: " + std::to_string(got.linear_bytes) +
                              " linear bytes came beside " + std::to_string(got.fragments.size()) +
                              " fragment(s) without SCM_DEVMEM_LINEAR: their order is unknown");
    const auto &dmabuf = region.mapping;
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
        if (f.size != run.size)
            return make_error(Errc::corrupt, "devmem receive: a fragment run's size is not its "
                                             "fragment's");
        // A flow steered onto another binding's queue hands out that binding's buffers: their
        // offsets would read our mapping at places the NIC never wrote.
        if (f.dmabuf_id != region.dmabuf_id || region.dmabuf_id == 0)
            return make_error(Errc::corrupt,
                              "devmem receive: a fragment of dma-buf " +
                                  std::to_string(f.dmabuf_id) +
                                  (region.dmabuf_id ? ", not this binding's (" +
                                                          std::to_string(region.dmabuf_id) +
                                                          "): the flow reached another "
                                                          "binding's queue"
                                                    : ", and this binding's dma-buf id is not "
                                                      "known (0: a daemon from before "
                                                      "DmabufId?): no fragment can be taken"));
        if (f.offset > dmabuf.size() || f.size > dmabuf.size() - f.offset)
            return make_error(Errc::corrupt, "devmem receive: a fragment of " +
                                                 std::to_string(f.size) + " bytes at offset " +
                                                 std::to_string(f.offset) +
                                                 " lies outside the binding's dma-buf (" +
                                                 std::to_string(dmabuf.size()) + " bytes)");
        if (auto ok = message.take(dmabuf.data() + f.offset, f.size); !ok) return ok;
        stats.dmabuf_bytes += f.size;
    }
    if (lin != got.linear_bytes || frag != got.fragments.size())
        return make_error(Errc::corrupt, "devmem receive: the runs do not account for every "
                                         "byte received");
    return {};
}

} // namespace

Result<void> send_stream_message(int fd, const void *data, const StreamHeader &h, StreamWait wait) {
    if (h.total > stream_max_total)
        return make_error(Errc::invalid_argument,
                          "a message of " + std::to_string(h.total) + " bytes is too large");
    auto header = header_of(h);
    iovec iov[2] = {{header.data(), header.size()}, {const_cast<void *>(data), h.total}};
    std::uint64_t want = header.size() + h.total, sent = 0;
    auto deadline = deadline_of(wait);
    auto where = [&] {
        return " after " + std::to_string(sent) + " of " + std::to_string(want) +
               " bytes of message " + std::to_string(h.msg);
    };
    int first = 0;
    while (sent < want) {
        auto ready = wait_ready(fd, POLLOUT, remaining_ms(deadline), wait.cancel_fd);
        if (!ready) return ready.error().context("sending to a stream");
        if (*ready == Ready::cancelled)
            return make_error(Errc::revoked, "sending to a stream: cancelled" + where());
        if (*ready == Ready::timeout)
            return make_error(Errc::unavailable,
                              "sending to a stream: the receiver took nothing more within " +
                                  std::to_string(wait.timeout_ms) + " ms" + where());
        msghdr msg{};
        msg.msg_iov = iov + first;
        msg.msg_iovlen = static_cast<std::size_t>(2 - first);
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return make_error(Errc::io, std::string("sending to a stream: ") +
                                            std::strerror(errno) + where());
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

Result<StreamReceived> receive_stream_message(DevmemSource &source, const DevmemRegion &region,
                                              std::span<std::uint8_t> scratch,
                                              const StreamHeader &h, const StreamTarget &target,
                                              StreamWait wait) {
    if (!valid_operation(target.dtype, target.op))
        return make_error(Errc::invalid_argument, "unknown element type " +
                                                      std::to_string(target.dtype) +
                                                      " or operation " + std::to_string(target.op));
    if (target.op != KNOD_CHUNK_COPY && h.total % element_size(target.dtype))
        return make_error(Errc::invalid_argument,
                          std::to_string(h.total) + " bytes are not whole elements of " +
                              std::to_string(element_size(target.dtype)) + " bytes");
    if (h.total > stream_max_total)
        return make_error(Errc::invalid_argument,
                          "a message of " + std::to_string(h.total) + " bytes is too large");
    if (scratch.size() < 64)
        return make_error(Errc::invalid_argument, "a devmem stream receive needs at least 64 "
                                                  "bytes of scratch for linear bytes");
    if (!target.dst && h.total) return make_error(Errc::invalid_argument, "no destination");
    MessageAssembler message(h, target);
    StreamReceived stats;
    auto deadline = deadline_of(wait);
    std::uint64_t whole = stream_header_size + h.total;
    auto where = [&] {
        return std::to_string(message.at()) + " of " + std::to_string(whole) +
               " bytes of message " + std::to_string(h.msg) + " from rank " +
               std::to_string(h.source);
    };
    while (message.left()) {
        auto ready = source.wait(remaining_ms(deadline), wait.cancel_fd);
        if (!ready) return ready.error().context("message " + std::to_string(h.msg));
        if (*ready == Ready::cancelled)
            return make_error(Errc::revoked, "receiving: cancelled after " + where());
        if (*ready == Ready::timeout)
            return make_error(Errc::unavailable, "receiving: nothing more came within " +
                                                     std::to_string(wait.timeout_ms) +
                                                     " ms, after " + where());
        // Never more than the message: the next one's header stays in the socket.
        auto want =
            static_cast<std::size_t>(std::min<std::uint64_t>(message.left(), scratch.size()));
        auto got = source.receive(scratch.first(want));
        if (!got) {
            if (got.error().code == Errc::unavailable) continue; // woken for nothing
            return make_error(Errc::io, got.error().message + ", after " + where());
        }
        if (got->bytes() == 0) {
            if (!got->fragments.empty()) (void)source.release(got->fragments);
            return make_error(Errc::io, "rank " + std::to_string(h.source) +
                                            " closed its stream after " + where());
        }
        if (got->bytes() > want) {
            (void)source.release(got->fragments); // best effort: the error below is the news
            return make_error(Errc::corrupt, "devmem receive: " + std::to_string(got->bytes()) +
                                                 " bytes for a receive of at most " +
                                                 std::to_string(want));
        }
        auto taken = take_runs(message, *got, region, scratch.first(got->linear_bytes), stats);
        stats.fragments += got->fragments.size();
        auto released = got->fragments.empty() ? Result<void>{} : source.release(got->fragments);
        if (!taken)
            return taken.error().context("message " + std::to_string(h.msg) + " from rank " +
                                         std::to_string(h.source));
        if (!released) return released.error().context("message " + std::to_string(h.msg));
    }
    return stats;
}

} // namespace knod::client
