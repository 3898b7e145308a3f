// libknod-client without a daemon: the refusal parser against what the real policy engine
// writes (so a change of the engine's wording fails here, not in a user's program), and the C
// API's answers to bad arguments and to a bus that is not there.
#include "client/refusal.h"
#include "knod/client.h"
#include "policy/engine.h"
#include "policy/parser.h"
#include "protocol/names.h"

#include "tests/unit/loopback_tcp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace knod;

namespace {

const char *rules = R"(
[[rule]]
name = "no-guests; rule 'x' allows 1"
action = "deny"
users = [2000]

[[rule]]
name = "lab"
users = [1000]
netdevs = ["eth2"]
max_region = "1MiB"
max_bindings_per_uid = 1
flows = ["udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100"]
)";

policy::Decision decide(std::uint32_t uid, std::uint32_t holds = 0) {
    policy::PolicyLoad load = policy::parse_policy_text(rules, "test.toml");
    EXPECT_TRUE(load.ok()) << load.errors_text();
    policy::Request r;
    r.caller.uid = uid;
    r.caller.gids = {uid};
    r.netdev = "eth2";
    r.gpu_names = {"0000:c1:00.0"};
    r.region_bytes = 4096;
    r.flows = {*policy::parse_flow_spec("udp 10.0.0.1:* -> 10.1.2.3:5000")};
    policy::Usage usage;
    usage.bindings = holds;
    return policy::decide(load.policy, r, usage);
}

// The message as knod-policyd sends it (binding_manager: the reason, then each miss) and as the
// client's calls return it (the D-Bus error name in front).
std::string as_sent(const policy::Decision &d, const char *error_name) {
    std::string why = d.reason;
    for (auto &m : d.misses)
        why += "; rule '" + m.rule + "': " + m.why_not;
    return std::string(error_name) + ": " + why;
}

} // namespace

TEST(ClientRefusal, DenyRuleIsNamedEvenWithQuotesAndSemicolons) {
    auto d = decide(2000);
    ASSERT_EQ(d.verdict, policy::Verdict::deny);
    auto r = client::parse_refusal(as_sent(d, bus::error::denied));
    EXPECT_EQ(r.dbus_name, bus::error::denied);
    ASSERT_TRUE(r.rule.has_value());
    EXPECT_EQ(*r.rule, "no-guests; rule 'x' allows 1");
    EXPECT_EQ(r.message, d.reason);
}

TEST(ClientRefusal, DefaultDenyNamesNoRuleThoughRulesMissed) {
    auto d = decide(3000);
    ASSERT_EQ(d.verdict, policy::Verdict::deny);
    ASSERT_FALSE(d.misses.empty());
    auto r = client::parse_refusal(as_sent(d, bus::error::denied));
    EXPECT_EQ(r.dbus_name, bus::error::denied);
    EXPECT_FALSE(r.rule.has_value());
}

TEST(ClientRefusal, QuotaNamesTheRuleThatSetIt) {
    auto d = decide(1000, 1);
    ASSERT_EQ(d.verdict, policy::Verdict::quota_exceeded);
    auto r = client::parse_refusal(as_sent(d, bus::error::quota_exceeded));
    ASSERT_TRUE(r.rule.has_value());
    EXPECT_EQ(*r.rule, "lab");
}

// A bound on the daemon's state has its own code and name, both ways: not a policy quota.
TEST(ClientRefusal, LimitsExceededIsItsOwnCodeAndName) {
    EXPECT_STREQ(bus::error_name(Errc::limits_exceeded), bus::error::limits_exceeded);
    EXPECT_EQ(bus::error_code(bus::error::limits_exceeded), Errc::limits_exceeded);
    EXPECT_NE(bus::error_code(bus::error::quota_exceeded), Errc::limits_exceeded);
    auto r = client::parse_refusal(std::string(bus::error::limits_exceeded) +
                                   ": limits exceeded: uid 5: at most 256 connections per user");
    EXPECT_EQ(r.dbus_name, bus::error::limits_exceeded);
    EXPECT_FALSE(r.rule.has_value());
}

TEST(ClientRefusal, LocalFailuresHaveNoBusName) {
    auto r = client::parse_refusal("RequestBinding: cannot build the call");
    EXPECT_TRUE(r.dbus_name.empty());
    EXPECT_EQ(r.message, "RequestBinding: cannot build the call");
    EXPECT_FALSE(r.rule.has_value());
    EXPECT_TRUE(client::parse_refusal("").dbus_name.empty());
    // A key refusal is a Denied that no rule decided.
    auto k = client::parse_refusal(std::string(bus::error::denied) + ": key refused: bad key");
    EXPECT_EQ(k.message, "key refused: bad key");
    EXPECT_FALSE(k.rule.has_value());
}

TEST(ClientCApi, NoBusIsUnavailableWithTheAddressTried) {
    knod_client *c = nullptr;
    knod_error *e = nullptr;
    EXPECT_EQ(knod_client_connect("unix:path=/nonexistent/knod-sdk-test", &c, &e),
              KNOD_ERR_UNAVAILABLE);
    EXPECT_EQ(c, nullptr);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(knod_error_code(e), KNOD_ERR_UNAVAILABLE);
    EXPECT_NE(std::string(knod_error_message(e)).find("/nonexistent/knod-sdk-test"),
              std::string::npos);
    EXPECT_EQ(knod_error_dbus_name(e), nullptr);
    EXPECT_EQ(knod_error_rule(e), nullptr);
    knod_error_free(e);
    // Without an error pointer it still fails, and leaks nothing.
    EXPECT_EQ(knod_client_connect("unix:path=/nonexistent/knod-sdk-test", &c, nullptr),
              KNOD_ERR_UNAVAILABLE);
}

TEST(ClientCApi, NullArgumentsAreInvalidNotCrashes) {
    knod_error *e = nullptr;
    EXPECT_EQ(knod_client_connect(nullptr, nullptr, &e), KNOD_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(knod_error_message(e), "out is NULL");
    knod_error_free(e);
    knod_binding *b = nullptr;
    EXPECT_EQ(
        knod_request_binding(nullptr, "eth2", "gpu", nullptr, -1, 0, 1, nullptr, 0, &b, nullptr),
        KNOD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(knod_binding_release(nullptr, nullptr), KNOD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(knod_binding_wait_for_data(nullptr, 0, 1, nullptr, nullptr),
              KNOD_ERR_INVALID_ARGUMENT);
    knod_binding_free(nullptr);
    knod_client_unref(nullptr);
    knod_error_free(nullptr);
    EXPECT_EQ(knod_binding_id(nullptr), nullptr);
}

TEST(ClientCApi, CodeNamesAreStable) {
    EXPECT_STREQ(knod_errc_name(KNOD_OK), "ok");
    EXPECT_STREQ(knod_errc_name(KNOD_ERR_DENIED), "denied");
    EXPECT_STREQ(knod_errc_name(KNOD_ERR_FLOW_CONFLICT), "flow-conflict");
    EXPECT_STREQ(knod_errc_name(KNOD_ERR_NO_MEMORY), "no-memory");
    EXPECT_STREQ(knod_errc_name(KNOD_ERR_LIMITS_EXCEEDED), "limits-exceeded");
    EXPECT_STREQ(knod_errc_name(KNOD_ERR_OUT_OF_RESOURCES), "out-of-resources");
    EXPECT_STREQ(knod_errc_name(-1), "unknown");
    EXPECT_STREQ(knod_errc_name(99), "unknown");
    EXPECT_STREQ(knod_version(), KNOD_VERSION);
}

// The receiver reads a duplicate of its own: the caller may close its fd, and a socket of
// another kind may get the number, without the receiver following the number.
TEST(CApiDevmem, TheReceiverKeepsItsOwnSocket) {
    knod::test::LoopbackTcp tcp;
    int mine = dup(tcp.conn);
    ASSERT_GE(mine, 0);
    knod_devmem_rx *rx = nullptr;
    ASSERT_EQ(knod_devmem_rx_new(mine, &rx, nullptr), KNOD_OK);
    close(mine);
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0); // likely the number just freed
    ASSERT_GE(udp, 0);
    ASSERT_EQ(send(tcp.peer, "still-tcp", 9, 0), 9);
    ASSERT_EQ(knod_devmem_rx_wait(rx, 30000, nullptr), KNOD_OK);
    std::uint8_t linear[64] = {};
    knod_devmem_fragment frags[4];
    std::size_t nbytes = 0, nfrags = 0;
    knod_error *err = nullptr;
    ASSERT_EQ(knod_devmem_rx_receive(rx, linear, sizeof linear, &nbytes, frags, 4, &nfrags, &err),
              KNOD_OK)
        << (err ? knod_error_message(err) : "");
    EXPECT_EQ(std::string(reinterpret_cast<char *>(linear), nbytes), "still-tcp");
    knod_devmem_rx_free(rx);
    close(udp);
}

// #36: the devmem receive loop through the C API, on the live kernel: a loopback TCP stream (no
// devmem NIC here) comes back as linear bytes and no fragment; releasing a token the socket
// never had is an error naming how many were freed; the peer's close is zero of both; bad
// arguments are refused. (The control-message parsing under it is DevmemRx.* in
// devmem_rx_test.cc, on crafted buffers.)
TEST(CApiDevmem, ALoopbackStreamThroughTheCApi) {
    knod::test::LoopbackTcp tcp;
    int conn = tcp.conn;

    knod_devmem_rx *rx = nullptr;
    knod_error *err = nullptr;
    EXPECT_EQ(knod_devmem_rx_new(-1, &rx, &err), KNOD_ERR_INVALID_ARGUMENT);
    knod_error_free(err);
    // devmem receive is TCP only: a UDP socket is refused up front, naming what it is.
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(udp, 0);
    err = nullptr;
    EXPECT_EQ(knod_devmem_rx_new(udp, &rx, &err), KNOD_ERR_INVALID_ARGUMENT);
    ASSERT_NE(err, nullptr);
    EXPECT_NE(std::string(knod_error_message(err)).find("a UDP socket"), std::string::npos)
        << knod_error_message(err);
    knod_error_free(err);
    close(udp);
    EXPECT_EQ(rx, nullptr);
    ASSERT_EQ(knod_devmem_rx_new(conn, &rx, nullptr), KNOD_OK);
    EXPECT_EQ(knod_devmem_rx_wait(rx, 50, &err), KNOD_ERR_TIMEOUT) << "nothing was sent yet";
    knod_error_free(err);
    ASSERT_EQ(send(tcp.peer, "hello", 5, 0), 5);
    ASSERT_EQ(knod_devmem_rx_wait(rx, 30000, nullptr), KNOD_OK);
    std::uint8_t linear[64] = {};
    knod_devmem_fragment frags[4];
    std::size_t nbytes = 99, nfrags = 99;
    ASSERT_EQ(knod_devmem_rx_receive(rx, linear, sizeof linear, &nbytes, frags, 4, &nfrags, &err),
              KNOD_OK)
        << (err ? knod_error_message(err) : "");
    EXPECT_EQ(nbytes, 5u);
    EXPECT_EQ(nfrags, 0u);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(linear), 5), "hello");
    EXPECT_EQ(knod_devmem_rx_receive(rx, linear, sizeof linear, nullptr, frags, 4, &nfrags, &err),
              KNOD_ERR_INVALID_ARGUMENT);
    knod_error_free(err);
    // No room for either would make "nothing received" look like the peer's close.
    EXPECT_EQ(knod_devmem_rx_receive(rx, linear, sizeof linear, &nbytes, frags, 0, &nfrags, &err),
              KNOD_ERR_INVALID_ARGUMENT);
    knod_error_free(err);
    EXPECT_EQ(knod_devmem_rx_receive(rx, linear, 0, &nbytes, frags, 4, &nfrags, &err),
              KNOD_ERR_INVALID_ARGUMENT);
    knod_error_free(err);

    knod_devmem_fragment unknown{0, 100, 12345, 0};
    EXPECT_EQ(knod_devmem_rx_release(rx, &unknown, 1, &err), KNOD_ERR_IO);
    ASSERT_NE(err, nullptr);
    std::string why = knod_error_message(err);
    EXPECT_TRUE(why.find("freed 0 of 1") != std::string::npos ||
                why.find("Protocol not available") != std::string::npos)
        << why;
    knod_error_free(err);
    EXPECT_EQ(knod_devmem_rx_release(rx, nullptr, 0, nullptr), KNOD_OK) << "nothing to release";

    tcp.close_peer();
    ASSERT_EQ(knod_devmem_rx_wait(rx, 30000, nullptr), KNOD_OK) << "the peer's close wakes it";
    ASSERT_EQ(
        knod_devmem_rx_receive(rx, linear, sizeof linear, &nbytes, frags, 4, &nfrags, nullptr),
        KNOD_OK);
    EXPECT_EQ(nbytes + nfrags, 0u) << "the peer closed";
    knod_devmem_rx_free(rx);
    knod_devmem_rx_free(nullptr);
}

// knod.distributed's devmem path through the C API (#53): knod_stream_send and
// knod_devmem_stream_receive over this kernel's TCP (readable data: no fragment, no dma-buf
// read); a receive left pending by knod_devmem_rx_receive is refused, and a short stream names
// how far it got.
TEST(CApiDevmem, AStreamMessageThroughTheCApi) {
    knod::test::LoopbackTcp tcp;
    knod_devmem_rx *rx = nullptr;
    ASSERT_EQ(knod_devmem_rx_new(tcp.conn, &rx, nullptr), KNOD_OK);
    std::vector<float> theirs = {1.0f, 2.0f, 3.0f}, mine = {10.0f, 20.0f, 30.0f};
    knod_error *err = nullptr;
    ASSERT_EQ(knod_stream_send(tcp.peer, theirs.data(), 12, 3, 1, -1, -1, &err), KNOD_OK)
        << (err ? knod_error_message(err) : "");
    std::uint64_t placed = 99;
    ASSERT_EQ(knod_devmem_stream_receive(rx, nullptr, 0, 0, mine.data(), 12, 3, 1, KNOD_CHUNK_F32,
                                         KNOD_CHUNK_SUM, -1, -1, &placed, &err),
              KNOD_OK)
        << (err ? knod_error_message(err) : "");
    EXPECT_EQ(mine, (std::vector<float>{11.0f, 22.0f, 33.0f}));
    EXPECT_EQ(placed, 0u);
    EXPECT_EQ(knod_devmem_stream_receive(rx, nullptr, 0, 0, mine.data(), 12, 4, 1, 99,
                                         KNOD_CHUNK_SUM, -1, -1, nullptr, &err),
              KNOD_ERR_INVALID_ARGUMENT);
    knod_error_free(err);
    err = nullptr;
    ASSERT_EQ(knod_stream_send(tcp.peer, theirs.data(), 8, 4, 1, -1, -1, &err), KNOD_OK);
    tcp.close_peer();
    EXPECT_EQ(knod_devmem_stream_receive(rx, nullptr, 0, 0, mine.data(), 12, 4, 1, KNOD_CHUNK_F32,
                                         KNOD_CHUNK_COPY, -1, -1, nullptr, &err),
              KNOD_ERR_FAILED)
        << "a header of 8 bytes where 12 were expected";
    ASSERT_NE(err, nullptr);
    EXPECT_NE(std::string(knod_error_message(err)).find("does not carry message 4"),
              std::string::npos)
        << knod_error_message(err);
    knod_error_free(err);
    err = nullptr;
    EXPECT_EQ(knod_devmem_stream_receive(rx, nullptr, 0, 0, mine.data(), 12, 5, 1, KNOD_CHUNK_F32,
                                         KNOD_CHUNK_COPY, -1, -1, nullptr, &err),
              KNOD_ERR_IO);
    ASSERT_NE(err, nullptr);
    EXPECT_NE(std::string(knod_error_message(err)).find("closed its stream"), std::string::npos)
        << knod_error_message(err);
    knod_error_free(err);
    knod_devmem_rx_free(rx);
}

// --- knod.distributed's chunks (#53) ---------------------------------------------------------

namespace {

// Sends chunks [first, upto) of `data` through the C API to a UDP socket on 127.0.0.1 and
// returns the datagrams received there, in order.
std::vector<std::vector<std::uint8_t>> send_and_catch(const std::vector<std::uint8_t> &data,
                                                      std::uint64_t first, std::uint64_t upto) {
    int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int big = 4 << 20;
    setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(rx, reinterpret_cast<sockaddr *>(&at), sizeof at), 0);
    socklen_t len = sizeof at;
    getsockname(rx, reinterpret_cast<sockaddr *>(&at), &len);
    knod_error *err = nullptr;
    EXPECT_EQ(knod_chunks_send(tx, at.sin_addr.s_addr, ntohs(at.sin_port), data.data(), data.size(),
                               9, 3, first, upto, &err),
              KNOD_OK)
        << (err ? knod_error_message(err) : "");
    knod_error_free(err);
    std::vector<std::vector<std::uint8_t>> got;
    for (std::uint64_t i = first; i < upto; ++i) {
        std::vector<std::uint8_t> d(KNOD_CHUNK_FRAME + 1);
        ssize_t n = recv(rx, d.data(), d.size(), MSG_DONTWAIT);
        if (n < 0) break;
        d.resize(static_cast<std::size_t>(n));
        got.push_back(std::move(d));
    }
    close(rx);
    close(tx);
    return got;
}

std::uint32_t word(const std::vector<std::uint8_t> &f, std::size_t i) {
    std::uint32_t v;
    std::memcpy(&v, f.data() + 4 * i, 4);
    return v;
}

} // namespace

TEST(CApiChunks, SentChunksCarryTheirHeaderAndPayload) {
    std::vector<std::uint8_t> data(2 * KNOD_CHUNK_PAYLOAD + 100);
    for (std::size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<std::uint8_t>(i * 7);
    auto frames = send_and_catch(data, 1, 3);
    ASSERT_EQ(frames.size(), 2u);
    for (std::size_t k = 0; k < 2; ++k) {
        const auto &f = frames[k];
        ASSERT_EQ(f.size(), std::size_t{KNOD_CHUNK_FRAME});
        std::uint32_t seq = static_cast<std::uint32_t>(k + 1);
        std::uint32_t len = seq == 2 ? 100 : KNOD_CHUNK_PAYLOAD;
        EXPECT_EQ(word(f, 0), KNOD_CHUNK_MAGIC);
        EXPECT_EQ(word(f, 1), 9u);
        EXPECT_EQ(word(f, 2), seq);
        EXPECT_EQ(word(f, 3), len | (3u << 16));
        EXPECT_EQ(0, std::memcmp(f.data() + KNOD_CHUNK_HEADER,
                                 data.data() + seq * KNOD_CHUNK_PAYLOAD, len));
        for (std::size_t i = KNOD_CHUNK_HEADER + len; i < f.size(); ++i)
            ASSERT_EQ(f[i], 0);
    }
    knod_error *err = nullptr;
    EXPECT_EQ(knod_chunks_send(-1, 0, 1, data.data(), data.size(), 0, 0, 2, 4, &err),
              KNOD_ERR_INVALID_ARGUMENT); // past the message's 3 chunks
    knod_error_free(err);
}

// knod_chunks_send hands the kernel up to 18 frames per message (UDP GSO): each still arrives as
// a datagram of its own, one frame, in order, also across the messages' boundaries (30 chunks:
// a message of 18 and one of 12; fewer than the default receive buffer holds).
TEST(CApiChunks, ChunksSentTogetherArriveOneDatagramEachInOrder) {
    std::vector<std::uint8_t> data(30 * KNOD_CHUNK_PAYLOAD - 5);
    for (std::size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<std::uint8_t>(i * 13 + i / 251);
    auto frames = send_and_catch(data, 0, 30);
    ASSERT_EQ(frames.size(), 30u);
    for (std::uint32_t seq = 0; seq < 30; ++seq) {
        const auto &f = frames[seq];
        ASSERT_EQ(f.size(), std::size_t{KNOD_CHUNK_FRAME});
        std::uint32_t len = seq == 29 ? KNOD_CHUNK_PAYLOAD - 5 : KNOD_CHUNK_PAYLOAD;
        EXPECT_EQ(word(f, 2), seq);
        EXPECT_EQ(word(f, 3), len | (3u << 16));
        EXPECT_EQ(0, std::memcmp(f.data() + KNOD_CHUNK_HEADER,
                                 data.data() + seq * KNOD_CHUNK_PAYLOAD, len))
            << "chunk " << seq;
    }
}

namespace {

// A ring of `seqs` chunks of a message of float32 `values` from rank 1, message 5.
std::vector<std::uint8_t> ring_of(const std::vector<float> &values,
                                  const std::vector<std::uint32_t> &seqs) {
    std::uint64_t total = values.size() * sizeof(float);
    std::vector<std::uint8_t> ring(seqs.size() * KNOD_CHUNK_FRAME);
    for (std::size_t k = 0; k < seqs.size(); ++k) {
        std::uint8_t *f = ring.data() + k * KNOD_CHUNK_FRAME;
        std::uint64_t at = std::uint64_t{seqs[k]} * KNOD_CHUNK_PAYLOAD;
        auto len =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(total - at, KNOD_CHUNK_PAYLOAD));
        std::uint32_t header[4] = {KNOD_CHUNK_MAGIC, 5, seqs[k], len | (1u << 16)};
        std::memcpy(f, header, sizeof header);
        std::memcpy(f + KNOD_CHUNK_HEADER,
                    reinterpret_cast<const std::uint8_t *>(values.data()) + at, len);
    }
    return ring;
}

} // namespace

TEST(CApiChunks, ReceiveReducesInPlaceAndPassesNaNOn) {
    std::size_t n = KNOD_CHUNK_PAYLOAD / 4 + 10; // two chunks, the second partial
    std::vector<float> theirs(n), mine(n);
    for (std::size_t i = 0; i < n; ++i) {
        theirs[i] = static_cast<float>(i) * 0.5f;
        mine[i] = 3.0f;
    }
    // NaNs in a whole 64-byte block and in the elements after the last whole block (the
    // reduction runs blocks, then what is left, one at a time).
    theirs[1] = std::nanf("");
    theirs[n - 3] = std::nanf("");
    auto ring = ring_of(theirs, {1, 0}); // the message starts at slot 1 and wraps to slot 0
    for (int op : {KNOD_CHUNK_SUM, KNOD_CHUNK_MAX, KNOD_CHUNK_MIN, KNOD_CHUNK_PRODUCT}) {
        std::vector<float> dst = mine;
        knod_error *err = nullptr;
        ASSERT_EQ(knod_chunks_receive(dst.data(), ring.data(), 2, 1, 2, 0, n * 4, 5, 1,
                                      KNOD_CHUNK_F32, op, &err),
                  KNOD_OK)
            << (err ? knod_error_message(err) : "");
        for (std::size_t i = 0; i < n; ++i) {
            float want = op == KNOD_CHUNK_SUM       ? mine[i] + theirs[i]
                         : op == KNOD_CHUNK_PRODUCT ? mine[i] * theirs[i]
                         : op == KNOD_CHUNK_MIN     ? std::min(mine[i], theirs[i])
                                                    : std::max(mine[i], theirs[i]);
            if (i == 1 || i == n - 3)
                EXPECT_TRUE(std::isnan(dst[i])) << op;
            else
                EXPECT_EQ(dst[i], want) << op << " at " << i;
        }
    }
}

TEST(CApiChunks, IntegersWrapAsTorchDoes) {
    std::vector<std::uint8_t> ring(KNOD_CHUNK_FRAME);
    std::int32_t theirs[2] = {INT32_MAX, -5};
    std::uint32_t header[4] = {KNOD_CHUNK_MAGIC, 5, 0, 8u | (1u << 16)};
    std::memcpy(ring.data(), header, sizeof header);
    std::memcpy(ring.data() + KNOD_CHUNK_HEADER, theirs, sizeof theirs);
    std::int32_t dst[2] = {1, 7};
    ASSERT_EQ(knod_chunks_receive(dst, ring.data(), 1, 0, 1, 0, 8, 5, 1, KNOD_CHUNK_I32,
                                  KNOD_CHUNK_SUM, nullptr),
              KNOD_OK);
    EXPECT_EQ(dst[0], INT32_MIN);
    EXPECT_EQ(dst[1], 2);
}

TEST(CApiChunks, ALostChunkIsAnErrorAndNothingIsApplied) {
    std::vector<float> theirs(3 * KNOD_CHUNK_PAYLOAD / 4, 1.0f);
    auto ring = ring_of(theirs, {0, 2, 1}); // chunk 1 lost (2 came first), then late
    std::vector<float> dst(theirs.size(), 0.0f);
    knod_error *err = nullptr;
    ASSERT_EQ(knod_chunks_receive(dst.data(), ring.data(), 3, 0, 3, 0, theirs.size() * 4, 5, 1,
                                  KNOD_CHUNK_F32, KNOD_CHUNK_COPY, &err),
              KNOD_ERR_FAILED);
    std::string message = knod_error_message(err);
    knod_error_free(err);
    EXPECT_NE(message.find("chunk 1 of message 5 from rank 1 is not the one expected"),
              std::string::npos)
        << message;
    for (float v : dst)
        ASSERT_EQ(v, 0.0f);
    // Another message's or another rank's chunk is foreign.
    EXPECT_EQ(knod_chunks_receive(dst.data(), ring.data(), 3, 0, 1, 0, theirs.size() * 4, 6, 1,
                                  KNOD_CHUNK_F32, KNOD_CHUNK_COPY, nullptr),
              KNOD_ERR_FAILED);
    EXPECT_EQ(knod_chunks_receive(dst.data(), ring.data(), 3, 0, 1, 0, theirs.size() * 4, 5, 2,
                                  KNOD_CHUNK_F32, KNOD_CHUNK_COPY, nullptr),
              KNOD_ERR_FAILED);
    // Unknown types and ops, and bytes that are not whole elements, are refused.
    EXPECT_EQ(knod_chunks_receive(dst.data(), ring.data(), 3, 0, 1, 0, theirs.size() * 4, 5, 1, 99,
                                  KNOD_CHUNK_SUM, nullptr),
              KNOD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(knod_chunks_receive(dst.data(), ring.data(), 3, 0, 1, 0, 6, 5, 1, KNOD_CHUNK_F32,
                                  KNOD_CHUNK_SUM, nullptr),
              KNOD_ERR_INVALID_ARGUMENT);
}
