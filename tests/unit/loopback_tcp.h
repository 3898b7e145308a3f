// A connected TCP stream on the loopback, for tests of the receive path against the live
// kernel: `peer` sends, `conn` is the accepted end the receiver reads. Every fd is closed with it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace knod::test {

struct LoopbackTcp {
    int server = -1, peer = -1, conn = -1;
    LoopbackTcp() {
        server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in at{};
        at.sin_family = AF_INET;
        at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof at;
        if (server < 0 || bind(server, reinterpret_cast<sockaddr *>(&at), sizeof at) != 0 ||
            getsockname(server, reinterpret_cast<sockaddr *>(&at), &len) != 0 ||
            listen(server, 1) != 0)
            throw std::runtime_error("loopback TCP: no listening socket");
        peer = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (peer < 0 || connect(peer, reinterpret_cast<sockaddr *>(&at), sizeof at) != 0)
            throw std::runtime_error("loopback TCP: cannot connect");
        conn = accept(server, nullptr, nullptr);
        if (conn < 0) throw std::runtime_error("loopback TCP: cannot accept");
    }
    LoopbackTcp(const LoopbackTcp &) = delete;
    LoopbackTcp &operator=(const LoopbackTcp &) = delete;
    // The peer's close: the receiver sees the end of the stream.
    void close_peer() {
        if (peer >= 0) close(peer);
        peer = -1;
    }
    ~LoopbackTcp() {
        for (int fd : {server, peer, conn})
            if (fd >= 0) close(fd);
    }
};

} // namespace knod::test
