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

#include <string>

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
