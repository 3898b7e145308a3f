// The daemon keeps its promises under races and neighbours (issue 15): grants in flight follow
// their caller, a locked journal never stalls the loop, a second daemon leaves the first alone,
// back-to-back sessions reuse queues, a vanished NIC gets no grants.
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

const char *flow = "udp 10.99.0.1:* -> 10.99.0.2:5000";

std::string unique(const char *stem) {
    return stem + std::to_string(getpid() % 100000);
}

// Runs knod-policyd with `args` to its end (it is expected to refuse to start); returns its
// wait status and what it printed.
Output run_daemon(const std::vector<std::string> &args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return {};
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        std::vector<char *> argv{const_cast<char *>(KNOD_DAEMON_BIN)};
        for (auto &a : args)
            argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        execv(KNOD_DAEMON_BIN, argv.data());
        _exit(127);
    }
    close(out[1]);
    Output o;
    o.out = read_all(out[0]);
    close(out[0]);
    waitpid(pid, &o.status, 0);
    return o;
}

void ip(const std::vector<std::string> &args) {
    pid_t pid = fork();
    if (pid == 0) {
        std::vector<char *> argv{const_cast<char *>("ip")};
        for (auto &a : args)
            argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        execvp("ip", argv.data());
        _exit(127);
    }
    waitpid(pid, nullptr, 0);
}

class DatapathFixture : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
        netdev_ = unique("knodsimr");
        netns_ = unique("knod-rbt");
        pin_root_ = "/sys/fs/bpf/" + unique("knodrb");
        sandbox_ = std::make_unique<Sandbox>(sim_policy, daemon_args());
    }
    void TearDown() override {
        sandbox_.reset();
        if (netdev_.empty()) return;
        EXPECT_FALSE(fs::exists("/sys/class/net/" + netdev_)) << "link left behind";
        EXPECT_FALSE(fs::exists("/run/netns/" + netns_)) << "namespace left behind";
        EXPECT_FALSE(fs::exists(pin_root_)) << "pinned objects left behind";
    }
    std::vector<std::string> daemon_args() const {
        return {"--sim-datapath=true", "--sim-netdev", netdev_,        "--sim-netns", netns_,
                "--bpf-pin-root",      pin_root_,      "--rate-limit", "100000"};
    }
    Result<client::GrantedBinding> request(client::Client &c, int fd) {
        return c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096, {flow});
    }
    // UDP from the wire side; returns whether sim-send succeeded.
    bool send(const std::string &data) { return send_to(5000, data); }
    bool send_to(int port, const std::string &data) {
        std::string to = "10.99.0.2:" + std::to_string(port);
        pid_t pid = fork();
        if (pid == 0) {
            execl(KNOD_CLI_BIN, KNOD_CLI_BIN, "sim-send", "--netns", netns_.c_str(), "--to",
                  to.c_str(), "--count", "1", "--data", data.c_str(), nullptr);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }

    std::string netdev_, netns_, pin_root_;
    std::unique_ptr<Sandbox> sandbox_;
};

using BackToBack = DatapathFixture;
using SecondDaemon = DatapathFixture;
using VanishedNic = DatapathFixture;

} // namespace

// Item 4: a queue reused right after the previous socket on it closed must not fail (EBUSY),
// whether the previous binding was released or revoked.
TEST_F(BackToBack, TwentySessionsInARowAllActivate) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    for (int i = 0; i < 20; ++i) {
        auto g = request(c, fd);
        ASSERT_TRUE(g.ok()) << "run " << i << ": " << g.error().message;
        auto a = c.activate(g->id, g->key);
        ASSERT_TRUE(a.ok()) << "run " << i << ": " << a.error().message;
        if (i % 2)
            ASSERT_TRUE(c.release(g->id).ok());
        else
            ASSERT_TRUE(c.revoke(g->id, "test churn").ok());
    }
    // The last session still receives: the reused socket works.
    auto g = request(c, fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    ASSERT_TRUE(send("after-churn"));
    EXPECT_TRUE(c.wait_for_data(g->id, 0, 3000).ok());
    close(fd);
}

// Item 3: a second daemon, started by mistake with the same state dir, bus and sim names, or
// on another bus with the same sim names, exits with a clear message and the first one keeps
// its network, filter, pins and binding.
TEST_F(SecondDaemon, LeavesTheFirstOneAlone) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = request(c, fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());

    std::vector<std::string> same = {"--bus-address=" + sandbox_->address(),
                                     "--policy",
                                     sandbox_->policy_file(),
                                     "--state-dir",
                                     sandbox_->state_dir(),
                                     "--driver=sim"};
    auto args = daemon_args();
    same.insert(same.end(), args.begin(), args.end());
    Output o = run_daemon(same);
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.out;
    EXPECT_NE(o.out.find("another knod-policyd"), std::string::npos) << o.out;

    // Another bus and state dir, the same sim names.
    std::string other_state = sandbox_->dir() + "/state2";
    std::vector<std::string> other = {"--bus-address=unix:path=" + sandbox_->dir() + "/no-bus",
                                      "--policy",
                                      sandbox_->policy_file(),
                                      "--state-dir",
                                      other_state,
                                      "--driver=sim"};
    other.insert(other.end(), args.begin(), args.end());
    o = run_daemon(other);
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.out;

    // Another netdev under the same pin root: it may run, and must not touch our pins.
    std::string netdev2 = unique("knodsimq"), netns2 = unique("knod-rct");
    Sandbox neighbour(sim_policy, {"--sim-datapath=true", "--sim-netdev", netdev2, "--sim-netns",
                                   netns2, "--bpf-pin-root", pin_root_});

    EXPECT_TRUE(fs::exists("/sys/class/net/" + netdev_));
    EXPECT_TRUE(fs::exists(pin_root_ + "/" + netdev_ + "/link")) << "our pins were removed";
    EXPECT_TRUE(fs::exists(pin_root_ + "/" + netdev2 + "/link"));
    ASSERT_TRUE(send("still-mine"));
    auto rx = c.wait_for_data(g->id, 0, 3000);
    EXPECT_TRUE(rx.ok()) << "the first daemon no longer delivers";
    close(fd);
}

// Item 6: after the NIC is deleted, requests are refused at once and the ended bindings are
// recorded as removed, not down.
TEST_F(VanishedNic, RefusedAndRecordedAsRemoved) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = request(c, fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ip({"link", "del", netdev_});
    ASSERT_TRUE(eventually([&] { return c.list()->empty(); }));
    // The binding leaves the list before the journal's writer commits its end: wait for it.
    auto end_reason = [&] {
        return sandbox_->sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'");
    };
    EXPECT_TRUE(eventually([&] { return end_reason() == "link-removed"; })) << end_reason();
    auto again = request(c, fd);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().code, Errc::invalid_argument) << again.error().message;
    EXPECT_NE(again.error().message.find(netdev_), std::string::npos);
    EXPECT_EQ(sandbox_->sql("SELECT count(*) FROM sessions"), "1") << "nothing more was granted";
    close(fd);
}

namespace {

class ControlPlane : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
        sandbox_ = std::make_unique<Sandbox>(sim_policy);
    }
    std::unique_ptr<Sandbox> sandbox_;
};

sd_bus *open_bus(const std::string &address) {
    sd_bus *bus = nullptr;
    if (sd_bus_new(&bus) < 0) return nullptr;
    sd_bus_set_address(bus, address.c_str());
    sd_bus_set_bus_client(bus, 1);
    if (sd_bus_start(bus) < 0) {
        sd_bus_unref(bus);
        return nullptr;
    }
    return bus;
}

// A RequestBinding for `flow` on the default sim names, built by hand (the tests below send it
// and then leave, or call it with a short timeout). Null when sd-bus could not build it.
sd_bus_message *request_message(sd_bus *bus, int region_fd) {
    sd_bus_message *m = nullptr;
    const char *flows[] = {flow, nullptr};
    if (sd_bus_message_new_method_call(bus, &m, "org.knod.Policy1", "/org/knod/Policy1",
                                       "org.knod.Policy1.Manager", "RequestBinding") < 0)
        return nullptr;
    if (sd_bus_message_append(m, "ssshtt", "knodsim0", "sim0", "rx-only", region_fd,
                              std::uint64_t{0}, std::uint64_t{4096}) < 0 ||
        sd_bus_message_append_strv(m, const_cast<char **>(flows)) < 0)
        return sd_bus_message_unref(m);
    return m;
}

} // namespace

// Item 1: a caller that sends RequestBinding and closes its connection before the reply leaves
// no binding behind; its quota and flow are free for its retry at once.
TEST_F(ControlPlane, DisconnectDuringGrantLeavesNoOrphan) {
    auto watcher = sandbox_->client();
    for (int i = 0; i < 10; ++i) {
        sd_bus *bus = open_bus(sandbox_->address());
        ASSERT_NE(bus, nullptr);
        // One call first, so the daemon already knows this connection's credentials.
        sd_bus_error error = SD_BUS_ERROR_NULL;
        sd_bus_message *reply = nullptr;
        ASSERT_GE(sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                     "org.knod.Policy1.Manager", "ListBindings", &error, &reply,
                                     ""),
                  0);
        sd_bus_message_unref(reply);
        sd_bus_error_free(&error);
        int fd = make_region(4096);
        sd_bus_message *m = request_message(bus, fd);
        ASSERT_NE(m, nullptr);
        ASSERT_GE(sd_bus_send(bus, m, nullptr), 0);
        sd_bus_message_unref(m);
        sd_bus_flush_close_unref(bus); // gone before the reply
        close(fd);

        // The grant, if it happened, ends as a disconnect; nothing stays live.
        ASSERT_TRUE(eventually([&] {
            auto l = watcher.list();
            return l.ok() && l->empty();
        })) << "run "
            << i << ": an orphan binding stayed";
        ASSERT_TRUE(eventually([&] {
            return sandbox_->sql("SELECT count(*) FROM sessions WHERE end_reason IS NULL") == "0";
        })) << "run "
            << i << ": a session stayed open in the journal";
        // The same flow is free for the retry at once.
        int fd2 = make_region(4096);
        auto g = watcher.request_binding("knodsim0", "sim0", "rx-only", fd2, 0, 4096, {flow});
        close(fd2);
        ASSERT_TRUE(g.ok()) << "run " << i << ": " << g.error().message;
        ASSERT_TRUE(watcher.release(g->id).ok());
    }
    auto ended = sandbox_->sql("SELECT count(*) FROM sessions WHERE end_reason='disconnect'");
    EXPECT_EQ(ended, sandbox_->sql("SELECT count(*) FROM sessions WHERE end_reason<>'release'"));
}

// Item 2: another process holding the journal's write lock never stalls the bus interface:
// property reads keep answering within a short call timeout, grants are refused with
// JournalUnavailable, and the daemon recovers by itself once the lock goes.
TEST_F(ControlPlane, LockedJournalNeverStallsTheLoop) {
    auto c = sandbox_->client();
    ASSERT_TRUE(eventually([&] { return c.status()->journal_available; }));
    JournalLock lock(*sandbox_);
    ASSERT_TRUE(lock.held()) << lock.output();

    sd_bus *bus = open_bus(sandbox_->address());
    ASSERT_NE(bus, nullptr);
    // Every call below must be answered within this; the journal's busy timeout is 5 s.
    sd_bus_set_method_call_timeout(bus, 2'000'000);
    auto read_count = [&] {
        sd_bus_error error = SD_BUS_ERROR_NULL;
        std::uint32_t n = 0;
        int r = sd_bus_get_property_trivial(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                            "org.knod.Policy1.Manager", "BindingCount", &error, 'u',
                                            &n);
        sd_bus_error_free(&error);
        return r;
    };
    // A refusal's record meets the lock and is kept for a retry (the retry used to run on the
    // loop, waiting out the busy timeout at every tick).
    int fd = make_region(4096);
    auto denied = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                                    {"udp 10.99.0.1:* -> 10.99.0.2:7000"});
    ASSERT_FALSE(denied.ok());
    EXPECT_EQ(denied.error().code, Errc::denied);
    // A grant meets the lock on the writer thread (its reply waits, the loop does not).
    std::thread grant([&] {
        auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
        EXPECT_FALSE(g.ok());
        if (!g.ok()) {
            EXPECT_EQ(g.error().code, Errc::journal_unavailable) << g.error().message;
        }
    });
    for (int i = 0; i < 40; ++i) { // about 8 s of reads, through the busy timeouts
        ASSERT_GE(read_count(), 0) << "read " << i << " stalled behind the journal";
        usleep(200000);
    }
    grant.join();
    lock.release();
    // Recovered by itself: a grant succeeds again.
    EXPECT_TRUE(eventually(
        [&] {
            auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
            if (g.ok()) (void)c.release(g->id);
            return g.ok();
        },
        15000));
    close(fd);
    sd_bus_flush_close_unref(bus);
}

// Item 7: a holder renews its key before it expires and the binding outlives the first
// lifetime; a wrong key or another process cannot renew; a revoked binding cannot be renewed.
TEST(Renew, ExtendsALiveBindingOnlyForItsHolder) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    Sandbox sb(R"([[rule]]
name = "short"
any_caller = true
netdevs = ["knodsim*"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
key_lifetime = "3s"
)");
    auto c = sb.client();
    int fd = make_region(4096);
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    auto wrong = g->key;
    wrong[0] ^= 1;
    auto refused = c.renew(g->id, wrong);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::denied);
    // Renewed every second, it outlives its 3 s lifetime.
    std::uint64_t last = 0;
    for (int i = 0; i < 5; ++i) {
        auto until = c.renew(g->id, g->key);
        ASSERT_TRUE(until.ok()) << until.error().message;
        EXPECT_GE(*until, last);
        last = *until;
        sleep(1);
    }
    EXPECT_EQ(*c.state(g->id), "active") << "the binding outlived its first key lifetime";
    // Renew replies before the journal's writer commits its event, and so does a refusal.
    auto renewed = [&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind='renewed' AND session_id='" + g->id +
                      "'");
    };
    EXPECT_TRUE(eventually([&] { return renewed() == "5"; })) << renewed();
    auto refusals = [&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind='renew-refused'");
    };
    EXPECT_TRUE(eventually([&] { return refusals() == "1"; })) << refusals();
    // Without renewal it ends as expired, and then nothing renews it.
    ASSERT_TRUE(eventually([&] { return c.list()->empty(); }));
    // The end is committed by the journal's writer after the binding is gone: wait for it.
    auto end_reason = [&] {
        return sb.sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'");
    };
    EXPECT_TRUE(eventually([&] { return end_reason() == "expire"; })) << end_reason();
    auto late = c.renew(g->id, g->key);
    ASSERT_FALSE(late.ok());
    close(fd);
    // An ordinary user renews its own binding through the shipped bus policy.
    auto own = sb.run_client({"renew-own", "knodsim0", "sim0", "4096", flow}, 65534);
    EXPECT_EQ(own.status, 0) << own.out;
    EXPECT_EQ(own.out.rfind("renewed ", 0), 0u) << own.out;
}

// Item 5: a reload that changes unmatched_traffic takes effect at once in the filter.
TEST_F(DatapathFixture, ReloadAppliesUnmatchedTraffic) {
    auto c = sandbox_->client();
    auto stat = [&](const char *name) -> long {
        auto report = c.host_report();
        if (!report.ok()) return -1;
        auto at = report->find(std::string("\"") + name + "\":");
        if (at == std::string::npos) return -1;
        return std::stol(report->substr(at + std::string(name).size() + 3));
    };
    // Port 6000 is outside every binding: unmatched. (Other unmatched frames, such as IPv6
    // neighbour discovery, may be counted too: compare before and after.)
    long passed = stat("unmatched_passed"), dropped = stat("unmatched_dropped");
    ASSERT_GE(passed, 0);
    ASSERT_TRUE(send_to(6000, "unmatched-1"));
    ASSERT_TRUE(eventually([&] { return stat("unmatched_passed") > passed; }));
    EXPECT_EQ(stat("unmatched_dropped"), dropped);
    sandbox_->write_policy(std::string("[settings]\nunmatched_traffic = \"drop\"\n\n") +
                           sim_policy);
    auto r = c.reload();
    ASSERT_TRUE(r.ok()) << r.error().message;
    dropped = stat("unmatched_dropped");
    ASSERT_TRUE(send_to(6000, "unmatched-2"));
    EXPECT_TRUE(eventually([&] { return stat("unmatched_dropped") > dropped; }))
        << "the reload said it applied unmatched_traffic, but the filter still passes";
}

// Renew refusals are coalesced like every refusal: a holder (or an auditor, who sees every
// binding) looping on Renew with a wrong key writes one full record per window, not one per call.
TEST_F(ControlPlane, RenewRefusalsAreCoalesced) {
    Holder h(*sandbox_, {"knodsim0", "sim0", "4096", flow}, 65534);
    ASSERT_TRUE(h.ok()) << h.line();
    auto o = sandbox_->run_client({"renew-flood", h.id(), "300"}, 65534);
    ASSERT_EQ(o.status, 0) << o.out;
    EXPECT_NE(o.out.find("done"), std::string::npos) << o.out;
    // One full record (the window's first), committed after the refusal's reply: waited for.
    auto full = [&] {
        return sandbox_->sql("SELECT count(*) FROM events WHERE kind='renew-refused'");
    };
    EXPECT_TRUE(eventually([&] { return full() == "1"; })) << full() << " " << o.out;
}

// Once a grant could not be journaled, later requests are refused at once (they do not each wait
// out SQLite's busy timeout on the writer thread) until the journal takes writes again.
TEST_F(ControlPlane, AfterAJournalFailureRequestsAreRefusedAtOnce) {
    auto c = sandbox_->client();
    ASSERT_TRUE(eventually([&] { return c.status()->journal_available; }));
    JournalLock lock(*sandbox_);
    ASSERT_TRUE(lock.held()) << lock.output();
    int fd = make_region(4096);
    auto first = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
    ASSERT_FALSE(first.ok());
    EXPECT_EQ(first.error().code, Errc::journal_unavailable) << first.error().message;
    // The next one is answered well within SQLite's 5 s busy timeout.
    sd_bus *bus = open_bus(sandbox_->address());
    ASSERT_NE(bus, nullptr);
    sd_bus_set_method_call_timeout(bus, 2'000'000);
    sd_bus_message *m = request_message(bus, fd), *reply = nullptr;
    ASSERT_NE(m, nullptr);
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int r = sd_bus_call(bus, m, 0, &error, &reply);
    EXPECT_LT(r, 0);
    EXPECT_STREQ(error.name, "org.knod.Policy1.Error.JournalUnavailable")
        << (error.message ? error.message : "");
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
    sd_bus_message_unref(m);
    sd_bus_flush_close_unref(bus);
    lock.release();
    // The refused grant is journaled once the disk is back, and grants resume by themselves.
    EXPECT_TRUE(eventually(
        [&] {
            auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
            if (g.ok()) (void)c.release(g->id);
            return g.ok();
        },
        15000));
    EXPECT_EQ(sandbox_->sql("SELECT count(*) FROM events WHERE decision='journal-unavailable'"),
              "1");
    close(fd);
}

// A caller whose process exits while its grant is in flight, its connection kept open by a
// child, is not handed the key: the grant ends as process-exit.
TEST_F(ControlPlane, NoKeyForAProcessThatExitedDuringItsGrant) {
    JournalLock lock(*sandbox_);
    ASSERT_TRUE(lock.held()) << lock.output();
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    pid_t caller = fork();
    if (caller == 0) {
        close(out[0]);
        sd_bus *bus = open_bus(sandbox_->address());
        if (!bus) _exit(2);
        int fd = make_region(4096);
        std::uint64_t cookie = 0; // with a cookie, or sd-bus marks the call as wanting no reply
        sd_bus_message *m = request_message(bus, fd);
        if (!m || sd_bus_send(bus, m, &cookie) < 0 || sd_bus_flush(bus) < 0) _exit(3);
        // The daemon identifies this process while it lives; its grant then waits on the lock.
        usleep(500000);
        int conn = sd_bus_get_fd(bus);
        if (fork() == 0) {
            // The child keeps the connection and reports what the daemon answered.
            std::string got;
            char buf[4096];
            for (int i = 0; i < 600; ++i) { // 60 s: ends at the answer, however slow
                pollfd p{conn, POLLIN, 0};
                if (poll(&p, 1, 100) == 1) {
                    ssize_t n = read(conn, buf, sizeof buf);
                    if (n <= 0) break;
                    got.append(buf, static_cast<std::size_t>(n));
                }
                if (got.find("/org/knod/Policy1/bindings/b") != std::string::npos ||
                    got.find("org.knod.Policy1.Error") != std::string::npos)
                    break;
            }
            std::string verdict =
                got.find("/org/knod/Policy1/bindings/b") != std::string::npos ? "key\n"
                : got.find("org.knod.Policy1.Error") != std::string::npos     ? "refused\n"
                                                                              : "nothing\n";
            (void)!write(out[1], verdict.data(), verdict.size());
            _exit(0);
        }
        _exit(0); // gone before the grant is durable
    }
    close(out[1]);
    waitpid(caller, nullptr, 0);
    lock.release();
    std::string verdict = read_all(out[0]);
    close(out[0]);
    EXPECT_EQ(verdict, "refused\n");
    auto c = sandbox_->client();
    EXPECT_TRUE(eventually([&] { return c.list()->empty(); }));
    EXPECT_TRUE(eventually([&] {
        return sandbox_->sql("SELECT count(*) FROM sessions WHERE end_reason IS NULL") == "0";
    }));
}

// A holder that sets O_APPEND on its region after the grant cannot make the daemon write at the
// end of the memfd (growing it): the daemon writes through its own open file description.
TEST_F(DatapathFixture, CallerFlagsOnTheRegionDoNotReachTheDaemon) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = request(c, fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    ASSERT_EQ(fcntl(fd, F_SETFL, O_APPEND), 0);
    ASSERT_TRUE(send("at-offset-zero"));
    ASSERT_TRUE(c.wait_for_data(g->id, 0, 3000).ok());
    char head[14] = {};
    ASSERT_EQ(pread(fd, head, sizeof head, 0), 14);
    EXPECT_EQ(std::string(head, sizeof head), "at-offset-zero");
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 4096) << "the region grew";
    close(fd);
}

// Item 4 as a user meets it: the example client, run 50 times in a row as an ordinary user,
// receives every time (no EBUSY on the reused queue, no orphan from the run before).
TEST_F(BackToBack, FiftyExampleRunsInARow) {
    auto c = sandbox_->client();
    for (int i = 0; i < 50; ++i) {
        pid_t pid = fork();
        if (pid == 0) {
            execlp("setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                   KNOD_EXAMPLE_BIN, "--netdev", netdev_.c_str(), "--flow", flow, "--packets", "1",
                   "--timeout-ms", "10000", static_cast<char *>(nullptr));
            _exit(127);
        }
        ASSERT_TRUE(eventually([&] {
            auto l = c.list();
            return l.ok() && l->size() == 1 && (*l)[0].state == "active";
        })) << "run "
            << i << ": the example's binding never became active";
        ASSERT_TRUE(send("run-" + std::to_string(i)));
        int status = 0;
        waitpid(pid, &status, 0);
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
            << "run " << i << " exited with " << status;
    }
    EXPECT_EQ(sandbox_->sql("SELECT count(*) FROM sessions WHERE end_reason = 'release'"), "50");
}

// #33 item 4: a member of the state dir's group (an auditor, who reads the journal there)
// opens the state dir read-only and flocks it. The daemon locked the directory, so it refused
// to start ("another knod-policyd is running"). Its lock is now a file only it can open.
TEST(StateDirLock, AnAuditorsLockCannotStopTheDaemon) {
    Sandbox sb(sim_policy, {}, 0, /*start=*/false);
    const gid_t auditors = 4253; // the state dir's group, held by the auditor as a process gid
    ASSERT_EQ(mkdir(sb.state_dir().c_str(), 0750), 0);
    ASSERT_EQ(chown(sb.state_dir().c_str(), 0, auditors), 0);
    const std::vector<std::string> auditor = {"setpriv", "--reuid=5", "--regid=5",
                                              "--groups=" + std::to_string(auditors)};
    auto as_auditor = [&](std::vector<std::string> argv) {
        argv.insert(argv.begin(), auditor.begin(), auditor.end());
        return argv;
    };
    pid_t holder = fork();
    ASSERT_GE(holder, 0);
    // One process that opens, locks and keeps the lock (no child of flock(1) to outlive it).
    if (holder == 0)
        exec_argv(as_auditor(
            {"sh", "-c", "exec 9<\"$0\" && flock --shared 9 && exec sleep 600", sb.state_dir()}));
    // The auditor holds its lock on the directory before the daemon starts.
    ASSERT_TRUE(eventually([&] {
        return sb.run_program(
                     {"flock", "--nonblock", "--conflict-exit-code", "99", sb.state_dir(), "true"})
                   .status == (99 << 8);
    })) << "the auditor's flock never held";
    EXPECT_NO_THROW(sb.start_daemon());
    EXPECT_TRUE(eventually([&] { return sb.client().status().ok(); }));
    // Nor can the auditor take the daemon's own lock, which would stop the next start.
    Output o = sb.run_program(
        as_auditor({"sh", "-c", "flock --nonblock --conflict-exit-code 99 \"$0\" true 2>&1",
                    sb.state_dir() + "/daemon.lock"}));
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0 && WEXITSTATUS(o.status) != 99)
        << "the auditor could open the daemon's lock: " << o.status << " " << o.out;
    EXPECT_NE(o.out.find("Permission denied"), std::string::npos) << o.out;
    struct stat st {};
    ASSERT_EQ(stat((sb.state_dir() + "/daemon.lock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    kill(holder, SIGKILL);
    waitpid(holder, nullptr, 0);
}

namespace {

// A program left running in the background whose first line (stdout and stderr) is waited
// for; killed when the object goes. For a process that takes a lock and keeps it.
class Background {
  public:
    explicit Background(const std::vector<std::string> &argv) {
        int out[2];
        if (pipe2(out, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out[1], 1);
            dup2(out[1], 2);
            exec_argv(argv);
        }
        close(out[1]);
        bool ended = false;
        eventually([&] {
            pollfd p{out[0], POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) return false;
            char c;
            while (!ended) {
                ssize_t n = read(out[0], &c, 1);
                if (n <= 0 || c == '\n')
                    ended = true;
                else
                    line_ += c;
            }
            return true;
        });
        close(out[0]);
    }
    ~Background() { stop(); }
    Background(const Background &) = delete;
    Background &operator=(const Background &) = delete;
    void stop() {
        if (pid_ <= 0) return;
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    const std::string &line() const { return line_; }

  private:
    pid_t pid_ = -1;
    std::string line_;
};

// Asks for a binding of the sim NIC on `flow` and releases it: "ok", or the refusal.
std::string grant_and_release(client::Client &c, int region) {
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", region, 0, 4096, {flow});
    if (!g.ok()) return g.error().message;
    (void)c.release(g->id);
    return "ok";
}

} // namespace

// #33 item 6: a SIGHUP (a config tool's reload) that came while the daemon was still loading a
// large policy killed it (exit by SIGHUP, which systemd counts as clean). main() now blocks
// SIGTERM, SIGINT and SIGHUP first thing. The test waits until the starting daemon's
// /proc/PID/status shows SIGHUP blocked while it does not serve yet (still loading 4,000
// rules, about 0.6 s), sends SIGHUP three times then, and the daemon must come up and stay up.
// On a build that blocked nothing before its event loop, that state is never seen.
TEST(EarlySignals, ASighupWhileTheDaemonLoadsItsPolicyDoesNotKillIt) {
    std::string rules;
    for (int i = 0; i < 4000; ++i)
        rules += "[[rule]]\nname = \"r" + std::to_string(i) +
                 "\"\naction = \"deny\"\nusers = [\"nobody\"]\nnetdevs = [\"k" + std::to_string(i) +
                 "\"]\n\n";
    Sandbox sb(std::string(sim_policy) + "\n" + rules, {}, 0, /*start=*/false);
    std::atomic<bool> done{false}, sent_early{false};
    std::atomic<pid_t> signalled{0};
    // Our own child (never another test's daemon) with SIGHUP blocked: SigBlk is hex, SIGHUP
    // is bit 0.
    auto our_child_blocking_sighup = [](pid_t pid) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/status");
        bool ours = false, blocked = false;
        for (std::string line; std::getline(in, line);) {
            if (line.rfind("PPid:", 0) == 0) ours = std::stol(line.substr(5)) == getpid();
            if (line.rfind("SigBlk:", 0) == 0)
                blocked = (std::stoull(line.substr(7), nullptr, 16) & 1) != 0;
        }
        return ours && blocked;
    };
    std::thread sender([&] {
        while (!done) {
            for (auto &e : fs::directory_iterator("/proc")) {
                std::string name = e.path().filename().string();
                if (name.find_first_not_of("0123456789") != std::string::npos) continue;
                pid_t pid = std::stoi(name);
                std::error_code ec;
                if (fs::read_symlink(e.path() / "exe", ec) != fs::path(KNOD_DAEMON_BIN)) continue;
                if (!our_child_blocking_sighup(pid)) continue;
                bool serving = false;
                if (auto c = client::Client::connect(sb.address())) serving = c->status().ok();
                for (int i = 0; i < 3; ++i)
                    kill(pid, SIGHUP);
                signalled = pid;
                sent_early = !serving;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    });
    struct Join {
        std::atomic<bool> &done;
        std::thread &t;
        ~Join() {
            done = true;
            t.join();
        }
    } join{done, sender};
    EXPECT_NO_THROW(sb.start_daemon());
    EXPECT_TRUE(eventually([&] { return signalled.load() != 0; }))
        << "SIGHUP was never seen blocked in the starting daemon";
    EXPECT_TRUE(sent_early) << "the daemon already served when SIGHUP was sent";
    int status = 0;
    EXPECT_EQ(waitpid(sb.daemon_pid(), &status, WNOHANG), 0)
        << "the daemon died: " << (WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit");
    EXPECT_TRUE(eventually([&] { return sb.client().status().ok(); }));
}

// #33 item 4: a member of the state dir's group read the live journal, so it could open its
// -shm and hold a read lock on SQLite's WAL write-lock byte (offset 120): every commit then
// waited the busy timeout (5 s) and failed, and every grant was refused with
// JournalUnavailable. The live files are now the daemon's alone; the auditor reads the
// published snapshot, and holding that (a long read transaction) delays only the snapshot,
// which `status` then names, until the reader lets go.
TEST(StateDirLock, AnAuditorsLocksCannotStopGrants) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    Sandbox sb(sim_policy, {"--snapshot-interval=1"}, 0, /*start=*/false);
    const gid_t auditors = 4254;
    ASSERT_EQ(mkdir(sb.state_dir().c_str(), 0750), 0);
    ASSERT_EQ(chown(sb.state_dir().c_str(), 0, auditors), 0);
    sb.start_daemon();
    auto c = sb.client();
    int fd = make_region(4096);
    auto grant = [&] { return grant_and_release(c, fd); };
    ASSERT_EQ(grant(), "ok");
    const std::string shm = sb.journal() + "-shm";
    ASSERT_TRUE(eventually([&] { return fs::exists(shm); }));
    // The auditor's lock holder: says "locked" and keeps the lock (until killed), or why not.
    const std::string lock_byte = "import fcntl, os, sys, time\n"
                                  "try:\n"
                                  "    fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                                  "    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 120)\n"
                                  "except OSError as e:\n"
                                  "    print('cannot:', e, flush=True); sys.exit(0)\n"
                                  "print('locked', flush=True)\n"
                                  "time.sleep(600)\n";
    Background shm_lock({"setpriv", "--reuid=5", "--regid=5",
                         "--groups=" + std::to_string(auditors), "/usr/bin/python3", "-c",
                         lock_byte, shm});
    EXPECT_NE(shm_lock.line().find("cannot: [Errno 13] Permission denied"), std::string::npos)
        << "the auditor's lock on the journal's -shm: " << shm_lock.line();
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ(grant(), "ok") << "grant " << i << " with the auditor's lock attempt";

    // The auditor holds the published snapshot in a read transaction.
    const std::string snapshot = sb.state_dir() + "/snapshot/journal.db";
    ASSERT_TRUE(eventually([&] { return fs::exists(snapshot + ".anchor"); }));
    const std::string hold_snapshot =
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True,"
        " isolation_level=None)\n"
        "db.execute('BEGIN')\n"
        "print('locked', db.execute('SELECT count(*) FROM events').fetchone()[0], flush=True)\n"
        "time.sleep(600)\n";
    Background reader({"setpriv", "--reuid=5", "--regid=5", "--groups=" + std::to_string(auditors),
                       "/usr/bin/python3", "-c", hold_snapshot, snapshot});
    ASSERT_EQ(reader.line().rfind("locked", 0), 0u) << reader.line();
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ(grant(), "ok") << "grant " << i << " while the snapshot is held";
    EXPECT_TRUE(eventually([&] {
        auto st = c.status();
        return st.ok() && st->journal_problem.find(
                              "the auditors' snapshot is not being published") != std::string::npos;
    })) << (c.status().ok() ? c.status()->journal_problem : "no status");
    reader.stop();
    EXPECT_TRUE(eventually([&] {
        auto st = c.status();
        return st.ok() && st->journal_problem.empty();
    })) << c.status()->journal_problem;
    close(fd);
}

// #33 item 5: at its fd limit the daemon told live callers "process N is gone" (any
// pidfd_open failure was the caller's exit) and logged nothing. Now the caller gets
// OutOfResources naming EMFILE, `status` counts it, and the daemon serves again once the limit
// is raised.
TEST(ResourceFailures, AFullFdTableIsNamedAndTheDaemonRecovers) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    Sandbox sb(sim_policy);
    auto c = sb.client();
    int fd = make_region(4096);
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
    ASSERT_TRUE(g.ok()) << g.error().message;
    pid_t daemon = sb.daemon_pid();
    // The lowest fd number the daemon has free: the kernel gives a new fd that number, so a
    // soft limit there makes the next open fail (a count of open fds would leave room in the
    // gaps below it, and a call that opens one fd at a time could fit in a gap for ever).
    auto lowest_free_fd = [&] {
        std::set<long> used;
        for (auto &e : fs::directory_iterator("/proc/" + std::to_string(daemon) + "/fd"))
            used.insert(std::stol(e.path().filename().string()));
        long n = 0;
        while (used.count(n))
            ++n;
        return static_cast<rlim_t>(n);
    };
    struct rlimit before {};
    ASSERT_EQ(prlimit(daemon, RLIMIT_NOFILE, nullptr, &before), 0);
    // Its soft limit at its lowest free fd: the next one it opens fails (a transient fd of its
    // own can make room once, so a renewal is tried until one meets the limit).
    Result<std::uint64_t> renewed = std::uint64_t{0};
    EXPECT_TRUE(eventually([&] {
        struct rlimit full = before;
        full.rlim_cur = lowest_free_fd();
        if (prlimit(daemon, RLIMIT_NOFILE, &full, nullptr) != 0) return false;
        renewed = c.renew(g->id, g->key);
        return !renewed.ok();
    })) << "every renewal succeeded at the fd limit";
    ASSERT_FALSE(renewed.ok());
    EXPECT_NE(renewed.error().message.find("OutOfResources"), std::string::npos)
        << renewed.error().message;
    EXPECT_NE(renewed.error().message.find("EMFILE"), std::string::npos) << renewed.error().message;
    EXPECT_EQ(renewed.error().message.find("is gone"), std::string::npos)
        << "the caller is alive: " << renewed.error().message;
    ASSERT_EQ(prlimit(daemon, RLIMIT_NOFILE, &before, nullptr), 0);
    auto st = c.status();
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_GE(st->resource_failures, 1u);
    EXPECT_NE(st->last_resource_failure.find("EMFILE"), std::string::npos)
        << st->last_resource_failure;
    EXPECT_TRUE(c.renew(g->id, g->key).ok()) << "serves again with its fds back";
    EXPECT_TRUE(c.activate(g->id, g->key).ok());
    close(fd);
}

// #33 item 5: on a full disk grants went on while the anchor silently stopped advancing
// (write_anchor's errors were ignored) and `status` said "journal: ok". The state dir is a
// tmpfs with few inodes: once they are taken, SQLite still commits into its files, and a new
// anchor file cannot be made (ENOSPC), as on a disk full but for the database's own pages.
TEST(ResourceFailures, AnAnchorThatCannotBeWrittenIsCountedAndShown) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    Sandbox sb(sim_policy, {}, 0, /*start=*/false);
    ASSERT_EQ(mkdir(sb.state_dir().c_str(), 0700), 0);
    ASSERT_EQ(mount("knod-test-state", sb.state_dir().c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                    "size=16m,nr_inodes=48,mode=0700"),
              0)
        << std::strerror(errno);
    struct Unmount {
        Sandbox &sb;
        ~Unmount() {
            if (sb.daemon_pid() > 0) sb.stop_daemon(SIGTERM);
            umount2(sb.state_dir().c_str(), MNT_DETACH);
        }
    } unmount{sb};
    sb.start_daemon();
    auto c = sb.client();
    int fd = make_region(4096);
    auto grant = [&] { return grant_and_release(c, fd) == "ok"; };
    ASSERT_TRUE(grant());
    ASSERT_TRUE(c.status().ok());
    EXPECT_EQ(c.status()->journal_problem, "");
    // Take every inode left.
    std::string filler = sb.state_dir() + "/filler";
    ASSERT_EQ(mkdir(filler.c_str(), 0700), 0);
    for (int i = 0;; ++i) {
        int f =
            open((filler + "/" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (f < 0) {
            ASSERT_EQ(errno, ENOSPC) << std::strerror(errno);
            break;
        }
        close(f);
        ASSERT_LT(i, 100) << "the tmpfs has more inodes than asked for";
    }
    // The grant itself goes on (the journal commits into its own files) ...
    EXPECT_TRUE(grant());
    // ... and the anchor that did not move is said.
    EXPECT_TRUE(eventually([&] {
        auto st = c.status();
        return st.ok() && st->anchor_write_failures >= 1 &&
               st->journal_problem.find("anchor not advancing") != std::string::npos &&
               st->journal_problem.find("ENOSPC") != std::string::npos;
    })) << (c.status().ok() ? c.status()->journal_problem : "no status");
    Output o = sb.run_program({KNOD_CLI_BIN, "status"});
    EXPECT_NE(o.out.find("journal:  DEGRADED: "), std::string::npos) << o.out;
    // Room again: the next commit writes the anchor, and the problem is gone.
    fs::remove_all(filler);
    EXPECT_TRUE(eventually([&] {
        (void)grant();
        auto st = c.status();
        return st.ok() && st->journal_problem.empty();
    })) << c.status()->journal_problem;
    close(fd);
}

TEST(DaemonCli, VersionAndHelpExitZero) {
    Output v = run_daemon({"--version"});
    EXPECT_TRUE(WIFEXITED(v.status) && WEXITSTATUS(v.status) == 0) << v.out;
    EXPECT_EQ(v.out.rfind("knod-policyd ", 0), 0u) << v.out;
    Output bad = run_daemon({"--rate-limit=nan"});
    EXPECT_TRUE(WIFEXITED(bad.status) && WEXITSTATUS(bad.status) != 0) << bad.out;
    EXPECT_NE(bad.out.find("--rate-limit"), std::string::npos) << bad.out;
}
