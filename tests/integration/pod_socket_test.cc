// The pod socket (issue #51, failures 1 and 2): a pod's processes reach knod-policyd over a
// socket only the daemon serves, peer-to-peer, and nothing else through it; the kernel says who
// is calling; a pod cannot use up what another pod or the host's root needs.
#include "protocol/names.h"
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace knod::test {
namespace {

const uid_t nobody = 65534;

std::string sim_rule(const std::string &name, const std::string &who, int port) {
    return "[[rule]]\nname = \"" + name + "\"\n" + who +
           "\nnetdevs = [\"knodsim0\"]\ngpus = [\"sim0\"]\nmax_region = \"1MiB\"\n"
           "flows = [\"udp 10.99.0.0/24:* -> 10.99.0.2:" +
           std::to_string(port) + "\"]\niommu = \"any\"\n\n";
}

std::string flow(int port) {
    return "udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(port);
}

bool starts_with(const std::string &s, const std::string &prefix) {
    return s.rfind(prefix, 0) == 0;
}

// A raw peer-to-peer connection to the pod socket, as any program in a pod could make.
sd_bus *connect_peer(const std::string &address, bool as_bus_client = false) {
    sd_bus *bus = nullptr;
    if (sd_bus_new(&bus) < 0) return nullptr;
    if (sd_bus_set_address(bus, address.c_str()) < 0 ||
        sd_bus_set_bus_client(bus, as_bus_client) < 0 || sd_bus_negotiate_fds(bus, 1) < 0 ||
        sd_bus_start(bus) < 0) {
        sd_bus_unref(bus);
        return nullptr;
    }
    sd_bus_set_method_call_timeout(bus, 10'000'000);
    return bus;
}

// Calls a method with no arguments; "ok" or the error's name.
std::string call(sd_bus *bus, const char *dest, const char *path, const char *iface,
                 const char *member) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = nullptr;
    int r = sd_bus_call_method(bus, dest, path, iface, member, &e, &reply, "");
    std::string out = r >= 0 ? "ok" : (e.name ? e.name : std::string("errno ") + strerror(-r));
    sd_bus_error_free(&e);
    sd_bus_message_unref(reply);
    return out;
}

// The daemon's Version property over `bus`: "ok" when it answered.
std::string version(sd_bus *bus) {
    sd_bus_error e = SD_BUS_ERROR_NULL;
    char *v = nullptr;
    int r = sd_bus_get_property_string(bus, bus::service_name, bus::manager_path,
                                       bus::manager_interface, "Version", &e, &v);
    std::string out = r >= 0 ? "ok" : (e.name ? e.name : std::string("errno ") + strerror(-r));
    free(v);
    sd_bus_error_free(&e);
    return out;
}

class PodSocketTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
        char tmpl[] = "/tmp/knod-podsock-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        ::chmod(dir_.c_str(), 0755);
        tag_ = std::to_string(getpid());
    }
    void TearDown() override {
        std::error_code ec;
        if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
    }
    std::string socket_path() const { return dir_ + "/pod.sock"; }
    std::string address() const { return "unix:path=" + socket_path(); }
    std::vector<std::string> args(std::vector<std::string> more = {}) const {
        std::vector<std::string> a = {"--pod-socket", socket_path()};
        a.insert(a.end(), more.begin(), more.end());
        return a;
    }
    // Runs the rest as `uid` in `pod`, the client library pointed at the pod socket by the
    // documented variable (and no system bus in its environment).
    std::vector<std::string> in_pod(const TestPod &pod, uid_t uid) const {
        auto argv = pod.enter_as(uid);
        argv.insert(argv.end(), {"env", "-u", "DBUS_SYSTEM_BUS_ADDRESS",
                                 std::string(bus::pod_address_env) + "=" + address()});
        return argv;
    }
    std::string dir_, tag_;
};

// (a) A pod's process reaches the daemon over the pod socket, is identified as its pod (the
// journal's pod.namespace), gets a binding, and hears of its end over that connection.
TEST_F(PodSocketTest, APodsProcessIsServedAsItsPodAndToldOfItsBindingsEnd) {
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000), args());
    TestPod pod("knodps-a" + tag_, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    auto argv = in_pod(pod, nobody);
    argv.insert(argv.end(),
                {KNOD_TEST_CLIENT_BIN, "hold-until-end", "knodsim0", "sim0", "4096", flow(5000)});
    WatchedProcess holder(argv);
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.pod.namespace') FROM events WHERE kind = "
                    "'request-granted'"),
              "ml");
    // The binding's holder connection is the pod socket's, not the bus's.
    std::string id = s.sql("SELECT id FROM sessions");
    ASSERT_FALSE(id.empty());
    auto admin = s.client();
    ASSERT_TRUE(admin.revoke(id, "pod socket test").ok());
    EXPECT_TRUE(holder.wait_for("ended revoked")) << holder.output();
}

// A pod in a user namespace of its own (Kubernetes' hostUsers: false, rootless podman): its
// process says it is uid 0 in the SASL handshake, the kernel says 65534. The handshake is not
// what identifies it (SO_PEERCRED and its pidfd are), so it is served, as the uid the kernel gives.
TEST_F(PodSocketTest, APodInAUserNamespaceOfItsOwnIsServedAsTheUidTheKernelGives) {
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000), args());
    TestPod pod("knodps-u" + tag_, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    auto argv = in_pod(pod, nobody);
    argv.insert(argv.end(), {"unshare", "--user", "--map-root-user", KNOD_TEST_CLIENT_BIN,
                             "hold-until-end", "knodsim0", "sim0", "4096", flow(5000)});
    WatchedProcess holder(argv);
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.pod.namespace') FROM events WHERE kind = "
                    "'request-granted'"),
              "ml");
    EXPECT_EQ(s.sql("SELECT uid FROM sessions"), std::to_string(nobody));
    std::string id = s.sql("SELECT id FROM sessions");
    ASSERT_FALSE(id.empty());
    ASSERT_TRUE(s.client().revoke(id, "user namespace test").ok());
    EXPECT_TRUE(holder.wait_for("ended revoked")) << holder.output();
    // sd-bus's client names no uid in EXTERNAL; libdbus and GDBus name their own (0 inside):
    // the handshake they make is accepted too.
    auto raw = in_pod(pod, nobody);
    raw.insert(raw.end(),
               {"unshare", "--user", "--map-root-user", "python3", "-c",
                "import socket,sys\n"
                "s=socket.socket(socket.AF_UNIX)\n"
                "s.connect(sys.argv[1])\n"
                "s.sendall(b'\\0AUTH EXTERNAL 30\\r\\n')\n"
                "print('said', s.recv(256).decode(errors='replace').strip(), flush=True)\n",
                socket_path()});
    WatchedProcess handshake(raw);
    ASSERT_TRUE(handshake.wait_for("said ")) << handshake.output();
    EXPECT_TRUE(handshake.wait_for("said OK ")) << handshake.output();
}

// (e) A holder whose pod-socket connection closes (the process was killed) loses its binding.
TEST_F(PodSocketTest, AHoldersConnectionClosingEndsItsBinding) {
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000), args());
    TestPod pod("knodps-e" + tag_, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    auto argv = in_pod(pod, nobody);
    argv.insert(argv.end(),
                {KNOD_TEST_CLIENT_BIN, "hold-until-end", "knodsim0", "sim0", "4096", flow(5000)});
    WatchedProcess holder(argv);
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    holder.kill_now();
    EXPECT_TRUE(eventually([&] {
        std::string why = s.sql("SELECT end_reason FROM sessions");
        return why == "process-exit" || why == "disconnect";
    })) << s.sql("SELECT end_reason FROM sessions");
    EXPECT_TRUE(eventually([&] {
        auto l = s.client().list();
        return l.ok() && l->empty();
    }));
}

// (b) A host process, and a process in a network namespace no pod registered, are refused on
// the pod socket (journaled pod-refused, not-a-pod); the host's users use the system bus.
TEST_F(PodSocketTest, HostAndUnregisteredProcessesAreRefused) {
    Sandbox s(sim_rule("anyone", "any_caller = true", 5000), args());
    TestPod stranger("knodps-b" + tag_, "ml"); // made, never registered
    std::vector<std::string> host = {"env", "-u", "DBUS_SYSTEM_BUS_ADDRESS",
                                     std::string(bus::pod_address_env) + "=" + address()};
    Output o = s.run_client_with(host, {"hold", "knodsim0", "sim0", "4096", flow(5000)});
    EXPECT_TRUE(starts_with(o.out, "error")) << o.out;
    o = s.run_client_with(in_pod(stranger, nobody),
                          {"hold", "knodsim0", "sim0", "4096", flow(5000)});
    EXPECT_TRUE(starts_with(o.out, "error")) << o.out;
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) FROM events WHERE kind = 'pod-refused' AND decision = "
                     "'not-a-pod'") == "2";
    })) << s.sql("SELECT kind, decision, uid, pid, detail FROM events")
        << o.out;
    EXPECT_EQ(s.sql("SELECT count(*) FROM events WHERE kind = 'request-granted'"), "0");
    // The same host process on the system bus is served.
    o = s.run_client({"hold", "knodsim0", "sim0", "4096", flow(5000)}, nobody);
    EXPECT_TRUE(starts_with(o.out, "ok")) << o.out;
}

// (c) Over the pod socket there is no bus: no other service answers, the bus driver does not
// either (a bus client's Hello fails), and the host-only methods are refused.
TEST_F(PodSocketTest, NoOtherServiceIsReachableThroughIt) {
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000), args());
    TestPod pod("knodps-c" + tag_, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    ForkedChild c;
    std::string addr = address();
    c.start(pod.join(), [&](FILE *w, int) {
        sd_bus *bus = connect_peer(addr);
        if (!bus) {
            fprintf(w, "no connection\nend\n");
            return;
        }
        fprintf(w, "version %s\n", version(bus).c_str());
        fprintf(w, "driver %s\n",
                call(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                     "ListNames")
                    .c_str());
        fprintf(w, "systemd %s\n",
                call(bus, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                     "org.freedesktop.systemd1.Manager", "ListUnits")
                    .c_str());
        for (const char *m : {"ReloadPolicy", "GetHostReport", "GetMetrics", "CanManage"})
            fprintf(
                w, "%s %s\n", m,
                call(bus, bus::service_name, bus::manager_path, bus::manager_interface, m).c_str());
        sd_bus_unref(bus);
        // As a bus client it says Hello to a bus driver, which is not there.
        sd_bus *as_client = connect_peer(addr, true);
        fprintf(w, "hello %s\n", as_client && version(as_client) == "ok" ? "answered" : "no bus");
        if (as_client) sd_bus_unref(as_client);
        fprintf(w, "end\n");
    });
    ASSERT_TRUE(c.wait_for("end\n")) << c.said;
    EXPECT_NE(c.said.find("version ok\n"), std::string::npos) << c.said;
    EXPECT_EQ(c.said.find("driver ok"), std::string::npos) << c.said;
    EXPECT_EQ(c.said.find("systemd ok"), std::string::npos) << c.said;
    for (const char *m : {"ReloadPolicy", "GetHostReport", "GetMetrics", "CanManage"})
        EXPECT_NE(c.said.find(std::string(m) + " org.knod.Policy1.Error.Denied"), std::string::npos)
            << m << ": " << c.said;
    EXPECT_NE(c.said.find("hello no bus"), std::string::npos) << c.said;
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) FROM events WHERE kind = 'reload-refused'") == "1";
    })) << s.sql("SELECT kind, decision, reason FROM events");
}

// (d) A pod holding all the connections its sandbox may have stops no one else: another pod
// and the host's root (on the system bus) are served; its own next connection is refused.
TEST_F(PodSocketTest, APodAtItsBoundStopsNoOtherPodNorTheHostsRoot) {
    constexpr int bound = 4;
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000),
              args({"--max-pod-connections-per-pod", std::to_string(bound)}));
    TestPod greedy("knodps-d" + tag_, "ml"), other("knodps-o" + tag_, "ml");
    ASSERT_EQ(greedy.register_with(s), "");
    ASSERT_EQ(other.register_with(s), "");
    ForkedChild c;
    std::string addr = address();
    c.start(greedy.join(), [&](FILE *w, int go) {
        std::vector<sd_bus *> held;
        for (int i = 0; i < bound + 1; ++i) {
            sd_bus *bus = connect_peer(addr);
            std::string v = bus ? version(bus) : "no connection";
            fprintf(w, "conn%d %s\n", i, v.c_str());
            if (bus && v == "ok")
                held.push_back(bus); // a refused one is closed by the daemon: dropped
            else if (bus)
                sd_bus_unref(bus);
        }
        fprintf(w, "holding\n");
        char b;
        (void)!read(go, &b, 1); // until the parent has checked the others
        // One it closes (its process lives on) gives its place back.
        sd_bus_flush_close_unref(held.back());
        held.pop_back();
        bool again = false;
        for (int i = 0; i < 100 && !again; ++i) {
            sd_bus *bus = connect_peer(addr);
            again = bus && version(bus) == "ok";
            if (again)
                held.push_back(bus);
            else if (bus)
                sd_bus_unref(bus);
            if (!again) usleep(50'000);
        }
        fprintf(w, "reopened %s\n", again ? "ok" : "refused");
        (void)!read(go, &b, 1);
        for (auto *bus : held)
            sd_bus_unref(bus);
    });
    ASSERT_TRUE(c.wait_for("holding\n")) << c.said;
    for (int i = 0; i < bound; ++i)
        EXPECT_NE(c.said.find("conn" + std::to_string(i) + " ok"), std::string::npos) << c.said;
    EXPECT_EQ(c.said.find("conn" + std::to_string(bound) + " ok"), std::string::npos) << c.said;
    // Another pod is served meanwhile, and so is the host's root on the system bus.
    Output o =
        s.run_client_with(in_pod(other, nobody), {"hold", "knodsim0", "sim0", "4096", flow(5000)});
    EXPECT_TRUE(starts_with(o.out, "ok")) << o.out;
    o = s.run_client({"list"});
    EXPECT_TRUE(starts_with(o.out, "ok")) << o.out;
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) FROM events WHERE kind = 'rate-limited' AND "
                     "json_extract(detail, '$.limit') LIKE '%connections per pod%'") != "0";
    })) << s.sql("SELECT kind, decision, reason FROM events");
    // A connection its process closes is forgotten at once: the pod may connect again.
    ASSERT_EQ(::write(c.go, "x", 1), 1);
    EXPECT_TRUE(c.wait_for("reopened ")) << c.said;
    EXPECT_NE(c.said.find("reopened ok"), std::string::npos) << c.said;
}

} // namespace
} // namespace knod::test
