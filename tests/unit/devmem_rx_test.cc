// The client's devmem receive path (issue 18): control messages of recvmsg(MSG_SOCK_DEVMEM)
// parsed from crafted buffers, tokens batched for SO_DEVMEM_DONTNEED within the kernel's limits.
// (The socket calls against the live kernel are devmem_live_test.cc's: they run in the VM too.)
#include "client/devmem_rx.h"

#include <gtest/gtest.h>

#include <cstring>

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
