// The client's devmem receive path (issue 18): control messages of recvmsg(MSG_SOCK_DEVMEM)
// parsed from crafted buffers, tokens batched for SO_DEVMEM_DONTNEED within the kernel's limits,
// and the socket calls against the live kernel on a loopback TCP connection (no devmem NIC here:
// readable data comes back linear, unknown tokens are not freed).
#include "client/devmem_rx.h"
#include "tests/unit/loopback_tcp.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <iostream>

using namespace knod;
using namespace knod::client;

namespace {

// A control buffer as the kernel fills it.
struct Control {
    std::vector<std::uint8_t> buf = std::vector<std::uint8_t>(4096);
    std::size_t used = 0;
    void add(int level, int type, const void *data, std::size_t len) {
        auto *c = reinterpret_cast<cmsghdr *>(buf.data() + used);
        c->cmsg_level = level;
        c->cmsg_type = type;
        c->cmsg_len = CMSG_LEN(len);
        std::memcpy(CMSG_DATA(c), data, len);
        used += CMSG_SPACE(len);
    }
    void frag(int type, std::uint64_t offset, std::uint32_t size, std::uint32_t token) {
        DmabufCmsg d{offset, size, token, 7, 0};
        add(SOL_SOCKET, type, &d, sizeof d);
    }
    msghdr msg(int flags = 0) {
        msghdr m{};
        m.msg_control = buf.data();
        m.msg_controllen = used;
        m.msg_flags = flags;
        return m;
    }
};

} // namespace

TEST(DevmemRx, FragmentsAndLinearBytesInStreamOrder) {
    Control c;
    c.frag(so_devmem_dmabuf, 0, 4096, 1);
    int ts = 1;
    c.add(SOL_SOCKET, SO_TIMESTAMP, &ts, sizeof ts); // another option's message: passed over
    c.frag(so_devmem_dmabuf, 8192, 1000, 2);
    c.frag(so_devmem_linear, 0, 60, 0);
    auto m = c.msg();
    auto r = parse_devmem_cmsgs(m, 4096 + 1000 + 60);
    ASSERT_TRUE(r) << r.error().message;
    ASSERT_EQ(r->fragments.size(), 2u);
    EXPECT_EQ(r->fragments[0].offset, 0u);
    EXPECT_EQ(r->fragments[0].size, 4096u);
    EXPECT_EQ(r->fragments[1].offset, 8192u);
    EXPECT_EQ(r->fragments[1].token, 2u);
    EXPECT_EQ(r->fragments[1].dmabuf_id, 7u);
    EXPECT_EQ(r->linear_bytes, 60u);
    EXPECT_EQ(r->bytes(), 4096u + 1000 + 60);
}

TEST(DevmemRx, ReadableDataWithoutMessagesIsLinear) {
    Control c;
    auto m = c.msg();
    auto r = parse_devmem_cmsgs(m, 5);
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->fragments.empty());
    EXPECT_EQ(r->linear_bytes, 5u);
}

TEST(DevmemRx, BrokenControlDataIsRefused) {
    Control trunc;
    trunc.frag(so_devmem_dmabuf, 0, 100, 1);
    auto m = trunc.msg(MSG_CTRUNC);
    auto r = parse_devmem_cmsgs(m, 100);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("too small"), std::string::npos);

    Control shorty;
    std::uint32_t half[2] = {0, 100};
    shorty.add(SOL_SOCKET, so_devmem_dmabuf, half, sizeof half);
    m = shorty.msg();
    r = parse_devmem_cmsgs(m, 100);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("short SCM_DEVMEM_DMABUF"), std::string::npos);

    Control more;
    more.frag(so_devmem_dmabuf, 0, 5000, 1);
    m = more.msg();
    r = parse_devmem_cmsgs(m, 100);
    ASSERT_FALSE(r) << "fragments larger than the receive";

    Control linear;
    linear.frag(so_devmem_linear, 0, 10, 0);
    m = linear.msg();
    EXPECT_FALSE(parse_devmem_cmsgs(m, 20)) << "SCM_DEVMEM_LINEAR disagrees with the count";
}

TEST(DevmemRx, TokensAreBatchedWithinTheKernelsLimits) {
    auto b = devmem_token_batches({1, 2, 3, 7, 8, 20});
    ASSERT_EQ(b.size(), 1u);
    ASSERT_EQ(b[0].size(), 3u);
    EXPECT_EQ(b[0][0].token_start, 1u);
    EXPECT_EQ(b[0][0].token_count, 3u);
    EXPECT_EQ(b[0][1].token_start, 7u);
    EXPECT_EQ(b[0][1].token_count, 2u);
    EXPECT_EQ(b[0][2].token_count, 1u);
    EXPECT_TRUE(devmem_token_batches({}).empty());

    // 300 scattered tokens: 128 ranges per call.
    std::vector<std::uint32_t> scattered;
    for (std::uint32_t i = 0; i < 300; ++i)
        scattered.push_back(i * 2);
    b = devmem_token_batches(scattered);
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b[0].size(), 128u);
    EXPECT_EQ(b[1].size(), 128u);
    EXPECT_EQ(b[2].size(), 44u);
    EXPECT_EQ(b[1][0].token_start, 256u) << "no token lost or repeated between calls";

    // 3000 consecutive tokens: one range each call, at most 1024 tokens per call.
    std::vector<std::uint32_t> run;
    for (std::uint32_t i = 0; i < 3000; ++i)
        run.push_back(100 + i);
    b = devmem_token_batches(run);
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b[0][0].token_count, 1024u);
    EXPECT_EQ(b[1][0].token_start, 100u + 1024);
    EXPECT_EQ(b[2][0].token_count, 3000u - 2048);
}

// The socket path against the live kernel: a loopback TCP stream (no devmem NIC) comes back as
// linear bytes; releasing a token the socket never had frees nothing (or the kernel has no
// SO_DEVMEM_DONTNEED at all).
TEST(DevmemRx, LiveLoopbackStreamIsLinear) {
    knod::test::LoopbackTcp tcp;
    int conn = tcp.conn;
    DevmemReceiver rx(conn);
    auto idle = rx.wait_for_data(50);
    ASSERT_TRUE(idle) << idle.error().message;
    EXPECT_FALSE(*idle) << "nothing was sent yet";
    ASSERT_EQ(send(tcp.peer, "hello", 5, 0), 5);
    auto ready = rx.wait_for_data(5000);
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
    ready = rx.wait_for_data(5000);
    ASSERT_TRUE(ready && *ready) << "the peer's close wakes the wait";
    got = rx.receive(linear);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->bytes(), 0u) << "the peer closed";
    auto closed = DevmemReceiver(1 << 20).wait_for_data(0); // no such fd
    EXPECT_FALSE(closed) << "a closed fd is an error, not a timeout";
}

// A message whose length reaches past the control buffer's end (msg_controllen) is refused, not
// read beyond the buffer: CMSG_FIRSTHDR checks only that a header fits, not the length it claims.
TEST(DevmemRx, AMessageLongerThanTheControlBufferIsRefused) {
    Control c;
    c.frag(so_devmem_dmabuf, 0, 100, 1);
    auto m = c.msg();
    m.msg_controllen = sizeof(cmsghdr) + 8; // the header and 8 of the message's 24 bytes
    auto r = parse_devmem_cmsgs(m, 100);
    ASSERT_FALSE(r) << "parsed " << r->fragments.size() << " fragment(s) from past the buffer";
    EXPECT_EQ(r.error().code, Errc::corrupt);
}
