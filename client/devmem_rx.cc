#include "client/devmem_rx.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace knod::client {

std::size_t DevmemReceived::bytes() const {
    std::size_t n = linear_bytes;
    for (auto &f : fragments)
        n += f.size;
    return n;
}

Result<DevmemReceived> parse_devmem_cmsgs(const msghdr &msg, std::size_t received,
                                          std::vector<std::uint32_t> *tokens) {
    if (msg.msg_flags & MSG_CTRUNC)
        return make_error(Errc::corrupt, "devmem receive: the control buffer was too small: "
                                         "fragments were lost and their buffers cannot be "
                                         "given back");
    DevmemReceived out;
    std::size_t placed = 0, linear = 0;
    bool saw_linear = false;
    for (auto *c = CMSG_FIRSTHDR(const_cast<msghdr *>(&msg)); c;
         c = CMSG_NXTHDR(const_cast<msghdr *>(&msg), c)) {
        if (c->cmsg_level != SOL_SOCKET ||
            (c->cmsg_type != so_devmem_dmabuf && c->cmsg_type != so_devmem_linear))
            continue; // someone else's (timestamps, ...)
        // CMSG_FIRSTHDR checks only that a header fits, not the length the message claims.
        auto *control_end = static_cast<const std::uint8_t *>(msg.msg_control) + msg.msg_controllen;
        if (c->cmsg_len >
            static_cast<std::size_t>(control_end - reinterpret_cast<const std::uint8_t *>(c)))
            return make_error(Errc::corrupt, "devmem receive: a control message runs past the "
                                             "control buffer");
        if (c->cmsg_len < CMSG_LEN(sizeof(DmabufCmsg)))
            return make_error(Errc::corrupt, "devmem receive: a short " +
                                                 std::string(c->cmsg_type == so_devmem_dmabuf
                                                                 ? "SCM_DEVMEM_DMABUF"
                                                                 : "SCM_DEVMEM_LINEAR") +
                                                 " message");
        DmabufCmsg d;
        std::memcpy(&d, CMSG_DATA(c), sizeof d);
        if (c->cmsg_type == so_devmem_linear) {
            saw_linear = true;
            linear += d.frag_size;
        } else {
            out.fragments.push_back({d.frag_offset, d.frag_size, d.frag_token, d.dmabuf_id});
            placed += d.frag_size;
            if (tokens) tokens->push_back(d.frag_token);
        }
        out.order.push_back({c->cmsg_type == so_devmem_linear, d.frag_size});
    }
    if (placed > received)
        return make_error(Errc::corrupt, "devmem receive: fragments of " + std::to_string(placed) +
                                             " bytes for a receive of " + std::to_string(received));
    // The rest went to the iov: SCM_DEVMEM_LINEAR says how much, plain readable data does not.
    out.linear_bytes = received - placed;
    if (saw_linear && linear != out.linear_bytes)
        return make_error(Errc::corrupt,
                          "devmem receive: SCM_DEVMEM_LINEAR says " + std::to_string(linear) +
                              " bytes, the receive copied " + std::to_string(out.linear_bytes));
    if (!saw_linear && out.linear_bytes) {
        if (out.fragments.empty())
            out.order = {{true, out.linear_bytes}}; // plain readable data
        else
            out.order.clear(); // where those bytes were among the fragments is not said
    }
    return out;
}

std::vector<std::vector<DmabufToken>> devmem_token_batches(const std::vector<std::uint32_t> &tokens,
                                                           std::size_t max_ranges,
                                                           std::size_t max_tokens) {
    std::vector<std::vector<DmabufToken>> batches;
    std::size_t in_batch = 0;
    for (auto t : tokens) {
        bool full = batches.empty() || in_batch >= max_tokens;
        if (!full) {
            auto &last = batches.back().back();
            if (last.token_start + last.token_count == t) {
                ++last.token_count;
                ++in_batch;
                continue;
            }
            full = batches.back().size() >= max_ranges;
        }
        if (full) {
            batches.emplace_back();
            in_batch = 0;
        }
        batches.back().push_back({t, 1});
        ++in_batch;
    }
    return batches;
}

Result<void> check_devmem_socket(int fd) {
    auto option = [fd](int name) -> Result<int> {
        int value = 0;
        socklen_t len = sizeof value;
        if (getsockopt(fd, SOL_SOCKET, name, &value, &len) != 0) {
            int e = errno;
            // An O_PATH descriptor of a socket is open, but names the file, not the socket.
            int flags = e == EBADF ? fcntl(fd, F_GETFL) : -1;
            std::string what = e == ENOTSOCK                  ? " is not a socket"
                               : flags >= 0 && flags & O_PATH ? " is an O_PATH descriptor"
                               : e == EBADF                   ? " is not open"
                                            : std::string(": ") + std::strerror(e);
            return make_error(Errc::invalid_argument,
                              "devmem receive: fd " + std::to_string(fd) + what +
                                  " (devmem receive needs the holder's TCP socket)");
        }
        return value;
    };
    auto domain = option(SO_DOMAIN);
    if (!domain) return domain.error();
    auto type = option(SO_TYPE);
    if (!type) return type.error();
    auto protocol = option(SO_PROTOCOL);
    if (!protocol) return protocol.error();
    if ((*domain != AF_INET && *domain != AF_INET6) || *type != SOCK_STREAM ||
        *protocol != IPPROTO_TCP) {
        // MPTCP is a SOCK_STREAM of its own protocol (mptcpize and MPTCP-by-default setups make
        // it from what the program asked as TCP); devmem's socket calls take IPPROTO_TCP only.
        if (*protocol == IPPROTO_MPTCP)
            return make_error(Errc::invalid_argument,
                              "devmem receive: fd " + std::to_string(fd) +
                                  " is an MPTCP socket; devmem receive needs plain TCP "
                                  "(IPPROTO_TCP): do not run the holder under mptcpize, or "
                                  "make the socket with IPPROTO_TCP");
        std::string what = *domain == AF_UNIX                                ? "a Unix socket"
                           : *type == SOCK_DGRAM && *protocol == IPPROTO_UDP ? "a UDP socket"
                                                                             : "not a TCP socket";
        return make_error(Errc::invalid_argument,
                          "devmem receive: fd " + std::to_string(fd) + " is " + what + " (domain " +
                              std::to_string(*domain) + ", type " + std::to_string(*type) +
                              ", protocol " + std::to_string(*protocol) +
                              "); devmem receive is TCP only: pass the socket of the binding's "
                              "TCP flow");
    }
    return {};
}

Result<DevmemReceived> DevmemReceiver::receive(std::span<std::uint8_t> linear) {
    iovec iov{linear.data(), linear.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control_.data();
    msg.msg_controllen = control_.size();
    ssize_t n;
    do
        n = recvmsg(fd_, &msg, msg_sock_devmem);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        int e = errno;
        Errc code = e == EAGAIN || e == EWOULDBLOCK ? Errc::unavailable : Errc::io;
        std::string hint = e == EFAULT ? " (devmem data needs MSG_SOCK_DEVMEM; is this the "
                                         "binding's flow?)"
                                       : "";
        return make_error(code, std::string("devmem receive: ") + std::strerror(e) + hint);
    }
    std::vector<std::uint32_t> tokens;
    auto parsed = parse_devmem_cmsgs(msg, static_cast<std::size_t>(n), &tokens);
    if (!parsed && !tokens.empty()) {
        // The buffers are ours until given back, parsed or not.
        std::vector<DevmemFragment> named;
        for (auto t : tokens)
            named.push_back({0, 0, t, 0});
        (void)release(named); // best effort: the parse error is the news
    }
    return parsed;
}

Result<Ready> wait_ready(int fd, short events, int timeout_ms, int cancel_fd) {
    pollfd p[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    for (;;) {
        int r = poll(p, cancel_fd >= 0 ? 2 : 1, timeout_ms);
        if (r > 0) {
            if (cancel_fd >= 0 && p[1].revents) return Ready::cancelled;
            if (p[0].revents & POLLNVAL)
                return make_error(Errc::invalid_argument, "devmem: not an open socket");
            return Ready::data; // ready, or hung up / failed: the next call answers at once
        }
        if (r == 0) return Ready::timeout;
        if (errno != EINTR)
            return make_error(Errc::io, std::string("devmem: poll: ") + std::strerror(errno));
    }
}

Result<Ready> DevmemReceiver::wait(int timeout_ms, int cancel_fd) {
    return wait_ready(fd_, POLLIN, timeout_ms, cancel_fd);
}

Result<bool> DevmemReceiver::wait_for_data(int timeout_ms) {
    auto ready = wait_ready(fd_, POLLIN, timeout_ms, -1);
    if (!ready) return ready.error();
    return *ready == Ready::data;
}

Result<void> DevmemReceiver::release(const std::vector<DevmemFragment> &fragments) {
    std::vector<std::uint32_t> tokens;
    tokens.reserve(fragments.size());
    for (auto &f : fragments)
        tokens.push_back(f.token);
    // Every batch is tried even after one fails: a buffer never given back is one the NIC can
    // never fill again, so one bad token must not keep the others from the kernel.
    std::size_t wanted = 0, freed_total = 0;
    std::string first_error;
    for (auto &batch : devmem_token_batches(tokens)) {
        std::size_t want = 0;
        for (auto &r : batch)
            want += r.token_count;
        wanted += want;
        int freed = setsockopt(fd_, SOL_SOCKET, so_devmem_dontneed, batch.data(),
                               static_cast<socklen_t>(batch.size() * sizeof(DmabufToken)));
        if (freed < 0) {
            int e = errno;
            if (!first_error.empty()) continue;
            first_error = std::string("SO_DEVMEM_DONTNEED: ") + std::strerror(e);
            // The kernel answers EBADF both for a closed fd and for a socket that is not TCP:
            // say which this one is.
            if (e == EBADF || e == ENOTSOCK)
                if (auto tcp = check_devmem_socket(fd_); !tcp)
                    first_error += " (" + tcp.error().message + ")";
            continue;
        }
        freed_total += static_cast<std::size_t>(freed);
    }
    if (!first_error.empty())
        return make_error(Errc::io, "devmem release: " + first_error + " (the kernel freed " +
                                        std::to_string(freed_total) + " of " +
                                        std::to_string(wanted) + " buffers)");
    // The kernel returns how many it freed; fewer: tokens it did not know.
    if (freed_total != wanted)
        return make_error(Errc::invalid_argument,
                          "devmem release: the kernel freed " + std::to_string(freed_total) +
                              " of " + std::to_string(wanted) + " buffers (unknown tokens)");
    return {};
}

} // namespace knod::client
