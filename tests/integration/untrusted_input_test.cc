// Strings nobody vouches for, end to end: an executable path that is not UTF-8, a 30 MiB flow,
// hostile strings over many connections, control characters in a reloaded policy, and the bus
// itself going away. After each the daemon is still on the bus and answers (or, without a bus,
// has ended every binding and exited non-zero, saying why).
#include "tests/integration/sandbox.h"

#include "journal/verify.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

const uid_t nobody = 65534;

// Port 5000-5999 needs one executable, 6000-6999 any: one request is denied naming the
// caller's executable, the other granted.
const char *exe_policy = R"([[rule]]
name = "trainer-only"
executables = ["/opt/app/bin/trainer"]
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"

[[rule]]
name = "sim-6000"
any_caller = true
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:6000-6999"]
iommu = "any"
)";

#define SKIP_UNLESS_ROOT()                                                                         \
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)"

} // namespace

// Used to abort the daemon: nlohmann's dump() threw on the invalid UTF-8 and nothing caught it.
TEST(UntrustedInput, ExecutablePathThatIsNotUtf8IsEscapedNotFatal) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(exe_policy);
    std::string dir = sb.dir() + "/\xff\x1b[2J"; // not UTF-8, and a terminal escape
    ASSERT_TRUE(fs::create_directory(dir));
    chmod(dir.c_str(), 0755);
    std::string exe = dir + "/client";
    fs::copy_file(KNOD_TEST_CLIENT_BIN, exe);
    chmod(exe.c_str(), 0755);
    std::string shown = sb.dir() + "/\\xff\\x1b[2J/client"; // how the daemon writes it

    Output denied = sb.run_program(
        {exe, "hold", "knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5000"}, nobody);
    EXPECT_NE(denied.out.find("org.knod.Policy1.Error.Denied"), std::string::npos) << denied.out;
    EXPECT_NE(denied.out.find("caller executable '" + shown + "'"), std::string::npos)
        << denied.out;
    Output granted = sb.run_program(
        {exe, "hold", "knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:6000"}, nobody);
    EXPECT_EQ(granted.out.rfind("ok ", 0), 0u) << granted.out;

    EXPECT_EQ(kill(sb.daemon_pid(), 0), 0) << "the daemon is alive";
    auto c = sb.client();
    ASSERT_TRUE(c.ping().ok());
    ASSERT_TRUE(eventually([&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind IN "
                      "('request-denied','request-granted')") == "2";
    }));
    for (const char *kind : {"request-denied", "request-granted"}) {
        auto detail = nlohmann::json::parse(
            sb.sql(std::string("SELECT detail FROM events WHERE kind='") + kind + "'"), nullptr,
            false);
        ASSERT_TRUE(detail.is_object()) << kind;
        EXPECT_EQ(detail["exe"], shown) << kind;
    }
    EXPECT_EQ(sb.sql("SELECT exe FROM sessions"), shown);
    EXPECT_EQ(sb.stop_daemon(SIGTERM), 0);
    auto v = journal::verify_chain(sb.journal());
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->problem;
}

// Used to knock the daemon off the bus: the error echoed the flow twice, the reply passed the
// bus's message limit, the bus dropped the daemon, and it stayed alive, off the bus, silent.
TEST(UntrustedInput, ThirtyMebibyteFlowGetsAShortInvalidArgument) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(sim_policy);
    Output o = sb.run_program({KNOD_FUZZ_CLIENT_BIN, "big-flow", "30"}, nobody);
    std::istringstream reply(o.out);
    std::string name;
    std::size_t length = 0;
    reply >> name >> length;
    EXPECT_EQ(name, "org.knod.Policy1.Error.InvalidArgument") << o.out;
    EXPECT_LT(length, 256u) << "the error quotes a short prefix, not the input";
    auto c = sb.client();
    EXPECT_TRUE(c.ping().ok()) << "the daemon is still on the bus";
    auto st = c.status();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->bindings, 0u);
}

// Requests refused before the policy is asked are refusals like any other: journaled (the
// first in full, escaped and cut; the rest of the window as a count), whether the daemon or its
// bus adaptor refused them. They were answered and left no record.
TEST(UntrustedInput, RequestsRefusedBeforeThePolicyIsAskedAreJournaled) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(sim_policy, {"--refusal-window", "1", "--linux-audit=false"});
    // An unknown netdev (the driver refuses it), a flow that does not parse (the core), a 30 MiB
    // flow (the adaptor, before anything is copied).
    Output a = sb.run_client(
        {"hold", "no\x1b[2Jsuch", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5000"}, nobody);
    EXPECT_NE(a.out.find("error"), std::string::npos) << a.out;
    Output b = sb.run_client({"hold", "knodsim0", "sim0", "4096", "udp 10.99.0.1:* ->"}, nobody);
    EXPECT_NE(b.out.find("error"), std::string::npos) << b.out;
    Output c = sb.run_program({KNOD_FUZZ_CLIENT_BIN, "big-flow", "30"}, nobody);
    EXPECT_NE(c.out.find("InvalidArgument"), std::string::npos) << c.out;
    // Every refusal is accounted for: each window's first in full, the rest of it as a count
    // once it closes. How the three split over 1 s windows depends on how fast the machine
    // starts each client (under load each call may open a window of its own), so what is
    // checked is the sum and that the first is in full, never the split.
    const char *full = "SELECT count(*) FROM events WHERE kind='request-denied' AND "
                       "decision='invalid-request' AND uid=65534";
    const char *counted = "SELECT CAST(total(json_extract(detail, '$.count')) AS INTEGER) FROM "
                          "events WHERE kind='refusals-coalesced' AND uid=65534";
    EXPECT_TRUE(eventually(
        [&] { return std::atoi(sb.sql(full).c_str()) + std::atoi(sb.sql(counted).c_str()) == 3; },
        10000))
        << sb.sql("SELECT kind, decision, reason FROM events");
    // The first in full: the netdev escaped, the reason the caller got.
    std::string detail = sb.sql("SELECT detail FROM events WHERE decision='invalid-request' "
                                "ORDER BY seq LIMIT 1");
    EXPECT_NE(detail.find(R"(no\\x1b[2Jsuch)"), std::string::npos) << detail;
    EXPECT_EQ(sb.sql("SELECT count(*) FROM events WHERE instr(detail, char(27)) > 0"), "0")
        << "raw escape in the journal";
    auto v = journal::verify_chain(sb.journal());
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->problem;
}

// Every string argument gets control characters, oversized and non-UTF-8 values, over 32
// connections of one uid.
TEST(UntrustedInput, HostileStringsOverManyConnectionsGetNamedErrors) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(sim_policy, {"--rate-limit", "1000000", "--linux-audit=false"});
    Output o = sb.run_program({KNOD_FUZZ_CLIENT_BIN, "600", "11", "32"}, nobody);
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0) << o.out;
    EXPECT_NE(o.out.find("org.knod.Policy1.Error.InvalidArgument"), std::string::npos) << o.out;
    auto c = sb.client();
    ASSERT_TRUE(c.ping().ok()) << "the daemon is up";
    EXPECT_TRUE(eventually([&] { return c.status()->bindings == 0; })) << "no binding leaked";
    EXPECT_EQ(slurp(sb.dir() + "/daemon.log").find("internal error"), std::string::npos)
        << slurp(sb.dir() + "/daemon.log");
}

// A NUL made fnmatch see "*" alone: the rule granted any executable.
TEST(UntrustedInput, ReloadRefusesControlCharactersInPolicyStrings) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(sim_policy);
    auto c = sb.client();
    std::string evil =
        std::string(sim_policy) +
        "\n[[rule]]\nname = \"trainer\"\niommu = \"any\"\n"
        "executables = [\"*\\u0000/opt/app/bin/trainer\"]\nflows = [\"udp * -> *\"]\n";
    sb.write_policy(evil);
    auto r = c.reload();
    ASSERT_FALSE(r.ok());
    const std::string &msg = r.error().message;
    EXPECT_NE(msg.find("org.knod.Policy1.Error.InvalidPolicy"), std::string::npos) << msg;
    EXPECT_NE(msg.find(sb.policy_file() + ":13:16: error: string '*\\x00/opt/app/bin/trainer' "
                                          "holds a control character"),
              std::string::npos)
        << msg;
    EXPECT_EQ(c.status()->rules, 1u) << "the old policy stays";
}

// Used to stay alive off the bus with nothing logged: now it ends every binding as on SIGTERM
// and exits non-zero, so systemd restarts it.
TEST(UntrustedInput, LosingTheBusEndsEveryBindingAndExitsNonZero) {
    SKIP_UNLESS_ROOT();
    Sandbox sb(sim_policy);
    auto c = sb.client(); // kept connected: a holder that goes away ends its binding itself
    int fd = make_region(4096);
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5000"});
    close(fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    std::string id = g->id;
    sb.kill_bus();
    int status = sb.wait_daemon_exit(10000);
    ASSERT_NE(status, -1) << "the daemon stayed up without its bus";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
    EXPECT_NE(slurp(sb.dir() + "/daemon.log").find("lost the connection to the bus"),
              std::string::npos)
        << slurp(sb.dir() + "/daemon.log");
    EXPECT_EQ(sb.sql("SELECT end_reason FROM sessions WHERE id='" + id + "'"), "daemon-stop");
}
