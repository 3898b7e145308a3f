// The daemon with a hardware backend chosen by --driver=auto on a copy of a fixture machine:
// it picks knod and says why, the host report carries the machine's checks, and a request with
// a memfd (not a dma-buf) is refused before anything reaches the KNOD module. No dma-buf source
// exists on these VMs (no GPU, no udmabuf, no dma-heaps), so grants are tested on the sim.
#include "tests/integration/sandbox.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

struct FixtureCopy {
    explicit FixtureCopy(const std::string &name)
        : root(fs::temp_directory_path() / ("knod-host-" + name + "-" + std::to_string(getpid()))) {
        fs::remove_all(root);
        fs::copy(KNOD_SOURCE_DIR "/tests/data/hosts/" + name, root,
                 fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    }
    ~FixtureCopy() { fs::remove_all(root); }
    std::vector<std::string> args(const std::string &driver) const {
        return {"--driver=" + driver, "--sysfs-root=" + (root / "sys").string(),
                "--proc-root=" + (root / "proc").string(),
                "--boot-root=" + (root / "boot").string(),
                "--rocm-root=" + (root / "opt/rocm").string()};
    }
    fs::path root;
};

const char *policy = R"([[rule]]
name = "mi250x"
any_caller = true
netdevs = ["eth2"]
gpus = ["0000:03:00.0"]
max_region = "1GiB"
flows = ["udp 10.20.0.0/16:* -> 10.20.1.10:5000"]
)";

} // namespace

TEST(HardwareDriver, AutoPicksKnodAndTheHostReportCarriesTheMachine) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    FixtureCopy host("mi250x-cx6");
    Sandbox sb(policy, host.args("auto"));
    auto c = sb.client();
    auto st = c.status();
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->driver, "knod");
    EXPECT_NE(slurp(sb.dir() + "/daemon.log").find("driver auto: knod (knod: 1 device(s)"),
              std::string::npos);

    auto report = c.host_report();
    ASSERT_TRUE(report.ok()) << report.error().message;
    auto j = nlohmann::json::parse(*report);
    EXPECT_EQ(j["driver"], "knod");
    EXPECT_EQ(j["netdevs"][0]["name"], "eth2");
    EXPECT_EQ(j["gpus"][0]["names"][1], "/dev/dri/renderD128");
    EXPECT_EQ(j["host"]["result"], "pass") << j["host"].dump(2);
    bool acs = false;
    for (auto &check : j["host"]["checks"])
        if (check["id"] == "pair.acs" && check["status"] == "pass") acs = true;
    EXPECT_TRUE(acs) << j["host"].dump(2);
}

TEST(HardwareDriver, AMemfdIsNoRegionForKnodAndNothingReachesTheModule) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    FixtureCopy host("mi250x-cx6");
    Sandbox sb(policy, host.args("knod"));
    auto c = sb.client();
    int fd = make_region(4096);
    auto g = c.request_binding("eth2", "0000:03:00.0", "rx-only", fd, 0, 4096,
                               {"udp 10.20.0.1:* -> 10.20.1.10:5000"});
    close(fd);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("InvalidArgument"), std::string::npos) << g.error().message;
    EXPECT_NE(g.error().message.find("the knod driver needs a dma-buf"), std::string::npos)
        << g.error().message;
    EXPECT_EQ(slurp((host.root / "sys/class/knod/knod0/bind").string()), "");
    EXPECT_EQ(sb.sql("SELECT count(*) FROM sessions"), "0");

    auto unknown = c.request_binding("eth3", "0000:03:00.0", "rx-only", -1, 0, 4096,
                                     {"udp 10.20.0.1:* -> 10.20.1.10:5000"});
    ASSERT_FALSE(unknown.ok());
}

// #17 item 8: a host with no KNOD device and no devmem NIC. auto fell back to the sim, which the
// hardened unit cannot run (restart loop); now it starts with no data path, serves status and
// the host report, and refuses each request with DriverFailure saying why, journaled.
TEST(HardwareDriver, AutoOnAHostWithNothingToDriveServesAndRefusesBindings) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    FixtureCopy host("no-iommu");
    Sandbox sb(policy, host.args("auto"));
    auto c = sb.client();
    auto st = c.status();
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->driver, "none");
    std::string log = slurp(sb.dir() + "/daemon.log");
    EXPECT_NE(log.find("driver auto: none (no KNOD device"), std::string::npos) << log;
    EXPECT_NE(log.find("no NIC's driver supports devmem TCP (gve, bnxt_en, mlx5_core, fbnic)"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("using the sim"), std::string::npos) << log;
    EXPECT_TRUE(c.host_report().ok());

    int fd = make_region(4096);
    auto g = c.request_binding("eth2", "0000:03:00.0", "rx-only", fd, 0, 4096,
                               {"udp 10.20.0.1:* -> 10.20.1.10:5000"});
    close(fd);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("DriverFailure"), std::string::npos) << g.error().message;
    EXPECT_NE(g.error().message.find("no KNOD or devmem-capable NIC on this host"),
              std::string::npos)
        << g.error().message;
    EXPECT_TRUE(eventually([&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind = 'request-denied' AND decision = "
                      "'driver-failure' AND reason LIKE 'no KNOD or devmem-capable NIC%'") == "1";
    })) << "the refusal is journaled";
    EXPECT_EQ(sb.sql("SELECT count(*) FROM sessions"), "0");
}
