// The pod methods' core (issue 51 item 8, issue 52 items 1-2), with no D-Bus: what RegisterPod
// decides (the fd is a network namespace and not the host's, the pod's keys, the knod.io/
// annotations split and sized, the policy's verdict on pod names exactly as written), and the
// CNI plugin's spool: entries carried out once, refused unless root's, and one pod whichever
// way its ADD arrives. Real network namespaces (a child process's), a real SQLite journal.
#include "daemon/pod_admission.h"
#include "protocol/pod_spool.h"
#include "tests/unit/manager_rig.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace knod;
using knod::testing::parse_or_fail;
using knod::testing::Rig;

namespace {

class FakeDriver : public driver::Driver {
  public:
    std::string name() const override { return "fake"; }
    driver::RegionKind region_kind() const override { return driver::RegionKind::memfd; }
    Result<driver::GpuInfo> gpu(const std::string &n) const override {
        if (n != "gpu0") return make_error(Errc::not_found, "no GPU " + n);
        return driver::GpuInfo{"gpu0", {"gpu0"}, 1 << 30, ""};
    }
    Result<driver::NetdevInfo> netdev(const std::string &n) const override {
        if (n != "nic0") return make_error(Errc::not_found, "no netdev " + n);
        return driver::NetdevInfo{"nic0", 4, ""};
    }
    std::vector<driver::GpuInfo> gpus() const override { return {*gpu("gpu0")}; }
    std::vector<driver::NetdevInfo> netdevs() const override { return {*netdev("nic0")}; }
    Result<std::vector<std::uint32_t>> attach(const driver::BindingPlan &) override {
        return std::vector<std::uint32_t>{1};
    }
    Result<void> activate(const std::string &) override { return {}; }
    void detach(const std::string &) override {}
    driver::Counters counters(const std::string &) const override { return {}; }
};

// A network namespace of its own, held by a child process until the end of the test.
struct Netns {
    pid_t pid = -1;
    int release = -1;
    std::string path;
    bool ok = false;
    Netns() {
        int ready[2], hold[2];
        if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return;
        pid = fork();
        if (pid == 0) {
            close(ready[0]);
            close(hold[1]); // else the child itself keeps the pipe open and never sees EOF
            char c = unshare(CLONE_NEWNET) == 0 || unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
            (void)!write(ready[1], &c, 1);
            (void)!read(hold[0], &c, 1); // until the test closes its end
            _exit(0);
        }
        close(ready[1]);
        close(hold[0]);
        release = hold[1];
        char c = 0;
        ok = read(ready[0], &c, 1) == 1 && c == 1;
        close(ready[0]);
        path = "/proc/" + std::to_string(pid) + "/ns/net";
    }
    ~Netns() {
        if (release >= 0) close(release);
        if (pid > 0) waitpid(pid, nullptr, 0);
    }
    UniqueFd open() const { return UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); }
    struct stat st() const {
        struct stat s {};
        ::stat(path.c_str(), &s);
        return s;
    }
};

const char *policy_text = R"(
[[rule]]
name = "named-pod"
k8s_pods = ["MyInference"]
netdevs = ["nic0"]
gpus = ["gpu0"]
max_region = "1MiB"
flows = ["udp * -> *:5000-5999"]
iommu = "any"
)";

daemon::PodRegistration registration(const Netns &ns, const std::string &container,
                                     const std::string &name, bool offload = true) {
    daemon::PodRegistration r;
    r.container_id = container;
    r.ifname = "eth0";
    r.netns = ns.open();
    r.pod = {{"namespace", "podman"}, {"name", name}, {"uid", "u-1"}, {"network", "pods"}};
    if (offload)
        r.annotations = {{"knod.io/flows", " udp 10.0.0.1:* -> 10.0.0.2:5001 ,\tudp * -> *:5002"},
                         {"knod.io/netdev", "nic0"},
                         {"knod.io/gpu", "gpu0"}};
    return r;
}

struct PodAdmissionTest : ::testing::Test {
    PodAdmissionTest() : rig("pod-admission") {}
    void SetUp() override {
        if (!ns.ok) GTEST_SKIP() << "no network namespace can be made here";
        manager = rig.manager(driver, parse_or_fail(policy_text));
        spool = rig.dir / "spool";
        std::filesystem::create_directory(spool);
        ::chmod(spool.c_str(), 0700);
        admission = std::make_unique<daemon::PodAdmission>(*manager, spool.string());
    }
    const daemon::PodSandbox *registered() const {
        auto st = ns.st();
        return manager->pods().by_netns({st.st_dev, st.st_ino});
    }
    void spool_entry(const std::string &name, const nlohmann::json &j) {
        std::ofstream(spool / name) << j.dump();
        ::chmod((spool / name).c_str(), 0640);
    }
    nlohmann::json add_entry(const std::string &container, const std::string &name) {
        auto st = ns.st();
        return {{"op", "add"},
                {"container_id", container},
                {"ifname", "eth0"},
                {"netns", ns.path},
                {"netns_dev", static_cast<std::uint64_t>(st.st_dev)},
                {"netns_ino", static_cast<std::uint64_t>(st.st_ino)},
                {"pod", {{"namespace", "podman"}, {"name", name}}},
                {"annotations", nlohmann::json::object()},
                {"delivered", "unknown"}};
    }

    Rig rig;
    FakeDriver driver;
    Netns ns;
    std::unique_ptr<daemon::BindingManager> manager;
    std::filesystem::path spool;
    std::unique_ptr<daemon::PodAdmission> admission;
};

} // namespace

TEST(PodOffload, SplitsFlowsAndSizesTheRegion) {
    auto none = daemon::pod_offload_of({{"knod.io/profile", "rx"}});
    ASSERT_TRUE(none);
    EXPECT_FALSE(*none) << "no knod.io/flows: the pod asks for nothing";
    auto o = daemon::pod_offload_of({{"knod.io/flows", " udp * -> *:1 ,, udp * -> *:2\n"},
                                     {"knod.io/region", "64MiB"},
                                     {"knod.io/netdev", "nic0"}});
    ASSERT_TRUE(o && *o);
    EXPECT_EQ((*o)->flows, (std::vector<std::string>{"udp * -> *:1", "udp * -> *:2"}));
    EXPECT_EQ((*o)->region_bytes, 64u << 20);
    EXPECT_EQ((*o)->netdev, "nic0");
    auto dflt = daemon::pod_offload_of({{"knod.io/flows", "udp * -> *:1"}});
    EXPECT_EQ((*dflt)->region_bytes, 4096u) << "4 KiB unless the pod says";
    auto bad =
        daemon::pod_offload_of({{"knod.io/flows", "udp * -> *:1"}, {"knod.io/region", "lots\x1b"}});
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code, Errc::invalid_argument);
    EXPECT_NE(bad.error().message.find("knod.io/region: a size like 64MiB"), std::string::npos);
    EXPECT_EQ(bad.error().message.find('\x1b'), std::string::npos) << bad.error().message;
}

// A podman-named pod is registered, and a rule naming it matches exactly: `MyInference`, not
// `myinference`.
TEST_F(PodAdmissionTest, RegistersAPodmanNamedPodAndRulesMatchItsNameExactly) {
    auto lower = admission->register_pod(registration(ns, "c-lower", "myinference"));
    ASSERT_FALSE(lower);
    EXPECT_EQ(lower.error().code, Errc::denied);
    EXPECT_NE(lower.error().message.find("podman/myinference"), std::string::npos)
        << lower.error().message;
    EXPECT_EQ(registered(), nullptr) << "a refused pod is not registered";
    ASSERT_TRUE(admission->register_pod(registration(ns, "c-named", "MyInference")));
    ASSERT_NE(registered(), nullptr);
    EXPECT_EQ(registered()->pod.name, "MyInference");
    EXPECT_EQ(registered()->network, "pods");
    EXPECT_EQ(registered()->pod.uid, "u-1");
    ASSERT_TRUE(admission->register_pod(registration(ns, "c-named", "MyInference")))
        << "the same ADD again (a late call after its spooled twin) is the same pod";
    EXPECT_EQ(manager->pods().size(), 1u);
    EXPECT_EQ(admission->unregister_pod("c-named", "eth0"), 0u);
    EXPECT_EQ(registered(), nullptr);
}

// The errors RegisterPod gave before its policy work moved here, word for word.
TEST_F(PodAdmissionTest, RefusesWhatIsNoSandboxWithTheSameErrors) {
    auto message = [&](daemon::PodRegistration r) {
        auto out = admission->register_pod(std::move(r));
        EXPECT_FALSE(out);
        EXPECT_EQ(out ? Errc::io : out.error().code, Errc::invalid_argument);
        return out ? std::string() : out.error().message;
    };
    auto host = registration(ns, "c1", "MyInference");
    host.netns = UniqueFd(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    EXPECT_NE(message(std::move(host)).find("that is the host's network namespace"),
              std::string::npos);
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    close(p[1]);
    auto pipe_fd = registration(ns, "c1", "MyInference");
    pipe_fd.netns = UniqueFd(p[0]);
    EXPECT_NE(message(std::move(pipe_fd)).find("the fd is not a network namespace"),
              std::string::npos);
    auto key = registration(ns, "c1", "MyInference");
    key.pod["colour"] = "red";
    EXPECT_NE(message(std::move(key))
                  .find("pod: keys are namespace, name, uid and network, not "
                        "'colour'"),
              std::string::npos);
    auto region = registration(ns, "c1", "MyInference");
    region.annotations["knod.io/region"] = "huge";
    EXPECT_NE(message(std::move(region)).find("region: a size like 64MiB, not 'huge'"),
              std::string::npos);
    auto name = registration(ns, "c1", "bad name", false);
    EXPECT_NE(message(std::move(name)).find("pod name 'bad name'"), std::string::npos);
    EXPECT_EQ(manager->pods().size(), 0u);
}

// What knod-cni spooled while the daemon did not answer is carried out once, and a direct call
// drops what it supersedes.
TEST_F(PodAdmissionTest, CarriesOutTheSpoolOnceAndOnlyRootsEntries) {
    if (geteuid() != 0) GTEST_SKIP() << "the spool is root's";
    auto name = *pod_spool::entry_name("c-spooled", "eth0");
    spool_entry(name, add_entry("c-spooled", "nifty_pasteur"));
    auto pass = admission->consume_spool();
    EXPECT_EQ(pass.registered, 1u);
    ASSERT_NE(registered(), nullptr) << "the pod started while no daemon answered is that pod";
    EXPECT_EQ(registered()->pod.name, "nifty_pasteur");
    EXPECT_FALSE(std::filesystem::exists(spool / name)) << "carried out once";
    EXPECT_EQ(admission->consume_spool().registered, 0u);

    spool_entry(name, {{"op", "del"}, {"container_id", "c-spooled"}, {"ifname", "eth0"}});
    EXPECT_EQ(admission->consume_spool().deleted, 1u);
    EXPECT_EQ(registered(), nullptr) << "a DEL spooled while the daemon hung";

    // A direct DEL drops the ADD spooled for the same attachment: it is the newer word.
    spool_entry(name, add_entry("c-spooled", "nifty_pasteur"));
    admission->unregister_pod("c-spooled", "eth0");
    EXPECT_FALSE(std::filesystem::exists(spool / name));
    EXPECT_EQ(admission->consume_spool().registered, 0u);

    // Refused, and removed: another account's file, one whose namespace is no longer the one
    // the plugin saw, and one whose name is not its attachment.
    spool_entry(name, add_entry("c-spooled", "nifty_pasteur"));
    ASSERT_EQ(::chown((spool / name).c_str(), 65534, 65534), 0);
    auto stale = add_entry("c-stale", "x");
    stale["netns_ino"] = 1;
    spool_entry(*pod_spool::entry_name("c-stale", "eth0"), stale);
    spool_entry("other@eth0", add_entry("c-spooled", "x"));
    pass = admission->consume_spool();
    EXPECT_EQ(pass.registered, 0u);
    EXPECT_EQ(pass.refused, 3u);
    EXPECT_EQ(registered(), nullptr);
    EXPECT_TRUE(std::filesystem::is_empty(spool));

    // A directory others may write is not read at all.
    spool_entry(name, add_entry("c-spooled", "nifty_pasteur"));
    ::chmod(spool.c_str(), 0733);
    EXPECT_EQ(admission->consume_spool().registered, 0u);
    EXPECT_TRUE(std::filesystem::exists(spool / name)) << "untouched";
    ::chmod(spool.c_str(), 0700);
    EXPECT_EQ(admission->consume_spool().registered, 1u);
}
