// knod.distributed's devmem receive path (client/devmem_stream.h) on a scripted source: the
// stream's bytes come as the kernel hands them out (linear runs and fragments in the dma-buf,
// split anywhere), so headers and elements split across runs, foreign streams, fragments the
// dma-buf does not hold and early ends can be made at will. (The same path on live sockets is
// DevmemLive.* in devmem_live_test.cc and CApiDevmem.* in client_sdk_test.cc: they run in the VM.)
#include "client/devmem_stream.h"
#include "knod/client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <vector>

using namespace knod;
using namespace knod::client;

namespace {

// A stream as a devmem socket hands it out: pieces of linear bytes or fragments of the dma-buf,
// at most `per_receive` of them a receive, never more bytes than asked for (a piece is split).
struct ScriptedSource : DevmemSource {
    struct Piece {
        bool linear;
        std::vector<std::uint8_t> bytes; // linear
        std::uint64_t offset = 0;        // fragment
        std::uint32_t size = 0;
    };
    std::deque<Piece> pieces;
    std::vector<std::uint8_t> dmabuf = std::vector<std::uint8_t>(1 << 16);
    std::uint64_t dmabuf_used = 0;
    std::size_t per_receive = 2;
    std::uint32_t next_token = 1;
    std::set<std::uint32_t> outstanding;
    std::size_t receives = 0;
    bool describe_linear = true; // false: linear bytes with no SCM_DEVMEM_LINEAR
    std::uint32_t dmabuf_id = 1; // what every fragment says
    Ready ready = Ready::data;   // what wait() answers
    std::size_t waits = 0;

    void linear(const std::vector<std::uint8_t> &b) { pieces.push_back({true, b}); }
    void fragment(const std::vector<std::uint8_t> &b) { // placed by "the NIC" in the dma-buf
        std::memcpy(dmabuf.data() + dmabuf_used, b.data(), b.size());
        pieces.push_back({false, {}, dmabuf_used, static_cast<std::uint32_t>(b.size())});
        dmabuf_used += b.size() + 64; // not adjacent: a reader must use the offsets
    }
    // The stream `bytes` cut at `cuts`, alternating linear and fragment runs.
    void stream(const std::vector<std::uint8_t> &bytes, std::vector<std::size_t> cuts,
                bool first_linear = true) {
        cuts.push_back(bytes.size());
        std::size_t at = 0;
        bool lin = first_linear;
        for (auto c : cuts) {
            std::vector<std::uint8_t> run(bytes.begin() + at, bytes.begin() + c);
            if (!run.empty()) lin ? linear(run) : fragment(run);
            lin = !lin;
            at = c;
        }
    }

    Result<Ready> wait(int, int) override {
        ++waits;
        return ready;
    }
    Result<DevmemReceived> receive(std::span<std::uint8_t> out) override {
        ++receives;
        DevmemReceived r;
        std::size_t room = out.size(), lin = 0;
        for (std::size_t k = 0; k < per_receive && room && !pieces.empty(); ++k) {
            auto &p = pieces.front();
            std::size_t n = std::min<std::size_t>(room, p.linear ? p.bytes.size() : p.size);
            if (p.linear) {
                std::memcpy(out.data() + lin, p.bytes.data(), n);
                lin += n;
                p.bytes.erase(p.bytes.begin(), p.bytes.begin() + static_cast<std::ptrdiff_t>(n));
                r.order.push_back({true, n});
            } else {
                r.fragments.push_back(
                    {p.offset, static_cast<std::uint32_t>(n), next_token, dmabuf_id});
                outstanding.insert(next_token++);
                p.offset += n;
                p.size -= static_cast<std::uint32_t>(n);
                r.order.push_back({false, n});
            }
            room -= n;
            if (p.linear ? p.bytes.empty() : p.size == 0) pieces.pop_front();
        }
        r.linear_bytes = lin;
        if (!describe_linear && lin && !r.fragments.empty()) r.order.clear();
        return r;
    }
    Result<void> release(const std::vector<DevmemFragment> &fragments) override {
        for (auto &f : fragments)
            if (!outstanding.erase(f.token))
                return make_error(Errc::invalid_argument, "token released twice or unknown");
        return {};
    }
};

std::vector<std::uint8_t> header(std::uint32_t msg, std::uint32_t source, std::uint64_t total,
                                 std::uint32_t magic = KNOD_CHUNK_MAGIC) {
    std::vector<std::uint8_t> h(stream_header_size);
    std::uint32_t w[4] = {magic, msg, source, 0};
    std::memcpy(h.data(), w, sizeof w);
    std::memcpy(h.data() + 16, &total, sizeof total);
    return h;
}

template <typename T> std::vector<std::uint8_t> bytes_of(const std::vector<T> &v) {
    std::vector<std::uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

std::vector<std::uint8_t> message(std::uint32_t msg, std::uint32_t source,
                                  const std::vector<std::uint8_t> &payload) {
    auto h = header(msg, source, payload.size());
    std::vector<std::uint8_t> m(h.size() + payload.size());
    std::copy(h.begin(), h.end(), m.begin());
    std::copy(payload.begin(), payload.end(), m.begin() + static_cast<std::ptrdiff_t>(h.size()));
    return m;
}

// Message `msg` from `source` of `total` bytes, applied to dst as dtype/op, from the dma-buf
// whose id is 1 (the fragments' own, unless a test says otherwise).
struct Expect {
    std::uint32_t msg, source;
    std::uint64_t total;
    void *dst;
    int dtype, op;
};

Result<StreamReceived> receive(ScriptedSource &s, Expect e, std::uint32_t id = 1) {
    std::vector<std::uint8_t> scratch(100); // small: runs split often
    return receive_stream_message(s, {s.dmabuf, id}, scratch, {e.msg, e.source, e.total},
                                  {e.dst, e.dtype, e.op}, {});
}

} // namespace

// A header split between a linear run and a fragment, float elements split between runs of
// both kinds: the sum is the elementwise one, every fragment is given back, and the next
// message stays in the stream for the next call.
TEST(DevmemStream, RunsSplitAnywhereReduceToTheSameTensor) {
    ScriptedSource s;
    std::vector<float> mine = {1.5f, -2.0f, 3.25f, 100.0f, 0.0f, 7.0f, -1.0f, 2.5f};
    std::vector<float> theirs = {0.5f, 2.0f, -3.25f, 1.0f, 9.0f, 1.0f, 4.0f, 0.5f};
    std::vector<std::int64_t> next = {1, 2, 3};
    auto first = message(4, 1, bytes_of(theirs));
    s.stream(first, {10, 27, 30, 41, 53, 54});
    s.stream(message(5, 1, bytes_of(next)), {3}, false);
    Expect m{4, 1, theirs.size() * 4, mine.data(), KNOD_CHUNK_F32, KNOD_CHUNK_SUM};
    auto got = receive(s, m);
    ASSERT_TRUE(got) << got.error().message;
    for (std::size_t i = 0; i < mine.size(); ++i)
        EXPECT_EQ(mine[i],
                  std::vector<float>({2.0f, 0.0f, 0.0f, 101.0f, 9.0f, 8.0f, 3.0f, 3.0f})[i])
            << "element " << i;
    EXPECT_GT(got->dmabuf_bytes, 0u);
    EXPECT_GT(got->linear_bytes, 0u);
    EXPECT_EQ(got->dmabuf_bytes + got->linear_bytes, first.size());
    EXPECT_TRUE(s.outstanding.empty()) << s.outstanding.size() << " fragment(s) never released";
    std::vector<std::int64_t> copy(3, -1);
    Expect m2{5, 1, 24, copy.data(), KNOD_CHUNK_I64, KNOD_CHUNK_COPY};
    auto second = receive(s, m2);
    ASSERT_TRUE(second) << second.error().message;
    EXPECT_EQ(copy, next);
    EXPECT_TRUE(s.pieces.empty());
}

// Every element type and operation the chunks have, on runs that split elements.
TEST(DevmemStream, IntegersWrapAndMinMaxPassNaNOnAsTheChunksDo) {
    ScriptedSource s;
    s.per_receive = 1;
    std::vector<std::int32_t> mine = {INT32_MAX, 5, -7};
    std::vector<std::int32_t> theirs = {1, -5, 8};
    s.stream(message(0, 3, bytes_of(theirs)), {5, 26, 29, 31});
    Expect m{0, 3, 12, mine.data(), KNOD_CHUNK_I32, KNOD_CHUNK_SUM};
    ASSERT_TRUE(receive(s, m));
    EXPECT_EQ(mine, (std::vector<std::int32_t>{INT32_MIN, 0, 1}));
    std::vector<double> a = {1.0, std::nan(""), 3.0};
    std::vector<double> b = {std::nan(""), 2.0, -3.0};
    s.stream(message(1, 3, bytes_of(b)), {30, 33}, false);
    Expect m2{1, 3, 24, a.data(), KNOD_CHUNK_F64, KNOD_CHUNK_MAX};
    ASSERT_TRUE(receive(s, m2));
    EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a[1]));
    EXPECT_EQ(a[2], 3.0);
    EXPECT_TRUE(s.outstanding.empty());
}

// A stream that carries another message, another sender's, another length or no magic is an
// error naming what came; its fragments are given back all the same.
TEST(DevmemStream, AForeignOrOutOfStepHeaderIsAnErrorAndItsFragmentsAreReleased) {
    struct Case {
        const char *what;
        std::vector<std::uint8_t> head;
    } cases[] = {{"another message", header(8, 2, 16)},
                 {"another sender", header(7, 3, 16)},
                 {"another length", header(7, 2, 32)},
                 {"no magic", header(7, 2, 16, 0x12345678)}};
    for (auto &c : cases) {
        ScriptedSource s;
        auto bytes = c.head;
        bytes.resize(bytes.size() + 16, 0xAB);
        s.stream(bytes, {20}, false);
        std::vector<std::uint8_t> dst(16, 0);
        auto got = receive(s, {7, 2, 16, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
        ASSERT_FALSE(got) << c.what;
        EXPECT_EQ(got.error().code, Errc::corrupt) << c.what;
        EXPECT_NE(got.error().message.find("does not carry message 7"), std::string::npos)
            << c.what << ": " << got.error().message;
        EXPECT_EQ(dst, std::vector<std::uint8_t>(16, 0)) << c.what << ": payload applied";
        EXPECT_TRUE(s.outstanding.empty()) << c.what;
    }
}

TEST(DevmemStream, AFragmentOutsideTheDmabufIsCorrupt) {
    ScriptedSource s;
    s.stream(message(0, 1, std::vector<std::uint8_t>(40, 1)), {}, false);
    s.pieces.front().offset = s.dmabuf.size() - 10; // the kernel says it lies past the end
    std::vector<std::uint8_t> dst(40);
    auto got = receive(s, {0, 1, 40, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, Errc::corrupt);
    EXPECT_NE(got.error().message.find("outside the binding's dma-buf"), std::string::npos)
        << got.error().message;
    EXPECT_TRUE(s.outstanding.empty());
}

TEST(DevmemStream, AStreamThatEndsEarlyNamesHowFarItGot) {
    ScriptedSource s;
    auto bytes = message(2, 1, std::vector<std::uint8_t>(100, 9));
    bytes.resize(60);
    s.stream(bytes, {30});
    std::vector<std::uint8_t> dst(100);
    auto got = receive(s, {2, 1, 100, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, Errc::io);
    EXPECT_NE(got.error().message.find("rank 1 closed its stream after 60 of 124 bytes of "
                                       "message 2"),
              std::string::npos)
        << got.error().message;
}

// Linear bytes beside fragments with no SCM_DEVMEM_LINEAR to place them: refused, not guessed.
TEST(DevmemStream, LinearBytesInNoKnownOrderAreRefused) {
    ScriptedSource s;
    s.describe_linear = false;
    s.stream(message(0, 1, std::vector<std::uint8_t>(40, 1)), {30});
    std::vector<std::uint8_t> dst(40);
    auto got = receive(s, {0, 1, 40, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
    ASSERT_FALSE(got);
    EXPECT_NE(got.error().message.find("order is unknown"), std::string::npos)
        << got.error().message;
    EXPECT_TRUE(s.outstanding.empty());
}

TEST(DevmemStream, WhatCannotBeAppliedIsRefusedBeforeAnythingIsRead) {
    ScriptedSource s;
    s.stream(message(0, 1, std::vector<std::uint8_t>(12, 1)), {});
    std::vector<std::uint8_t> dst(12);
    auto bad_op = receive(s, {0, 1, 12, dst.data(), KNOD_CHUNK_F32, 9});
    ASSERT_FALSE(bad_op);
    EXPECT_EQ(bad_op.error().code, Errc::invalid_argument);
    auto bad_type = receive(s, {0, 1, 12, dst.data(), 42, KNOD_CHUNK_SUM});
    ASSERT_FALSE(bad_type);
    auto partial = receive(s, {0, 1, 12, dst.data(), KNOD_CHUNK_F64, KNOD_CHUNK_SUM});
    ASSERT_FALSE(partial);
    EXPECT_NE(partial.error().message.find("not whole elements"), std::string::npos);
    EXPECT_EQ(s.receives, 0u);
}

// A flow steered onto another binding's queue: its fragments carry that dma-buf's id, and their
// offsets mean nothing in ours. Refused, released, nothing applied; with no id known (0), no
// fragment is taken at all.
TEST(DevmemStream, AFragmentOfAnotherDmabufIsRefused) {
    for (std::uint32_t ours : {1u, 0u}) {
        ScriptedSource s;
        s.dmabuf_id = ours == 1 ? 99 : 1;
        s.stream(message(0, 1, std::vector<std::uint8_t>(40, 1)), {}, false);
        std::vector<std::uint8_t> dst(40, 0);
        auto got = receive(s, {0, 1, 40, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY}, ours);
        ASSERT_FALSE(got) << "our id " << ours;
        EXPECT_EQ(got.error().code, Errc::corrupt);
        EXPECT_NE(got.error().message.find(ours ? "not this binding's (1)" : "not known"),
                  std::string::npos)
            << got.error().message;
        EXPECT_EQ(dst, std::vector<std::uint8_t>(40, 0));
        EXPECT_TRUE(s.outstanding.empty());
    }
}

// A message's budget and another thread's cancel: each ends the receive, naming how far it got.
TEST(DevmemStream, ATimeoutOrACancelEndsTheReceiveNamingHowFarItGot) {
    for (auto ready : {DevmemSource::Ready::timeout, DevmemSource::Ready::cancelled}) {
        ScriptedSource s;
        s.ready = ready;
        std::vector<std::uint8_t> dst(40);
        auto got = receive(s, {0, 1, 40, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
        ASSERT_FALSE(got);
        EXPECT_EQ(got.error().code,
                  ready == DevmemSource::Ready::timeout ? Errc::unavailable : Errc::revoked);
        EXPECT_NE(got.error().message.find("after 0 of 64 bytes of message 0 from rank 1"),
                  std::string::npos)
            << got.error().message;
        EXPECT_EQ(s.receives, 0u) << "received after the wait said no";
    }
}

// What a kernel could say that does not add up: fragments of no size (no progress: the stream's
// end), and a message so long that its length would wrap.
TEST(DevmemStream, NoProgressEndsAndAHugeLengthIsRefused) {
    ScriptedSource s;
    s.pieces.push_back({false, {}, 0, 0});
    std::vector<std::uint8_t> dst(40);
    auto got = receive(s, {0, 1, 40, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
    ASSERT_FALSE(got);
    EXPECT_EQ(got.error().code, Errc::io);
    EXPECT_TRUE(s.outstanding.empty());
    auto huge =
        receive(s, {0, 1, ~std::uint64_t{0} - 8, dst.data(), KNOD_CHUNK_U8, KNOD_CHUNK_COPY});
    ASSERT_FALSE(huge);
    EXPECT_EQ(huge.error().code, Errc::invalid_argument);
    EXPECT_NE(huge.error().message.find("too large"), std::string::npos);
}
