// The client's devmem receive path against the live kernel (#36): loopback TCP streams (no devmem
// NIC here, so readable data comes back linear and no token is ever known), the kernel's own
// answers on its error paths (SO_DEVMEM_DONTNEED's limits, sockets that are not TCP, a socket
// with no peer), and the receiver's reading of each. It runs on the host's kernel under ctest
// and on Debian's 6.12 in the VM (vm.devmem), where no test may skip.
#include "client/devmem_rx.h"
#include "client/devmem_stream.h"
#include "knod/client.h"
#include "tests/unit/loopback_tcp.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

using namespace knod;
using namespace knod::client;

namespace {

// A socket (or pipe) closed with the test.
struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    ~Fd() {
        if (fd >= 0) close(fd);
    }
};

// SO_DEVMEM_DONTNEED with `ranges` ranges of unknown tokens: the kernel's answer (a count freed,
// or -errno).
int dontneed(int fd, std::size_t ranges, socklen_t len = 0) {
    std::vector<DmabufToken> tokens(ranges == 0 ? 1 : ranges);
    for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = {static_cast<std::uint32_t>(2 * i + 1), 1}; // none consecutive
    if (len == 0) len = static_cast<socklen_t>(ranges * sizeof(DmabufToken));
    int r = setsockopt(fd, SOL_SOCKET, so_devmem_dontneed, tokens.data(), len);
    return r < 0 ? -errno : r;
}

// Whether this kernel has devmem's socket options (Linux 6.12 with CONFIG_NET_DEVMEM).
bool kernel_has_dontneed() {
    knod::test::LoopbackTcp tcp;
    return dontneed(tcp.conn, 1) != -ENOPROTOOPT;
}

} // namespace

// The socket path against the live kernel: a loopback TCP stream (no devmem NIC) comes back as
// linear bytes; releasing a token the socket never had frees nothing (or the kernel has no
// SO_DEVMEM_DONTNEED at all).
TEST(DevmemLive, LiveLoopbackStreamIsLinear) {
    knod::test::LoopbackTcp tcp;
    int conn = tcp.conn;
    DevmemReceiver rx(conn);
    auto idle = rx.wait_for_data(50);
    ASSERT_TRUE(idle) << idle.error().message;
    EXPECT_FALSE(*idle) << "nothing was sent yet";
    ASSERT_EQ(send(tcp.peer, "hello", 5, 0), 5);
    auto ready = rx.wait_for_data(30000);
    ASSERT_TRUE(ready) << ready.error().message;
    EXPECT_TRUE(*ready);
    std::array<std::uint8_t, 64> linear{};
    auto got = rx.receive(linear);
    ASSERT_TRUE(got) << got.error().message;
    EXPECT_TRUE(got->fragments.empty());
    EXPECT_EQ(got->linear_bytes, 5u);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(linear.data()), 5), "hello");
    auto freed = rx.release({DevmemFragment{0, 100, 12345, 0}});
    ASSERT_FALSE(freed) << "an unknown token was freed";
    std::cout << "# SO_DEVMEM_DONTNEED of an unknown token: " << freed.error().message << "\n";
    EXPECT_TRUE(freed.error().message.find("freed 0 of 1") != std::string::npos ||
                freed.error().message.find("Protocol not available") != std::string::npos)
        << freed.error().message;
    // Three batches (128 ranges each at most): a failing one does not keep the others back.
    std::vector<DevmemFragment> many;
    for (std::uint32_t t = 0; t < 300; ++t)
        many.push_back(DevmemFragment{0, 100, 2 * t + 1, 0}); // no two consecutive: 300 ranges
    auto all = rx.release(many);
    ASSERT_FALSE(all);
    EXPECT_NE(all.error().message.find(" of 300 buffers"), std::string::npos)
        << "every batch was tried: " << all.error().message;
    EXPECT_TRUE(rx.release({})) << "nothing to release";
    tcp.close_peer();
    ready = rx.wait_for_data(30000);
    ASSERT_TRUE(ready && *ready) << "the peer's close wakes the wait";
    got = rx.receive(linear);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->bytes(), 0u) << "the peer closed";
    auto closed = DevmemReceiver(1 << 20).wait_for_data(0); // no such fd
    EXPECT_FALSE(closed) << "a closed fd is an error, not a timeout";
}

// The kernel's limits are the receiver's: a call of devmem_token_batches' 128 ranges is taken,
// one more range (or a length that is not whole tokens) is EINVAL, so a receiver that batched
// differently would lose every token of a call.
TEST(DevmemLive, TheKernelTakesTheBatchesTheReceiverMakes) {
    if (!kernel_has_dontneed()) GTEST_SKIP() << "this kernel has no SO_DEVMEM_DONTNEED";
    knod::test::LoopbackTcp tcp;
    std::vector<std::uint32_t> scattered;
    for (std::uint32_t i = 0; i < 1000; ++i)
        scattered.push_back(2 * i + 1);
    auto batches = devmem_token_batches(scattered);
    ASSERT_GE(batches.size(), 2u);
    std::size_t widest = 0;
    for (auto &b : batches)
        widest = std::max(widest, b.size());
    EXPECT_EQ(dontneed(tcp.conn, widest), 0) << "the widest batch, " << widest << " ranges";
    EXPECT_EQ(dontneed(tcp.conn, widest + 1), -EINVAL)
        << "the kernel takes more than " << widest << " ranges a call: the batches could be wider";
    EXPECT_EQ(dontneed(tcp.conn, 1, sizeof(DmabufToken) + 4), -EINVAL) << "a length of 1.5 tokens";
    EXPECT_EQ(dontneed(tcp.conn, 0, 0), -EINVAL) << "no token at all";
    DevmemReceiver rx(tcp.conn);
    std::vector<DevmemFragment> many;
    for (auto t : scattered)
        many.push_back(DevmemFragment{0, 4096, t, 0});
    auto all = rx.release(many);
    ASSERT_FALSE(all) << "unknown tokens were freed";
    EXPECT_NE(all.error().message.find("freed 0 of 1000 buffers (unknown tokens)"),
              std::string::npos)
        << "every batch was taken, none freed anything: " << all.error().message;
}

// devmem receive is TCP only. The kernel answers SO_DEVMEM_DONTNEED on a UDP or Unix socket with
// EBADF (and recvmsg(MSG_SOCK_DEVMEM) there hands out plain bytes): the receiver refuses such a
// socket before it is used, and names what the fd is.
TEST(DevmemLive, OnlyTcpSocketsCanReceive) {
    Fd udp(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    Fd udp6(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    Fd unix_stream(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    Fd raw_tcp(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)); // unconnected: still TCP
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    Fd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
    ASSERT_GE(udp.fd, 0);
    ASSERT_GE(unix_stream.fd, 0);
    ASSERT_GE(raw_tcp.fd, 0);

    struct Case {
        int fd;
        const char *says;
    };
    Fd mptcp(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_MPTCP)); // -1 without MPTCP
    Fd o_path(open("/proc/self/exe", O_PATH | O_CLOEXEC));
    ASSERT_GE(o_path.fd, 0);
    std::vector<Case> cases{{udp.fd, "a UDP socket"},
                            {unix_stream.fd, "a Unix socket"},
                            {pipe_read.fd, "is not a socket"},
                            {o_path.fd, "O_PATH"},
                            {1 << 20, "is not open"}};
    if (mptcp.fd >= 0) cases.push_back({mptcp.fd, "an MPTCP socket"});
    for (auto c : cases) {
        auto r = check_devmem_socket(c.fd);
        ASSERT_FALSE(r) << "fd " << c.fd << " (" << c.says << ") was taken";
        EXPECT_EQ(r.error().code, Errc::invalid_argument);
        EXPECT_NE(r.error().message.find(c.says), std::string::npos) << r.error().message;
        EXPECT_NE(r.error().message.find("TCP"), std::string::npos) << "names the fix";
    }
    if (udp6.fd >= 0) {
        EXPECT_FALSE(check_devmem_socket(udp6.fd)) << "UDP over IPv6";
    }
    EXPECT_TRUE(check_devmem_socket(raw_tcp.fd)) << "an unconnected TCP socket is TCP";
    knod::test::LoopbackTcp tcp;
    EXPECT_TRUE(check_devmem_socket(tcp.conn));
    Fd tcp6(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (tcp6.fd >= 0) {
        EXPECT_TRUE(check_devmem_socket(tcp6.fd)) << "TCP over IPv6";
    }

    // Why: the kernel's own answer on the UDP socket, and what the receiver makes of it.
    if (kernel_has_dontneed()) {
        EXPECT_EQ(dontneed(udp.fd, 1), -EBADF) << "the kernel's answer for a socket not TCP";
        auto r = DevmemReceiver(udp.fd).release({DevmemFragment{0, 1, 1, 0}});
        ASSERT_FALSE(r);
        EXPECT_NE(r.error().message.find("is a UDP socket"), std::string::npos)
            << "the release names what the fd is: " << r.error().message;
    }
}

// A TCP socket with no peer: the kernel's ENOTCONN comes back as an error, not as the peer's
// close (zero bytes) and not as "nothing yet".
TEST(DevmemLive, ASocketWithoutAPeerIsAnError) {
    Fd tcp(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(tcp.fd, 0);
    DevmemReceiver rx(tcp.fd);
    std::array<std::uint8_t, 16> linear{};
    auto got = rx.receive(linear);
    ASSERT_FALSE(got) << "a receive with no peer returned " << got->bytes() << " byte(s)";
    EXPECT_EQ(got.error().code, Errc::io);
    EXPECT_NE(got.error().message.find(std::strerror(ENOTCONN)), std::string::npos)
        << got.error().message;
}

// A linear buffer smaller than what arrived: the kernel hands out what fits, the rest stays
// queued, in order, and no byte is counted twice.
TEST(DevmemLive, ASmallBufferReadsTheStreamInPieces) {
    knod::test::LoopbackTcp tcp;
    const std::string sent = "0123456789abcdefghij";
    ASSERT_EQ(send(tcp.peer, sent.data(), sent.size(), 0), static_cast<ssize_t>(sent.size()));
    DevmemReceiver rx(tcp.conn);
    std::string read;
    while (read.size() < sent.size()) {
        auto ready = rx.wait_for_data(30000);
        ASSERT_TRUE(ready && *ready) << "waited 30 s for the rest of the stream";
        std::array<std::uint8_t, 7> linear{};
        auto got = rx.receive(linear);
        ASSERT_TRUE(got) << got.error().message;
        ASSERT_TRUE(got->fragments.empty());
        ASSERT_LE(got->linear_bytes, linear.size());
        ASSERT_GT(got->linear_bytes, 0u) << "the peer did not close";
        read.append(reinterpret_cast<char *>(linear.data()), got->linear_bytes);
    }
    EXPECT_EQ(read, sent);
}

// knod.distributed's devmem path on this kernel's TCP (#53): messages sent with their headers and
// received with recvmsg(MSG_SOCK_DEVMEM), one at a time (each receive stops at its message's
// end), reduced and copied into place; then the live error paths: a sender that stops mid-message
// and a stream that carries another message.
TEST(DevmemLive, StreamMessagesArriveWholeAndInStep) {
    knod::test::LoopbackTcp tcp;
    std::vector<std::int64_t> theirs(100000), mine(100000), copied(777, -1), sent2(777);
    for (std::size_t i = 0; i < theirs.size(); ++i) {
        theirs[i] = static_cast<std::int64_t>(i) * 3 - 5;
        mine[i] = static_cast<std::int64_t>(i);
    }
    for (std::size_t i = 0; i < sent2.size(); ++i)
        sent2[i] = static_cast<std::int64_t>(i) << 33;
    // The sender on a thread of its own: 800 KB do not fit the socket's buffers unread.
    Result<void> first = {}, second = {};
    std::thread sender([&] {
        first = send_stream_message(tcp.peer, theirs.data(), {9, 2, theirs.size() * 8}, {});
        second = send_stream_message(tcp.peer, sent2.data(), {10, 2, sent2.size() * 8}, {});
    });
    DevmemReceiver rx(tcp.conn);
    std::vector<std::uint8_t> scratch(4096);
    auto got = receive_stream_message(rx, {}, scratch, {9, 2, mine.size() * 8},
                                      {mine.data(), KNOD_CHUNK_I64, KNOD_CHUNK_SUM}, {});
    ASSERT_TRUE(got) << got.error().message;
    EXPECT_EQ(got->linear_bytes, stream_header_size + mine.size() * 8);
    EXPECT_EQ(got->dmabuf_bytes, 0u) << "no devmem NIC here: every byte is linear";
    for (std::size_t i = 0; i < mine.size(); ++i)
        ASSERT_EQ(mine[i], static_cast<std::int64_t>(i) * 4 - 5) << "element " << i;
    auto next = receive_stream_message(rx, {}, scratch, {10, 2, copied.size() * 8},
                                       {copied.data(), KNOD_CHUNK_I64, KNOD_CHUNK_COPY}, {});
    ASSERT_TRUE(next) << next.error().message;
    EXPECT_EQ(copied, sent2);
    sender.join();
    ASSERT_TRUE(first) << first.error().message;
    ASSERT_TRUE(second) << second.error().message;

    // Another message than the one expected (its number), then a sender that stops halfway.
    std::vector<std::uint8_t> small(64, 7), dst(64, 0);
    ASSERT_TRUE(send_stream_message(tcp.peer, small.data(), {12, 2, small.size()}, {}));
    auto foreign = receive_stream_message(rx, {}, scratch, {11, 2, 64},
                                          {dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY}, {});
    ASSERT_FALSE(foreign);
    EXPECT_EQ(foreign.error().code, Errc::corrupt);
    EXPECT_NE(foreign.error().message.find("does not carry message 11"), std::string::npos)
        << foreign.error().message;

    knod::test::LoopbackTcp cut;
    std::vector<std::uint8_t> header(stream_header_size);
    std::uint32_t words[4] = {KNOD_CHUNK_MAGIC, 0, 1, 0};
    std::uint64_t total = 1000;
    std::memcpy(header.data(), words, sizeof words);
    std::memcpy(header.data() + 16, &total, sizeof total);
    header.resize(header.size() + 100, 1);
    ASSERT_EQ(send(cut.peer, header.data(), header.size(), 0), static_cast<ssize_t>(header.size()));
    cut.close_peer();
    DevmemReceiver rx2(cut.conn);
    std::vector<std::uint8_t> big(1000);
    auto ended = receive_stream_message(rx2, {}, scratch, {0, 1, 1000},
                                        {big.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY}, {});
    ASSERT_FALSE(ended);
    EXPECT_EQ(ended.error().code, Errc::io);
    EXPECT_NE(ended.error().message.find("rank 1 closed its stream after 124 of 1024 bytes"),
              std::string::npos)
        << ended.error().message;
}

// Another thread's cancel (an eventfd, as knod.distributed's shutdown writes) ends a receive
// blocked on a live socket, and one blocked sending to a receiver that reads nothing; a message
// whose sender goes quiet ends when its budget does.
TEST(DevmemLive, AStreamWaitEndsOnCancelOrItsBudget) {
    knod::test::LoopbackTcp tcp;
    int cancel = eventfd(0, EFD_CLOEXEC);
    ASSERT_GE(cancel, 0);
    DevmemReceiver rx(tcp.conn);
    std::vector<std::uint8_t> scratch(4096), dst(64);
    Result<StreamReceived> got = make_error(Errc::io, "not run");
    std::thread receiver([&] {
        got = receive_stream_message(rx, {}, scratch, {0, 1, 64},
                                     {dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY}, {-1, cancel});
    });
    std::uint64_t one = 1;
    ASSERT_EQ(write(cancel, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    receiver.join();
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, Errc::revoked) << got.error().message;

    // Nobody reads tcp.conn: the sender fills the socket's buffers, then waits until cancelled.
    std::vector<std::uint8_t> big(64 << 20);
    Result<void> sent = {};
    std::thread sender([&] {
        sent = send_stream_message(tcp.peer, big.data(), {0, 0, big.size()}, {-1, cancel});
    });
    sender.join(); // the eventfd is still readable: the send stops once the buffers are full
    ASSERT_FALSE(sent);
    EXPECT_EQ(sent.error().code, Errc::revoked) << sent.error().message;
    close(cancel);

    // Half a message, then nothing: the budget (0 ms: nothing more is coming) ends it.
    knod::test::LoopbackTcp quiet;
    std::vector<std::uint8_t> half(stream_header_size + 10, 0);
    std::uint32_t words[4] = {KNOD_CHUNK_MAGIC, 0, 1, 0};
    std::uint64_t total = 64;
    std::memcpy(half.data(), words, sizeof words);
    std::memcpy(half.data() + 16, &total, sizeof total);
    ASSERT_EQ(send(quiet.peer, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
    DevmemReceiver rx2(quiet.conn);
    Result<StreamReceived> partial = make_error(Errc::io, "not run");
    while (true) { // the half arrives first (a condition, not a time), then the budget runs out
        partial = receive_stream_message(rx2, {}, scratch, {0, 1, 64},
                                         {dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY}, {0, -1});
        ASSERT_FALSE(partial);
        ASSERT_EQ(partial.error().code, Errc::unavailable) << partial.error().message;
        if (partial.error().message.find("after 34 of 88 bytes") != std::string::npos) break;
        ASSERT_NE(partial.error().message.find("after 0 of 88 bytes"), std::string::npos)
            << partial.error().message;
        // Nothing was read: the next try sees the half once it has landed.
        auto landed = rx2.wait_for_data(30000);
        ASSERT_TRUE(landed && *landed) << "the half never landed";
    }
}
