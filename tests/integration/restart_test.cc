// A daemon restart under systemd keeps bindings: the test plays systemd's part. It owns the
// notify socket and keeps what the daemon sends with FDSTORE=1 (and forgets what it removes with
// FDSTOREREMOVE=1), as the file-descriptor store does, then starts the next daemon with those
// fds as LISTEN_FDS / LISTEN_FDNAMES. Holders that live keep their binding (same id, key and
// region, data still landing); one whose holder died meanwhile is closed as daemon-restart.
#include "tests/integration/sandbox.h"

#include "knod/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

std::string unique(const char *stem) {
    return stem + std::to_string(getpid() % 100000);
}

// systemd's side of sd_notify: a datagram socket; FDSTORE=1 keeps the fds that come with a
// message under its FDNAME, FDSTOREREMOVE=1 drops every fd of that name.
class FdStoreStandIn {
  public:
    FdStoreStandIn() {
        address_ = "@knod-test-notify-" + std::to_string(getpid());
        sock_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::memcpy(sa.sun_path + 1, address_.data() + 1, address_.size() - 1); // abstract
        socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
        if (bind(sock_.get(), reinterpret_cast<sockaddr *>(&sa), len) != 0)
            throw std::runtime_error("bind notify socket: " + std::string(strerror(errno)));
    }
    const std::string &address() const { return address_; }

    // Reads every message waiting (the daemon blocks once a few are queued: read often).
    void drain() {
        for (;;) {
            char text[4096];
            alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
            iovec iov{text, sizeof text - 1};
            msghdr m{};
            m.msg_iov = &iov;
            m.msg_iovlen = 1;
            m.msg_control = control;
            m.msg_controllen = sizeof control;
            ssize_t n = recvmsg(sock_.get(), &m, MSG_CMSG_CLOEXEC);
            if (n < 0) return;
            text[n] = '\0';
            std::vector<UniqueFd> fds;
            for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                    for (std::size_t i = 0; i < count; ++i) {
                        int fd;
                        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                        fds.emplace_back(fd);
                    }
                }
            std::string msg(text);
            messages_.push_back(msg);
            std::string name;
            if (auto at = msg.find("FDNAME="); at != std::string::npos)
                name = msg.substr(at + 7, msg.find('\n', at) - at - 7);
            if (msg.find("FDSTOREREMOVE=1") != std::string::npos) {
                stored_.erase(name);
            } else if (msg.find("FDSTORE=1") != std::string::npos) {
                // Like systemd, one copy of a file is enough: a name stored again replaces it.
                for (auto &fd : fds)
                    stored_[name] = std::move(fd);
            }
        }
    }
    bool has(const std::string &name) const { return stored_.count(name) > 0; }
    std::size_t size() const { return stored_.size(); }
    // The store as a start passes it on.
    void hand_to(Sandbox &s) const {
        std::vector<int> fds;
        std::vector<std::string> names;
        for (auto &[name, fd] : stored_) {
            fds.push_back(fd.get());
            names.push_back(name);
        }
        s.pass_fds(fds, names);
    }
    // A copy of the store as it is now (an old one, as whoever could replay it would keep).
    std::vector<std::pair<std::string, UniqueFd>> copy() const {
        std::vector<std::pair<std::string, UniqueFd>> out;
        for (auto &[name, fd] : stored_)
            out.emplace_back(name, UniqueFd(fcntl(fd.get(), F_DUPFD_CLOEXEC, 3)));
        return out;
    }
    static void hand_copy_to(Sandbox &s, const std::vector<std::pair<std::string, UniqueFd>> &c) {
        std::vector<int> fds;
        std::vector<std::string> names;
        for (auto &[name, fd] : c) {
            fds.push_back(fd.get());
            names.push_back(name);
        }
        s.pass_fds(fds, names);
    }
    bool said(const std::string &what) const {
        for (auto &m : messages_)
            if (m.find(what) != std::string::npos) return true;
        return false;
    }

  private:
    std::string address_;
    UniqueFd sock_;
    std::map<std::string, UniqueFd> stored_;
    std::vector<std::string> messages_;
};

// In a ForkedChild: a client on the pod socket at `address` that holds a binding on `port`
// ("ok ID"), or says why not.
std::optional<std::pair<client::Client, std::string>>
hold_on_pod_socket(FILE *w, const std::string &address, const std::string &netdev, int port) {
    setenv("KNOD_POLICY_ADDRESS", address.c_str(), 1);
    unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
    auto c = client::Client::connect();
    if (!c) {
        fprintf(w, "no connection: %s\n", c.error().message.c_str());
        return std::nullopt;
    }
    int fd = make_region(4096);
    auto g = c->request_binding(netdev, "sim0", "rx-only", fd, 0, 4096,
                                {"udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(port)});
    if (!g || !c->activate(g->id, g->key)) {
        fprintf(w, "refused\n");
        return std::nullopt;
    }
    fprintf(w, "ok %s\n", g->id.c_str());
    return std::make_pair(std::move(*c), g->id);
}

class RestartTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "needs root";
        netdev_ = unique("knodsimr");
        netns_ = unique("knod-rst");
        pin_root_ = "/sys/fs/bpf/" + unique("knodrs");
        pod_socket_ = "/tmp/" + unique("knod-rst-pod") + ".sock";
        sandbox_ = std::make_unique<Sandbox>(
            sim_policy,
            std::vector<std::string>{"--sim-datapath=true", "--sim-netdev", netdev_, "--sim-netns",
                                     netns_, "--bpf-pin-root", pin_root_, "--pod-socket",
                                     pod_socket_},
            0, false);
        sandbox_->set_notify_socket(store_.address());
        sandbox_->start_daemon();
        store_.drain();
    }
    void TearDown() override {
        if (sandbox_ && sandbox_->daemon_pid() > 0) {
            sandbox_->set_notify_socket({}); // a stop that ends everything, as without systemd
            EXPECT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
        }
        sandbox_.reset();
        std::error_code ec;
        if (!pod_socket_.empty()) fs::remove(pod_socket_, ec);
        if (netdev_.empty()) return;
        EXPECT_FALSE(fs::exists("/sys/class/net/" + netdev_)) << "link left behind";
        EXPECT_FALSE(fs::exists("/run/netns/" + netns_)) << "namespace left behind";
        EXPECT_FALSE(fs::exists(pin_root_)) << "pinned objects left behind";
    }

    void send(std::uint16_t port, const std::string &data) {
        pid_t pid = fork();
        if (pid == 0) {
            execl(KNOD_CLI_BIN, KNOD_CLI_BIN, "sim-send", "--netns", netns_.c_str(), "--to",
                  ("10.99.0.2:" + std::to_string(port)).c_str(), "--count", "1", "--data",
                  data.c_str(), nullptr);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    std::string sql(const std::string &q) { return sandbox_->sql(q); }
    // `knod-policy audit verify` on the journal, as an auditor runs it.
    // A stop that ends everything (as without systemd) exits 0 and leaves a journal that
    // verifies whole; the daemon is started again for the teardown.
    bool plain_stop_verifies() {
        sandbox_->set_notify_socket({});
        bool stopped = sandbox_->stop_daemon(SIGTERM) == 0;
        bool verifies = chain_verifies();
        sandbox_->start_daemon();
        return stopped && verifies;
    }

    bool chain_verifies() const {
        std::string cmd = std::string(KNOD_CLI_BIN) + " audit verify --db " + sandbox_->journal() +
                          " >/dev/null 2>&1";
        return std::system(cmd.c_str()) == 0;
    }

    // A pod's rule (ports 6300-6399) beside the sim's, and a holder in `pod` on the pod socket
    // that waits for its binding's end ("ok ID KEY", then "ended revoked|released REASON").
    void allow_pods() {
        sandbox_->write_policy(std::string(sim_policy) +
                               "\n[[rule]]\nname = \"ml-pods\"\nk8s_namespaces = [\"ml\"]\n"
                               "netdevs = [\"knodsim*\"]\ngpus = [\"sim0\"]\nmax_region = "
                               "\"1MiB\"\nflows = [\"udp 10.99.0.0/24:* -> 10.99.0.2:6300-6399\"]\n"
                               "iommu = \"any\"\n");
        ASSERT_TRUE(sandbox_->client().reload().ok());
    }
    std::vector<std::string> pod_holder(const TestPod &pod, int port) const {
        auto argv = pod.enter_as(65534);
        argv.insert(argv.end(),
                    {"env", "-u", "DBUS_SYSTEM_BUS_ADDRESS",
                     "KNOD_POLICY_ADDRESS=unix:path=" + pod_socket_, "KNOD_TEST_WAIT_MS=600000",
                     KNOD_TEST_CLIENT_BIN, "hold-until-end", netdev_, "sim0", "4096",
                     "udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(port)});
        return argv;
    }
    void restart() {
        ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
        store_.drain();
        store_.hand_to(*sandbox_);
        sandbox_->start_daemon();
        store_.drain();
    }

    std::string netdev_, netns_, pin_root_, pod_socket_;
    FdStoreStandIn store_;
    std::unique_ptr<Sandbox> sandbox_;
};

} // namespace

TEST_F(RestartTest, LiveHoldersKeepTheirBindingsAcrossARestart) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    // This test process is the first holder: it keeps its key and region across the restart.
    auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5000"});
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    send(5000, "before");
    ASSERT_TRUE(eventually([&] { return c.counters(g->id)->rx_bytes == 6; }));
    // The second holder dies while no daemon runs.
    Holder gone(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5100"}, 0, true);
    ASSERT_TRUE(gone.ok()) << gone.line();
    store_.drain();
    EXPECT_TRUE(store_.has(g->id + ".region"));
    EXPECT_TRUE(store_.has(gone.id() + ".region"));

    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    EXPECT_TRUE(store_.said("STOPPING=1"));
    // Both sessions stay open; the stop says they were handed over.
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "2");
    EXPECT_EQ(sql("SELECT json_extract(detail, '$.handed_over') FROM events WHERE "
                  "kind='daemon-stop' ORDER BY seq DESC LIMIT 1"),
              "2");
    EXPECT_EQ(store_.size(), 2u);
    gone.kill_now(SIGKILL);

    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    store_.drain();

    auto list = c.list();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, g->id);
    EXPECT_EQ(list->front().state, "active");
    // The same key still works (its MAC and grant came back), and data still lands where the
    // ring left off.
    EXPECT_TRUE(c.renew(g->id, g->key).ok());
    EXPECT_EQ(c.counters(g->id)->rx_bytes, 6u);
    send(5000, "after!");
    ASSERT_TRUE(eventually([&] { return c.counters(g->id)->rx_bytes == 12; }));
    std::string region(12, '\0');
    ASSERT_EQ(pread(fd, region.data(), region.size(), 0), 12);
    EXPECT_EQ(region, "beforeafter!");

    // One continuous session, taken back; the other closed with its reason.
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE id='" + g->id + "' AND ended_us IS NULL"),
              "1");
    EXPECT_EQ(
        sql("SELECT count(*) FROM events WHERE kind='adopted' AND session_id='" + g->id + "'"),
        "1");
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + gone.id() + "'"),
              "daemon-restart");
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='not-adopted' AND session_id='" +
                  gone.id() + "'"),
              "1");
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE handoff IS NOT NULL"), "0");
    // The dead holder's fd left the store; the live one's stays until its binding ends.
    EXPECT_TRUE(eventually([&] {
        store_.drain();
        return !store_.has(gone.id() + ".region") && store_.has(g->id + ".region");
    }));
    ASSERT_TRUE(c.release(g->id).ok());
    EXPECT_TRUE(eventually([&] {
        store_.drain();
        return store_.size() == 0;
    }));
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'"), "release");
    close(fd);
}

// Issue #51, failure 6: a restart that keeps bindings keeps the pods too. The registration
// (its network namespace held through the fd store, who it is in a sealed record beside it)
// and the pod identity of its binding come back; the binding is not ended as policy-reload
// under the same policy, and the pod's processes are still the pod's (a new grant by its rule).
TEST_F(RestartTest, PodsAndTheirBindingsSurviveARestart) {
    const std::string pod_rule =
        "[[rule]]\nname = \"ml-pods\"\nk8s_namespaces = [\"ml\"]\n"
        "netdevs = [\"knodsim*\"]\ngpus = [\"sim0\"]\nmax_region = "
        "\"1MiB\"\nflows = [\"udp 10.99.0.0/24:* -> 10.99.0.2:6300-6399\"]\n"
        "iommu = \"any\"\n";
    sandbox_->write_policy(std::string(sim_policy) + "\n" + pod_rule);
    ASSERT_TRUE(sandbox_->client().reload().ok());
    TestPod pod(unique("knodrst-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    Holder h(*sandbox_, pod.enter_as(65534),
             {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:6300"}, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    EXPECT_TRUE(store_.has("pods.handoff"));
    EXPECT_TRUE(store_.has("pod-0.netns"));
    EXPECT_EQ(sql("SELECT json_extract(detail, '$.pods_kept') FROM events WHERE "
                  "kind='daemon-stop' ORDER BY seq DESC LIMIT 1"),
              "1");
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    store_.drain();
    EXPECT_EQ(sql("SELECT json_extract(detail, '$.pods_restored') FROM events WHERE "
                  "kind='daemon-start' ORDER BY seq DESC LIMIT 1"),
              "1");
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE id='" + h.id() + "' AND ended_us IS NULL"),
              "1")
        << sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'");
    auto list = sandbox_->client().list();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, h.id());
    // Still the pod's: another of its processes is granted by the pod rule.
    Output again =
        sandbox_->run_client_with(pod.enter_as(65534), {"hold", netdev_, "sim0", "4096",
                                                        "udp 10.99.0.1:* -> 10.99.0.2:6301"});
    EXPECT_EQ(again.out.rfind("ok", 0), 0u) << again.out;
}

// Issue #51: a binding held over the pod socket survives a restart. No pod connection outlives
// the daemon that accepted it, so the holder's client connects again; the new daemon gives the
// binding back to that very process (its pid and start time, from the pidfd the kernel gives at
// accept), not to another process of the same pod and uid, and the holder hears of the
// binding's end over its new connection.
TEST_F(RestartTest, APodSocketHolderTakesItsBindingBackAfterARestart) {
    allow_pods();
    TestPod pod(unique("knodrps-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    WatchedProcess holder(pod_holder(pod, 6300));
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    std::string id = sql("SELECT id FROM sessions WHERE ended_us IS NULL");
    ASSERT_FALSE(id.empty());
    restart();
    // Another process of the pod, as the same uid, on the pod socket: a binding of its own.
    WatchedProcess other(pod_holder(pod, 6301));
    ASSERT_TRUE(other.wait_for("ok ")) << other.output();
    ASSERT_TRUE(eventually([&] {
        return sql("SELECT count(*) FROM events WHERE kind='holder-returned' AND session_id='" +
                   id + "'") == "1";
    })) << holder.output()
        << sql("SELECT kind, session_id, reason FROM events");
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='holder-returned'"), "1");
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE id='" + id + "' AND ended_us IS NULL"), "1")
        << sql("SELECT end_reason FROM sessions WHERE id='" + id + "'");
    ASSERT_TRUE(sandbox_->client().revoke(id, "after the restart").ok());
    EXPECT_TRUE(holder.wait_for("ended revoked")) << holder.output();
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + id + "'"), "revoke");
    // The other's binding is its own still.
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "1");
}

// A pod-socket holder that does not come back within --pod-reclaim-seconds (stopped here) loses
// its binding as on a disconnect, and is told so when it does come back.
TEST_F(RestartTest, APodSocketHolderThatDoesNotComeBackInTimeIsToldItsBindingEnded) {
    allow_pods();
    TestPod pod(unique("knodrpl-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    WatchedProcess holder(pod_holder(pod, 6310));
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    std::string id = sql("SELECT id FROM sessions WHERE ended_us IS NULL");
    holder.signal(SIGSTOP);
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon({"--pod-reclaim-seconds=1"});
    store_.drain();
    EXPECT_TRUE(eventually([&] {
        return sql("SELECT end_reason FROM sessions WHERE id='" + id + "'") == "disconnect";
    })) << sql("SELECT end_reason FROM sessions WHERE id='" + id + "'");
    holder.signal(SIGCONT);
    EXPECT_TRUE(holder.wait_for("ended released disconnect")) << holder.output();
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='holder-returned'"), "0");
}

// The attack review of the pod-socket take-back: another client of the holder's own process (a
// library, a health check) that connects first after the restart takes nothing (it never asks
// about the binding), and its closing ends nothing; the holder's own client takes it back by
// asking about it.
TEST_F(RestartTest, AnotherClientOfThePodHoldersProcessTakesNothingBack) {
    allow_pods();
    TestPod pod(unique("knodrv1-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    std::string addr = "unix:path=" + pod_socket_, nd = netdev_;
    ForkedChild k;
    k.start(
        pod.join(),
        [&](FILE *w, int go) {
            auto held = hold_on_pod_socket(w, addr, nd, 6320);
            char b;
            if (!held) return;
            auto &[a, id] = *held;
            // A second binding on the same connection: the client that asks about one takes both.
            int fd = make_region(4096);
            auto second = a.request_binding(nd, "sim0", "rx-only", fd, 0, 4096,
                                            {"udp 10.99.0.1:* -> 10.99.0.2:6322"});
            fprintf(w, "second %s\n", second ? second->id.c_str() : second.error().message.c_str());
            if (!second || read(go, &b, 1) != 1) return;
            {
                auto other = client::Client::connect(); // another user of the library
                auto l = other ? other->list()
                               : Result<std::vector<client::BindingSummary>>(
                                     make_error(Errc::io, "no connection"));
                // An object manager client (GDBus's, dbus-next's) enumerates every binding.
                sd_bus *raw = nullptr;
                sd_bus_error e = SD_BUS_ERROR_NULL;
                sd_bus_message *reply = nullptr;
                int r = sd_bus_new(&raw);
                if (r >= 0) r = sd_bus_set_address(raw, addr.c_str());
                if (r >= 0) r = sd_bus_start(raw);
                if (r >= 0)
                    r = sd_bus_call_method(raw, "org.knod.Policy1", "/org/knod/Policy1",
                                           "org.freedesktop.DBus.ObjectManager",
                                           "GetManagedObjects", &e, &reply, "");
                sd_bus_message_unref(reply);
                sd_bus_error_free(&e);
                sd_bus_close_unref(raw);
                fprintf(w, "other listed %s, enumerated %d\n", l ? "ok" : l.error().message.c_str(),
                        r);
            } // and both close
            if (read(go, &b, 1) != 1) return;
            auto st = a.state(id);
            fprintf(w, "state %s\n", st ? st->c_str() : st.error().message.c_str());
            (void)!read(go, &b, 1); // holding until the test has looked
        },
        65534);
    ASSERT_TRUE(k.wait_for("second ")) << k.said;
    ASSERT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "2") << k.said;
    restart();
    k.proceed();
    ASSERT_TRUE(k.wait_for("other listed")) << k.said;
    EXPECT_NE(k.said.find("enumerated 1"), std::string::npos) << k.said;
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='holder-returned'"), "0");
    k.proceed();
    ASSERT_TRUE(k.wait_for("state ")) << k.said;
    EXPECT_NE(k.said.find("state active"), std::string::npos) << k.said;
    EXPECT_TRUE(eventually([&] {
        return sql("SELECT count(*) FROM events WHERE kind='holder-returned'") == "2";
    })) << sql("SELECT kind, session_id FROM events");
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "2");
}

// An end while the holder was away is told to the client that asks about that binding, not to
// whichever client of the process connects first.
TEST_F(RestartTest, AnEndWhileThePodHolderWasAwayIsToldToTheClientThatAsks) {
    allow_pods();
    TestPod pod(unique("knodrv2-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    std::string addr = "unix:path=" + pod_socket_, nd = netdev_;
    ForkedChild k;
    k.start(
        pod.join(),
        [&](FILE *w, int go) {
            auto held = hold_on_pod_socket(w, addr, nd, 6321);
            char b;
            if (!held || read(go, &b, 1) != 1) return;
            auto &[a, id] = *held;
            {
                auto other = client::Client::connect();
                auto l = other ? other->list()
                               : Result<std::vector<client::BindingSummary>>(
                                     make_error(Errc::io, "no connection"));
                fprintf(w, "other listed %s\n", l ? "ok" : l.error().message.c_str());
            }
            auto end = a.wait_for_end(id, 120000);
            if (end)
                fprintf(w, "a-end %s %s\n", end->revoked ? "revoked" : "released",
                        end->reason.c_str());
            else
                fprintf(w, "a-error %s\n", end.error().message.c_str());
        },
        65534);
    ASSERT_TRUE(k.wait_for("ok ")) << k.said;
    std::string id = sql("SELECT id FROM sessions WHERE ended_us IS NULL");
    ASSERT_FALSE(id.empty());
    restart();
    ASSERT_TRUE(sandbox_->client().revoke(id, "while away").ok());
    k.proceed();
    ASSERT_TRUE(k.wait_for("a-")) << k.said;
    EXPECT_NE(k.said.find("a-end revoked revoke: while away"), std::string::npos) << k.said;
}

// A holder that exec()s another program during the restart is the same pid and start time, but
// not the program that was granted: asking about the binding does not take it back.
TEST_F(RestartTest, APodHolderThatExecsAnotherProgramDoesNotTakeItsBindingBack) {
    allow_pods();
    TestPod pod(unique("knodrv3-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    std::string addr = "unix:path=" + pod_socket_, nd = netdev_;
    ForkedChild k;
    k.start(
        pod.join(),
        [&](FILE *w, int go) {
            auto held = hold_on_pod_socket(w, addr, nd, 6330);
            char b;
            if (!held || read(go, &b, 1) != 1) return;
            std::string id = held->second;
            dup2(fileno(w), 1);
            dup2(fileno(w), 2);
            // The environment (KNOD_POLICY_ADDRESS) goes with it; the connection does not.
            execl(KNOD_TEST_CLIENT_BIN, KNOD_TEST_CLIENT_BIN, "release", id.c_str(), nullptr);
            fprintf(w, "exec failed\n");
        },
        65534);
    ASSERT_TRUE(k.wait_for("ok ")) << k.said;
    std::string id = sql("SELECT id FROM sessions WHERE ended_us IS NULL");
    ASSERT_FALSE(id.empty());
    restart();
    k.proceed();
    ASSERT_TRUE(k.wait_for("\n", 60000));
    // The exec'd program has asked (and exited): a fence for what it could have done.
    int status = 0;
    ASSERT_EQ(waitpid(k.pid, &status, 0), k.pid) << k.said;
    k.pid = -1;
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='holder-returned'"), "0") << k.said;
}

// wait_for_end keeps its deadline while it connects again to a daemon that accepts and does
// not answer (stopped here; or busy at its start): sd-bus alone would wait 90 s for the
// handshake, then again for each call.
TEST_F(RestartTest, APodHoldersWaitKeepsItsDeadlineAgainstAHungDaemon) {
    allow_pods();
    TestPod pod(unique("knodrv6-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    std::string addr = "unix:path=" + pod_socket_, nd = netdev_;
    ForkedChild k;
    k.start(
        pod.join(),
        [&](FILE *w, int go) {
            auto held = hold_on_pod_socket(w, addr, nd, 6350);
            char b;
            if (!held || read(go, &b, 1) != 1) return;
            auto &[a, id] = *held;
            auto end = a.wait_for_end(id, 2000);
            fprintf(w, "waited: %s\n", end ? end->reason.c_str() : end.error().message.c_str());
        },
        65534);
    ASSERT_TRUE(k.wait_for("ok ")) << k.said;
    restart();
    ASSERT_EQ(kill(sandbox_->daemon_pid(), SIGSTOP), 0);
    k.proceed();
    // 2 s asked; 60 s allowed for a loaded machine, far below sd-bus's 90 s handshake wait.
    bool done = k.wait_for("waited: ", 60000);
    kill(sandbox_->daemon_pid(), SIGCONT);
    ASSERT_TRUE(done) << k.said;
    EXPECT_EQ(k.said.find("waited: daemon-restart"), std::string::npos) << k.said;
}

// The attack review of #51: the pods' record is taken back only from the journal's last stop,
// and only once. An older record (with its netns fd), handed to a later start, is not: neither
// after a stop that kept the pods again, nor after a start that crashed.
TEST_F(RestartTest, AnOlderPodsRecordIsNotTakenBackAgain) {
    TestPod pod(unique("knodrpl-pod"), "ml");
    ASSERT_EQ(pod.register_with(*sandbox_), "");
    auto restored = [&] {
        return sql("SELECT json_extract(detail, '$.pods_restored') FROM events WHERE "
                   "kind='daemon-start' ORDER BY seq DESC LIMIT 1");
    };
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    ASSERT_TRUE(store_.has("pods.handoff"));
    auto first_stop = store_.copy();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    store_.drain();
    ASSERT_EQ(restored(), "1") << "the honest restart takes the pod back";
    // A start that dies before its stop: its record was the first stop's, used once.
    ASSERT_NE(sandbox_->stop_daemon(SIGKILL), 0);
    FdStoreStandIn::hand_copy_to(*sandbox_, first_stop);
    sandbox_->start_daemon();
    store_.drain();
    EXPECT_EQ(restored(), "0") << "replayed after a start";
    // Another stop keeps nothing (the pod was not taken back) and the old record comes again.
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    FdStoreStandIn::hand_copy_to(*sandbox_, first_stop);
    sandbox_->start_daemon();
    store_.drain();
    EXPECT_EQ(restored(), "0") << "replayed after a later stop";
}

TEST_F(RestartTest, AStopThatDiscardsTheStoreEndsSessionsAsDaemonRestart) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5200"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "1");
    // `systemctl stop`: systemd drops the store; the next start gets no fds.
    sandbox_->start_daemon();
    EXPECT_TRUE(sandbox_->client().list()->empty());
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'"), "daemon-restart");
}

// #52: a stop and a later start (a package's preinst stop, an admin's) leave the handed-over
// binding without its fds: the start ends it, and tells its holder, which is still connected
// and would otherwise wait for ever, why (BindingReleased from the new daemon, whose name this
// connection has never called).
TEST_F(RestartTest, AHolderWhoseBindingIsNotTakenBackIsTold) {
    auto c = sandbox_->client(); // this process holds the binding on this connection
    int fd = make_region(4096);
    auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5250"});
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "1");
    sandbox_->start_daemon(); // the store was not handed over: systemd emptied it at the stop
    auto end = c.wait_for_end(g->id, min_wait_ms);
    ASSERT_TRUE(end.ok()) << end.error().message;
    EXPECT_FALSE(end->revoked);
    EXPECT_EQ(end->reason.rfind("daemon-restart: its region fd did not come back", 0), 0u)
        << end->reason;
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'"), "daemon-restart");
    close(fd);
}

// The library trusts a new daemon only as the bus announces it: a connection that sends the
// holder a NameOwnerChanged naming itself as org.knod.Policy1's owner, then BindingReleased,
// ends nothing (it is not the bus driver), and the binding still lives.
TEST_F(RestartTest, ASpoofedNewOwnerCannotTellAHolderItsBindingEnded) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5260"});
    ASSERT_TRUE(g.ok()) << g.error().message;
    sd_bus *spoofer = nullptr;
    ASSERT_GE(sd_bus_new(&spoofer), 0);
    ASSERT_GE(sd_bus_set_address(spoofer, sandbox_->address().c_str()), 0);
    ASSERT_GE(sd_bus_set_bus_client(spoofer, 1), 0);
    ASSERT_GE(sd_bus_start(spoofer), 0);
    const char *me = nullptr;
    ASSERT_GE(sd_bus_get_unique_name(spoofer, &me), 0);
    // The holder's connection: this process's other one (the client keeps its bus private).
    std::vector<std::string> mine;
    char **names = nullptr;
    ASSERT_GE(sd_bus_list_names(spoofer, &names, nullptr), 0);
    for (char **n = names; n && *n; ++n) {
        sd_bus_creds *creds = nullptr;
        pid_t pid = 0;
        if (**n == ':' && std::strcmp(*n, me) != 0 &&
            sd_bus_get_name_creds(spoofer, *n, SD_BUS_CREDS_PID, &creds) >= 0 &&
            sd_bus_creds_get_pid(creds, &pid) >= 0 && pid == getpid())
            mine.emplace_back(*n);
        sd_bus_creds_unref(creds);
        free(*n);
    }
    free(names);
    ASSERT_EQ(mine.size(), 1u);
    const std::string *holder = &mine.front();
    auto send = [&](const char *path, const char *iface, const char *member, const char *a,
                    const char *b, const char *text) {
        sd_bus_message *m = nullptr;
        int r = sd_bus_message_new_signal(spoofer, &m, path, iface, member);
        if (r >= 0) r = sd_bus_message_set_destination(m, holder->c_str());
        if (r >= 0) r = sd_bus_message_append(m, member[0] == 'N' ? "sss" : "oss", a, b, text);
        if (r >= 0) r = sd_bus_send(spoofer, m, nullptr);
        sd_bus_message_unref(m);
        return r;
    };
    ASSERT_GE(send("/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged",
                   "org.knod.Policy1", "", me),
              0);
    std::string path = "/org/knod/Policy1/binding/" + g->id;
    ASSERT_GE(send("/org/knod/Policy1", "org.knod.Policy1.Manager", "BindingReleased", path.c_str(),
                   g->id.c_str(), "daemon-restart: spoofed"),
              0);
    // Fences: the bus has routed both once it answers the spoofer, and the holder has them
    // queued before the daemon's answer to its next call.
    sd_bus_message *reply = nullptr;
    ASSERT_GE(sd_bus_call_method(spoofer, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                 "org.freedesktop.DBus", "GetId", nullptr, &reply, ""),
              0);
    sd_bus_message_unref(reply);
    auto list = c.list();
    ASSERT_TRUE(list.ok()) << list.error().message;
    auto end = c.end_of(g->id);
    ASSERT_TRUE(end.ok()) << end.error().message;
    EXPECT_FALSE(end->has_value()) << (*end)->reason;
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, g->id);
    sd_bus_flush_close_unref(spoofer);
    close(fd);
}

TEST_F(RestartTest, WithoutSystemdASigtermStillEndsEveryBinding) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5300"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    sandbox_->set_notify_socket({});
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0); // the daemon was started with NOTIFY_SOCKET
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "1")
        << "started under systemd, it hands over";
    sandbox_->start_daemon(); // now without: a plain start, and a plain stop
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5400"});
    close(fd);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'"), "daemon-stop");
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "0");
    sandbox_->start_daemon();
}

TEST_F(RestartTest, APolicyThatChangedMeanwhileAppliesToWhatComesBack) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5500"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    // The upgrade ships a policy that no longer grants port 5500.
    std::string narrower = sim_policy;
    narrower.replace(narrower.find("5000-5999"), 9, "6000-6999");
    sandbox_->write_policy(narrower);
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    EXPECT_TRUE(eventually([&] { return sandbox_->client().list()->empty(); }));
    EXPECT_EQ(
        sql("SELECT count(*) FROM events WHERE kind='adopted' AND session_id='" + h.id() + "'"),
        "1");
    EXPECT_TRUE(eventually([&] {
        return sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'") == "policy-reload";
    }));
    EXPECT_TRUE(eventually([&] {
        store_.drain();
        return store_.size() == 0;
    }));
}

TEST_F(RestartTest, AHolderWhoseConnectionClosedDuringTheRestartLosesItsBinding) {
    int fd = make_region(4096);
    std::string id;
    {
        auto c = sandbox_->client(); // this process holds the binding on this connection
        auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                                   {"udp 10.99.0.1:* -> 10.99.0.2:5600"});
        ASSERT_TRUE(g.ok()) << g.error().message;
        id = g->id;
        ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    } // the connection closes while no daemon listens; the process lives on
    store_.drain();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    EXPECT_TRUE(eventually([&] { return sandbox_->client().list()->empty(); }));
    EXPECT_TRUE(eventually([&] {
        return sql("SELECT end_reason FROM sessions WHERE id='" + id + "'") == "disconnect";
    }));
    close(fd);
}

// A handoff row is read back as untrusted text: malformed JSON, wrong types, absurd numbers and
// deep nesting each make that session not-adopted (closed as daemon-restart); the start goes on
// and a valid row next to them is still taken back.
TEST_F(RestartTest, CorruptHandoffRowsDoNotStopTheStart) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5700"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    std::string good = sql("SELECT handoff FROM sessions WHERE id='" + h.id() + "'");
    ASSERT_FALSE(good.empty());
    // Each variant is a session of its own, as a damaged journal could hold.
    std::vector<std::string> rows = {
        "'not json {'",
        "'[]'",
        "'{\"version\":1}'",
        "'{\"version\":\"1\"}'",
        "'null'",
        "x'00ff00'",
        "12345",
        // a valid row with absurd numbers and types in its fields
        "json_set(handoff, '$.owner.pid', -1, '$.region.length', 1e300)",
        "json_set(handoff, '$.owner.uid', 'root', '$.flows', json('{\"a\":1}'))",
        "json_set(handoff, '$.flows', json('[\"udp * -> *\"]'), '$.gpu_names', 7)",
        "json_set(handoff, '$.owner.start_time', 1e300, '$.expires_us', 9e99)",
        "printf('%.*c', 200000, '[') || printf('%.*c', 200000, ']')",
        // a copy of the live holder's row under another id: its fds are not there
        "handoff",
    };
    for (std::size_t i = 0; i < rows.size(); ++i)
        sql("INSERT INTO sessions (id, uid, pid, netdev, gpu, mode, region_bytes, flows, key_id, "
            "rule, started_us, handoff) SELECT 'corrupt" +
            std::to_string(i) +
            "', uid, pid, netdev, gpu, mode, region_bytes, flows, key_id, rule, "
            "started_us, " +
            rows[i] + " FROM sessions WHERE id='" + h.id() + "'");
    ASSERT_EQ(sql("SELECT count(*) FROM sessions WHERE id LIKE 'corrupt%' AND handoff IS NOT "
                  "NULL"),
              std::to_string(rows.size()));
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    auto list = sandbox_->client().list();
    ASSERT_TRUE(list.ok()) << list.error().message;
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, h.id());
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE id LIKE 'corrupt%' AND end_reason = "
                  "'daemon-restart'"),
              std::to_string(rows.size()));
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='not-adopted' AND session_id LIKE "
                  "'corrupt%'"),
              std::to_string(rows.size()));
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE handoff IS NOT NULL"), "0");
}

// The handoff is authenticated whole (#31): a live holder's row with its flows widened (its
// fds back, its holder alive, the policy granting the wider flow) is refused by its MAC and
// named; the intact row beside it is taken back.
TEST_F(RestartTest, AnEditedHandoffOfALiveHolderIsRefusedByItsMac) {
    Holder edited(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5710"}, 0,
                  true);
    Holder intact(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5720"}, 0,
                  true);
    ASSERT_TRUE(edited.ok() && intact.ok()) << edited.line() << intact.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    sql("UPDATE sessions SET handoff = json_set(handoff, '$.flows', json('[\"udp 10.99.0.1:* -> "
        "10.99.0.2:5000-5999\"]')) WHERE id = '" +
        edited.id() + "'");
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    auto list = sandbox_->client().list();
    ASSERT_TRUE(list.ok()) << list.error().message;
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, intact.id());
    EXPECT_TRUE(eventually([&] {
        return sql("SELECT count(*) FROM events WHERE kind='not-adopted' AND session_id='" +
                   edited.id() + "' AND reason LIKE '%does not match its MAC%'") == "1";
    }));
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + edited.id() + "'"),
              "daemon-restart");
}

// The journal's hash chain stays whole across hand-off, adoption and the end of the adopted
// binding: the handoff column is outside the chain, every event is appended in order.
TEST_F(RestartTest, TheJournalChainVerifiesAfterARestartWithAdoption) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5800"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    ASSERT_EQ(sandbox_->client().list()->size(), 1u);
    h.kill_now(SIGKILL); // ends after adoption: process-exit, or disconnect if the bus says first
    EXPECT_TRUE(eventually(
        [&] {
            auto why = sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'");
            return why == "process-exit" || why == "disconnect";
        },
        10000));
    EXPECT_TRUE(plain_stop_verifies());
}

// A daemon killed after it took bindings back (the handoff rows are gone, systemd still holds
// the fds): the next start ends each session once, as daemon-restart, and empties the store.
TEST_F(RestartTest, ACrashAfterAdoptionEndsTheSessionsOnceAtTheNextStart) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5900"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    ASSERT_EQ(sandbox_->client().list()->size(), 1u);
    store_.drain();
    ASSERT_TRUE(store_.has(h.id() + ".region"));
    sandbox_->stop_daemon(SIGKILL);
    store_.drain();
    store_.hand_to(*sandbox_); // systemd keeps the store across a crash
    sandbox_->start_daemon();
    EXPECT_TRUE(sandbox_->client().list()->empty());
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'"), "daemon-restart");
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='session-ended' AND session_id='" +
                  h.id() + "'"),
              "1");
    EXPECT_TRUE(eventually([&] {
        store_.drain();
        return store_.size() == 0;
    }));
    EXPECT_TRUE(plain_stop_verifies());
}

// A journal that cannot take the handoff at the stop (locked: SQLite busy): nothing is handed
// over, the fds leave the store, and the next start ends the session once.
TEST_F(RestartTest, AJournalFailureAtTheStopHandsNothingOver) {
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5950"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    JournalLock lock(*sandbox_, 30000);
    ASSERT_TRUE(lock.held()) << lock.output();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    lock.release();
    store_.drain();
    EXPECT_FALSE(store_.has(h.id() + ".region"))
        << "ended at the stop: its fd must leave the store";
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE handoff IS NOT NULL"), "0");
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    EXPECT_TRUE(sandbox_->client().list()->empty());
    EXPECT_EQ(sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "0");
    EXPECT_EQ(sql("SELECT count(*) FROM events WHERE kind='session-ended' AND session_id='" +
                  h.id() + "'"),
              "1");
    EXPECT_TRUE(plain_stop_verifies());
}

// A key that expired while no daemon ran is not taken back: its binding ends at the start
// instead of getting its data path back until the first tick.
TEST_F(RestartTest, AKeyThatExpiredDuringTheRestartIsNotTakenBack) {
    std::string brief = sim_policy;
    brief += "key_lifetime = 1\n";
    sandbox_->write_policy(brief);
    kill(sandbox_->daemon_pid(), SIGHUP);
    ASSERT_TRUE(eventually(
        [&] { return sql("SELECT count(*) FROM events WHERE kind='policy-reload'") == "1"; }));
    Holder h(*sandbox_, {netdev_, "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5980"}, 0, true);
    ASSERT_TRUE(h.ok()) << h.line();
    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    ASSERT_TRUE(store_.has(h.id() + ".region")) << "handed over";
    std::int64_t expires = std::stoll(sql(
        "SELECT json_extract(handoff, '$.expires_us') FROM sessions WHERE id='" + h.id() + "'"));
    while (std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
               .count() <= expires)
        usleep(100'000);
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    EXPECT_TRUE(sandbox_->client().list()->empty());
    EXPECT_EQ(
        sql("SELECT count(*) FROM events WHERE kind='adopted' AND session_id='" + h.id() + "'"),
        "0");
    EXPECT_EQ(
        sql("SELECT count(*) FROM events WHERE kind='not-adopted' AND session_id='" + h.id() + "'"),
        "1");
    EXPECT_EQ(sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'"), "daemon-restart");
}

// wait_for_data's notifier (Binding.RxNotifier) belongs to the daemon that made it: after a
// restart that keeps the binding, the old pipe's write end is gone (it reads EOF). The wait
// notices, drops the notifier, polls RxBytes for the rest of its time, and a new one counts on.
TEST_F(RestartTest, AHoldersNotifierIsReplacedAfterARestart) {
    auto c = sandbox_->client();
    int fd = make_region(4096);
    auto g = c.request_binding(netdev_, "sim0", "rx-only", fd, 0, 4096,
                               {"udp 10.99.0.1:* -> 10.99.0.2:5600"});
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    auto n = c.rx_notifier(g->id, g->key);
    ASSERT_TRUE(n.ok()) << n.error().message;
    EXPECT_EQ(n->rx_bytes, 0u);
    send(5600, "before");
    auto rx = c.wait_for_data(g->id, *n, 0, 5000);
    ASSERT_TRUE(rx.ok()) << rx.error().message;
    EXPECT_EQ(*rx, 6u);

    ASSERT_EQ(sandbox_->stop_daemon(SIGTERM), 0);
    store_.drain();
    store_.hand_to(*sandbox_);
    sandbox_->start_daemon();
    store_.drain();

    send(5600, "after!");
    ASSERT_TRUE(eventually([&] { return c.counters(g->id)->rx_bytes == 12; }));
    rx = c.wait_for_data(g->id, *n, 6, 200);
    ASSERT_TRUE(rx.ok()) << rx.error().message;
    EXPECT_EQ(*rx, 12u);
    EXPECT_FALSE(n->fd.valid()) << "a notifier that lost count is dropped";
    auto again = c.rx_notifier(g->id, g->key);
    ASSERT_TRUE(again.ok()) << again.error().message;
    EXPECT_EQ(again->rx_bytes, 12u);
    send(5600, "again!");
    rx = c.wait_for_data(g->id, *again, 12, 5000);
    ASSERT_TRUE(rx.ok()) << rx.error().message;
    EXPECT_EQ(*rx, 18u);
    // Someone else's key gets no notifier.
    std::vector<std::uint8_t> wrong(g->key.size(), 0);
    auto refused = c.rx_notifier(g->id, wrong);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::denied);
    ASSERT_TRUE(c.release(g->id).ok());
    close(fd);
}

// PID 1 that does not read its notify socket (a long daemon-reload, #52 item 5): the daemon's
// notify messages (FDSTORE, FDSTOREREMOVE, STOPPING, WATCHDOG) must never wait for it. The test
// binds the notify socket and never reads it, so it fills after net.unix.max_dgram_qlen
// datagrams; grants, releases and Ping still answer, the handles that did not fit are "not kept"
// (host report and metrics say so), and a stop ends those bindings as daemon-stop (the holder is
// told) instead of handing them over. Before the fix the loop blocked in sendmsg at the first
// message that did not fit: the next call answered nobody.
TEST(NotifySocketTest, APidOneThatDoesNotReadNeverBlocksTheLoop) {
    std::string address = "@knod-test-deaf-notify-" + std::to_string(getpid());
    UniqueFd deaf(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    ASSERT_GE(deaf.get(), 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path + 1, address.data() + 1, address.size() - 1); // abstract
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
    ASSERT_EQ(bind(deaf.get(), reinterpret_cast<sockaddr *>(&sa), len), 0) << strerror(errno);
    int small = 1; // the kernel's minimum; the queue's length is what fills first
    setsockopt(deaf.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    // How many datagrams fit before a sender waits (10 on Debian, 512 under systemd's sysctl).
    std::size_t qlen = 10;
    if (std::ifstream f("/proc/sys/net/unix/max_dgram_qlen"); f) f >> qlen;
    qlen = std::min<std::size_t>(qlen, 1000);

    Sandbox s(sim_policy, {"--keep-bindings-on-restart=true"}, 0, false);
    s.set_notify_socket(address);
    s.start_daemon();
    // A daemon stuck in sendmsg ignores SIGTERM (the loop reads its signalfd): killed, not waited
    // for, when the test stops early.
    struct Reaper {
        Sandbox &s;
        ~Reaper() {
            if (s.daemon_pid() > 0) s.stop_daemon(SIGKILL);
        }
    } reaper{s};
    auto c = s.client();
    int fd = make_region(4096);
    // Held from before the socket fills: kept; its release's FDSTOREREMOVE will not fit.
    auto early = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                                   {"udp 10.99.0.1:* -> 10.99.0.2:5009"});
    ASSERT_TRUE(early.ok()) << early.error().message;
    // Twice the queue in grant/release pairs (an FDSTORE and an FDSTOREREMOVE each): the socket
    // fills halfway through. A call that does not answer fails at sd-bus's timeout (the guard).
    for (std::size_t i = 0; i < qlen + 8; ++i) {
        auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                                   {"udp 10.99.0.1:* -> 10.99.0.2:5000"});
        ASSERT_TRUE(g.ok()) << "grant " << i << ": " << g.error().message;
        ASSERT_TRUE(c.release(g->id).ok()) << "release " << i;
    }
    ASSERT_TRUE(c.ping().ok());
    ASSERT_TRUE(c.release(early->id).ok());
    // Three held bindings whose handles systemd never got: not kept.
    std::vector<std::string> held;
    for (int i = 0; i < 3; ++i) {
        auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                                   {"udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(5010 + i)});
        ASSERT_TRUE(g.ok()) << g.error().message;
        held.push_back(g->id);
    }
    auto report = c.host_report();
    ASSERT_TRUE(report.ok()) << report.error().message;
    auto j = nlohmann::json::parse(*report);
    ASSERT_TRUE(j.contains("fd_store")) << *report;
    EXPECT_TRUE(j["fd_store"]["enabled"].get<bool>());
    EXPECT_GE(j["fd_store"]["not_kept"].get<std::uint64_t>(), 3u) << j["fd_store"].dump();
    EXPECT_GE(j["fd_store"]["remove_failed"].get<std::uint64_t>(), 1u) << j["fd_store"].dump();
    EXPECT_TRUE(j["fd_store"]["failing"].get<bool>()) << j["fd_store"].dump();
    EXPECT_NE(j["fd_store"]["last_error"].get<std::string>().find("not kept"), std::string::npos)
        << j["fd_store"].dump();
    auto metrics = c.metrics();
    ASSERT_TRUE(metrics.ok());
    EXPECT_NE(metrics->find("\"not_kept\""), std::string::npos) << *metrics;

    // The stop: STOPPING=1 does not fit either, and must not hold the exit. The held bindings
    // were not kept, so they end now (daemon-stop, their holder told) rather than being handed
    // to a store that does not have their handles.
    kill(s.daemon_pid(), SIGTERM);
    int status = s.wait_daemon_exit(min_wait_ms);
    ASSERT_NE(status, -1) << "the daemon did not exit on SIGTERM";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    for (auto &id : held)
        EXPECT_EQ(s.sql("SELECT end_reason FROM sessions WHERE id='" + id + "'"), "daemon-stop");
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.handed_over') FROM events WHERE "
                    "kind='daemon-stop' ORDER BY seq DESC LIMIT 1"),
              "0");
    close(fd);
}
