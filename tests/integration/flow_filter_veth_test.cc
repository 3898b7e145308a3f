// The flow filter on a real veth pair whose far end lives in a network namespace made by the
// test: real UDP from sockets, counters read back, and nothing left behind.
#include "bpf/flow_filter.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

using namespace knod;
namespace fs = std::filesystem;

namespace {

int sh(const std::string &cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str());
}

// A veth pair: `host` here, `peer` inside namespace `ns`. Removed in the destructor, even when
// the test failed half way.
struct VethPair {
    std::string ns, host, peer;
    bool ok = false;
    VethPair() {
        std::string id = std::to_string(getpid());
        ns = "knodt" + id;
        host = "kth" + id;
        peer = "ktp" + id;
        ok = sh("ip netns add " + ns) == 0 &&
             sh("ip link add " + host + " type veth peer name " + peer) == 0 &&
             sh("ip link set " + peer + " netns " + ns) == 0 &&
             sh("ip addr add 10.77.0.1/24 dev " + host) == 0 &&
             sh("ip link set " + host + " up") == 0 &&
             sh("ip -n " + ns + " addr add 10.77.0.2/24 dev " + peer) == 0 &&
             sh("ip -n " + ns + " link set " + peer + " up") == 0 &&
             sh("ip -n " + ns + " link set lo up") == 0;
    }
    ~VethPair() {
        sh("ip link del " + host);
        sh("ip netns del " + ns);
    }
    int ifindex() const { return static_cast<int>(if_nametoindex(host.c_str())); }
};

// Sends `count` UDP datagrams from inside the namespace to 10.77.0.1:port.
bool send_from_namespace(const std::string &ns, std::uint16_t port, int count) {
    pid_t pid = fork();
    if (pid == 0) {
        int nsfd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) _exit(1);
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        inet_pton(AF_INET, "10.77.0.1", &to.sin_addr);
        const char payload[] = "knod-test-payload";
        for (int i = 0; i < count; ++i)
            if (sendto(s, payload, sizeof payload, 0, reinterpret_cast<sockaddr *>(&to),
                       sizeof to) < 0)
                _exit(2);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

__u32 attached_program(int ifindex) {
    __u32 id = 0;
    bpf_xdp_query_id(ifindex, 0, &id);
    return id;
}

class FlowFilterVeth : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
        veth_ = std::make_unique<VethPair>();
        ASSERT_TRUE(veth_->ok) << "could not build the veth pair";
        options_.pin_root = "/sys/fs/bpf/knodtest" + std::to_string(getpid());
    }
    void TearDown() override {
        veth_.reset();
        std::error_code ec;
        fs::remove_all(options_.pin_root, ec);
    }
    std::unique_ptr<VethPair> veth_;
    bpf::FilterOptions options_;
};

} // namespace

TEST_F(FlowFilterVeth, CountsTheAllowedFlowOnlyAndLeavesNothingBehind) {
    int ifindex = veth_->ifindex();
    std::string pin_dir;
    {
        auto f = bpf::FlowFilter::attach(veth_->host, options_);
        ASSERT_TRUE(f.ok()) << f.error().message;
        auto &filter = **f;
        pin_dir = filter.pin_dir();
        EXPECT_NE(attached_program(ifindex), 0u);
        EXPECT_TRUE(fs::exists(pin_dir + "/link"));
        EXPECT_TRUE(fs::exists(pin_dir + "/counters"));
        ASSERT_TRUE(filter.set_slot(1, bpf::SlotState::active, 0).ok());
        ASSERT_TRUE(
            filter.set_flows(1, {*policy::parse_flow_spec("udp 10.77.0.2:* -> 10.77.0.1:6000")})
                .ok());

        ASSERT_TRUE(send_from_namespace(veth_->ns, 6000, 5));
        ASSERT_TRUE(send_from_namespace(veth_->ns, 6001, 7));
        bpf::SlotCounters c = filter.counters(1);
        EXPECT_EQ(c.packets, 5u) << "only the allowed flow is counted";
        EXPECT_EQ(c.bytes, 5u * (14 + 20 + 8 + 18));
        EXPECT_GE(filter.stats().passed, 7u) << "the other flow went to the stack";
        EXPECT_EQ(filter.counters(2).packets, 0u);

        // A second filter on the same interface is refused; the first stays.
        auto second = bpf::FlowFilter::attach(veth_->host, options_);
        ASSERT_FALSE(second.ok());
        EXPECT_NE(second.error().message.find("already has an XDP program"), std::string::npos);
    }
    EXPECT_EQ(attached_program(ifindex), 0u) << "detach leaves no program";
    EXPECT_FALSE(fs::exists(pin_dir)) << "and no pinned object";
}

TEST_F(FlowFilterVeth, ReconcileRemovesWhatACrashLeftPinned) {
    int ifindex = veth_->ifindex();
    pid_t pid = fork();
    if (pid == 0) {
        auto f = bpf::FlowFilter::attach(veth_->host, options_);
        _exit(f.ok() ? 0 : 1); // no destructor runs: the pins keep the program attached
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_NE(attached_program(ifindex), 0u) << "the pinned link outlived its process";
    auto removed = bpf::FlowFilter::reconcile(options_.pin_root, {});
    ASSERT_TRUE(removed.ok()) << removed.error().message;
    ASSERT_EQ(removed->size(), 1u);
    EXPECT_EQ((*removed)[0], veth_->host);
    EXPECT_EQ(attached_program(ifindex), 0u);
    EXPECT_FALSE(fs::exists(options_.pin_root + "/" + veth_->host));
}

TEST_F(FlowFilterVeth, NeverReplacesAForeignProgram) {
    // Another XDP program (the same object, loaded outside the loader) already sits there.
    auto foreign = bpf::FlowFilter::load();
    ASSERT_TRUE(foreign.ok());
    int ifindex = veth_->ifindex();
    ASSERT_EQ(bpf_xdp_attach(ifindex, (*foreign)->program_fd(), 0, nullptr), 0);
    __u32 before = attached_program(ifindex);
    auto f = bpf::FlowFilter::attach(veth_->host, options_);
    EXPECT_FALSE(f.ok());
    EXPECT_EQ(attached_program(ifindex), before);
    bpf_xdp_detach(ifindex, 0, nullptr);
}

// The devmem guard on a veth (issue 18): attached on tc ingress (clsact) with no XDP program,
// its maps pinned, gone with the object. veth records no RX queue for most packets (no NAPI
// without XDP or GRO, so queue_mapping stays 0 at ingress): such packets are the stack's and
// pass untouched, which is what the guard must do with a packet whose queue it cannot know. The
// per-queue decisions are the BPF_PROG_TEST_RUN table's (tests/unit/devmem_guard_test.cc).
TEST_F(FlowFilterVeth, DevmemGuardAttachesOnTcIngressAndLeavesNothingBehind) {
    int ifindex = veth_->ifindex();
    std::string pin_dir;
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(6000);
    inet_pton(AF_INET, "10.77.0.1", &at.sin_addr);
    ASSERT_EQ(bind(udp, reinterpret_cast<sockaddr *>(&at), sizeof at), 0);
    {
        auto f = bpf::FlowFilter::attach_guard(veth_->host, options_);
        ASSERT_TRUE(f.ok()) << f.error().message;
        auto &guard = **f;
        pin_dir = guard.pin_dir();
        EXPECT_EQ(guard.mode(), "tc");
        EXPECT_EQ(attached_program(ifindex), 0u) << "no XDP: bind-rx would refuse it";
        EXPECT_TRUE(bpf::FlowFilter::guard_attached(veth_->host));
        EXPECT_TRUE(fs::exists(pin_dir + "/bound_queues"));
        // Only the guard was loaded (issue 50): an XDP program or AF_XDP map the kernel refuses
        // cannot take the devmem guard down with it.
        EXPECT_GE(guard.guard_program_fd(), 0);
        EXPECT_LT(guard.program_fd(), 0) << "the XDP filter was loaded with the guard";
        EXPECT_LT(guard.steer_program_fd(), 0) << "the sim's steering was loaded with the guard";
        EXPECT_LT(guard.xsks_fd(), 0) << "the AF_XDP socket map was made for the guard";
        EXPECT_FALSE(fs::exists(pin_dir + "/xsks"));
        ASSERT_TRUE(guard.set_slot(1, bpf::SlotState::active, 3).ok());
        ASSERT_TRUE(
            guard.set_flows(1, {*policy::parse_flow_spec("tcp 10.77.0.2:* -> 10.77.0.1:6000")})
                .ok());
        ASSERT_TRUE(send_from_namespace(veth_->ns, 6000, 3));
        char buf[64];
        int got = 0;
        while (recv(udp, buf, sizeof buf, 0) > 0)
            ++got;
        bpf::SlotCounters c = guard.counters(1);
        // Whatever veth recorded, every datagram is either received or counted as misrouted.
        EXPECT_EQ(static_cast<std::uint64_t>(got) + c.misrouted, 3u);
        EXPECT_EQ(c.packets, 0u) << "UDP is never the binding's";
        // A second guard on the same interface is refused (its pins are there).
        auto second = bpf::FlowFilter::attach_guard(veth_->host, options_);
        EXPECT_FALSE(second.ok());
    }
    close(udp);
    EXPECT_FALSE(bpf::FlowFilter::guard_attached(veth_->host)) << "the guard left the interface";
    EXPECT_FALSE(fs::exists(pin_dir));
}

// #17 item 10: a pin root the daemon cannot search (bpffs dir of another user, root without
// CAP_DAC_OVERRIDE, as under the sim drop-in) is an error the caller gets, never an uncaught
// filesystem_error that aborts the daemon.
TEST_F(FlowFilterVeth, AnUnsearchablePinRootIsAnErrorNotAnException) {
    std::string root = "/sys/fs/bpf/knod-t-unsearchable-" + std::to_string(getpid());
    ASSERT_EQ(mkdir(root.c_str(), 0700), 0) << root;
    ASSERT_EQ(chown(root.c_str(), 65534, 65534), 0);
    pid_t pid = fork();
    if (pid == 0) {
        // Root without the capabilities that override file modes.
        __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct d[2]{};
        if (syscall(SYS_capget, &h, d) != 0) _exit(10);
        d[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
        if (syscall(SYS_capset, &h, d) != 0) _exit(11);
        try {
            bpf::FilterOptions o = options_;
            o.pin_root = root;
            auto f = bpf::FlowFilter::attach(veth_->host, o);
            if (f.ok()) _exit(1);
            _exit(f.error().message.find("Permission denied") != std::string::npos ? 0 : 2);
        } catch (...) {
            _exit(3);
        }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    rmdir(root.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << "the loader ended on a signal";
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "1: attached anyway, 2: another error, 3: an exception escaped";
    EXPECT_EQ(attached_program(veth_->ifindex()), 0u);
}

// A pin root that is itself a bpffs mount under a directory of another file system (the shipped
// unit bind-mounts /sys/fs/bpf/knod at /run/knod-policy/bpf): used as it is, nothing mounted on
// its parent.
TEST_F(FlowFilterVeth, APinRootOnItsOwnBpffsMountIsUsedAsItIs) {
    std::string parent = "/run/knod-t-pinroot-" + std::to_string(getpid());
    std::string root = parent + "/bpf";
    ASSERT_TRUE(fs::create_directories(root));
    ASSERT_EQ(mount("bpf", root.c_str(), "bpf", 0, "mode=0700"), 0) << std::strerror(errno);
    {
        bpf::FilterOptions o = options_;
        o.pin_root = root;
        auto f = bpf::FlowFilter::attach_guard(veth_->host, o);
        EXPECT_TRUE(f.ok()) << f.error().message;
        struct statfs st {};
        ASSERT_EQ(statfs(parent.c_str(), &st), 0);
        EXPECT_NE(st.f_type, BPF_FS_MAGIC) << "nothing was mounted over the pin root's parent";
        if (f.ok()) {
            EXPECT_TRUE(fs::exists(root + "/" + veth_->host + "/bound_queues"));
        }
    }
    umount2(root.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(parent, ec);
}
