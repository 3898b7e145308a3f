// Signals about a binding reach only those who may list it (its owner, auditors, admins), and
// its holder learns why it ended. Real dbus-daemon with the shipped bus policy, real daemon,
// listeners that are other processes and other uids: a subscriber with a plain match rule (the
// test client's `watch`) and dbus-monitor, which an ordinary user may run (its eavesdropping
// is refused by the bus, so it sees what a match rule gets).
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <map>
#include <sstream>

using namespace knod;
using namespace knod::test;

namespace {

const uid_t nobody = 65534;
const uid_t auditor = 33;     // www-data: in the auditor group below only by its process
const gid_t auditor_gid = 38; // "list" on Debian: any group that exists will do

const std::string policy_text = R"(
[settings]
auditor_group = "list"

[[rule]]
name = "root-rule"
users = [0]
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"

[[rule]]
name = "sim-everyone"
any_caller = true
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
)";

// A child process as `uid` (with exactly `groups` as its supplementary groups), whose output
// the test reads as it comes. Killed when it goes.
class Process {
  public:
    Process(const std::vector<std::string> &argv, uid_t uid, std::vector<gid_t> groups = {}) {
        std::vector<std::string> full;
        if (uid != 0) {
            full = {"setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(uid)};
            if (groups.empty()) {
                full.push_back("--clear-groups");
            } else {
                std::string list;
                for (gid_t g : groups)
                    list += (list.empty() ? "" : ",") + std::to_string(g);
                full.push_back("--groups=" + list);
            }
        }
        full.insert(full.end(), argv.begin(), argv.end());
        int in[2], out[2];
        if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            dup2(out[1], 2);
            exec_argv(full);
        }
        close(in[0]);
        close(out[1]);
        stdin_ = in[1];
        stdout_ = out[0];
    }
    ~Process() {
        if (stdin_ >= 0) close(stdin_);
        if (stdout_ >= 0) close(stdout_);
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }

    // Reads until `needle` has appeared `times` times in the output, or `ms` pass.
    bool wait_for(const std::string &needle, int times = 1, int ms = 30000) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        while (count(needle) < static_cast<std::size_t>(times)) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            end - std::chrono::steady_clock::now())
                            .count();
            if (left <= 0 || stdout_ < 0) return false;
            struct pollfd p = {stdout_, POLLIN, 0};
            if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
            char buf[4096];
            ssize_t n = read(stdout_, buf, sizeof buf);
            if (n <= 0) {
                close(stdout_);
                stdout_ = -1;
            } else {
                out_.append(buf, static_cast<std::size_t>(n));
            }
        }
        return true;
    }
    // Waits for the process to exit (within `ms`); its exit status, or -1.
    int wait_exit(int ms = 30000) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        int status = -1;
        while (std::chrono::steady_clock::now() < end) {
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                wait_for("\x01never", 1, 200); // what it wrote last
                return status;
            }
            wait_for("\x01never", 1, 20);
        }
        return -1;
    }
    std::size_t count(const std::string &needle) const {
        std::size_t n = 0;
        for (auto at = out_.find(needle); at != std::string::npos; at = out_.find(needle, at + 1))
            ++n;
        return n;
    }
    bool saw(const std::string &needle) const { return count(needle) > 0; }
    // The word after `prefix` in the output ("granted binding ID ..." -> ID).
    std::string word_after(const std::string &prefix) const {
        auto at = out_.find(prefix);
        if (at == std::string::npos) return {};
        std::istringstream in(out_.substr(at + prefix.size()));
        std::string w;
        in >> w;
        return w;
    }
    const std::string &output() const { return out_; }

  private:
    pid_t pid_ = -1;
    int stdin_ = -1, stdout_ = -1;
    std::string out_;
};

std::vector<std::string> watch() {
    return {KNOD_TEST_CLIENT_BIN, "watch"};
}

Result<client::GrantedBinding> request(client::Client &c, const std::string &flow) {
    int fd = make_region(4096);
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow});
    close(fd);
    return g;
}

} // namespace

TEST(BindingSignals, ReachOnlyTheOwnerAuditorsAndAdmins) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
    Sandbox sb(policy_text);
    Process nobody_sub(watch(), nobody);
    Process nobody_monitor({"dbus-monitor", "--address", sb.address()}, nobody);
    Process root_sub(watch(), 0);
    Process auditor_sub(watch(), auditor, {auditor_gid});
    for (auto *p : {&nobody_sub, &root_sub, &auditor_sub})
        ASSERT_TRUE(p->wait_for("ready")) << (p == &root_sub     ? "root"
                                              : p == &nobody_sub ? "nobody"
                                                                 : "auditor")
                                          << p->output();
    auto c = sb.client();
    // PolicyReloaded is for everyone: once each listener has seen one, its match rule is in
    // place (dbus-monitor adds its own a while after it starts), and once it has seen the last,
    // it has received everything the daemon sent before.
    std::vector<Process *> listeners = {&nobody_sub, &nobody_monitor, &root_sub, &auditor_sub};
    auto all_heard = [&](int ms) {
        for (auto *p : listeners)
            if (!p->wait_for("PolicyReloaded", 1, ms)) return false;
        return true;
    };
    for (int i = 0; i < 50 && !all_heard(0); ++i) {
        ASSERT_TRUE(c.reload().ok());
        all_heard(200);
    }
    for (auto *p : listeners)
        ASSERT_TRUE(p->saw("PolicyReloaded")) << p->output();
    std::map<Process *, int> heard;
    for (auto *p : listeners)
        heard[p] = static_cast<int>(p->count("PolicyReloaded"));

    // Root binds, activates and releases one binding; an admin revokes another.
    auto g1 = request(c, "udp 10.99.0.1:* -> 10.99.0.2:5000");
    ASSERT_TRUE(g1.ok()) << g1.error().message;
    ASSERT_TRUE(c.activate(g1->id, g1->key).ok());
    ASSERT_TRUE(c.release(g1->id).ok());
    auto g2 = request(c, "udp 10.99.0.1:* -> 10.99.0.2:5001");
    ASSERT_TRUE(g2.ok()) << g2.error().message;
    // Whether the daemon counts the auditor-group member as an auditor (its supplementary groups
    // must come from its process): the signals must agree with what it may list.
    Process auditor_list({KNOD_TEST_CLIENT_BIN, "list"}, auditor, {auditor_gid});
    ASSERT_TRUE(auditor_list.wait_for("ok")) << auditor_list.output();
    auditor_list.wait_exit();
    // Its groups come from its process: the daemon counts it as an auditor.
    ASSERT_TRUE(auditor_list.saw(g2->id)) << auditor_list.output();
    ASSERT_TRUE(c.revoke(g2->id, "maintenance window").ok());
    // nobody's own binding, from another of its processes.
    Holder own(sb, {"knodsim0", "sim0", "4096", "udp 10.99.0.3:* -> 10.99.0.2:5002"}, nobody);
    ASSERT_TRUE(own.ok()) << own.line();
    // The fences: the daemon sends each listener its messages in order, so once a subscriber
    // has the signals of nobody's binding (the last things it is told: BindingCreated with its
    // id, then InterfacesAdded with its flow), it has everything sent to it before. Its id alone
    // is no fence: BindingCreated comes first, and a loaded machine showed InterfacesAdded still
    // on its way. dbus-monitor hears only broadcasts: one more reload is its fence. (A count of
    // PolicyReloaded alone is no fence: one of an earlier reload may still be on its way.)
    for (auto *p : {&nobody_sub, &root_sub, &auditor_sub}) {
        ASSERT_TRUE(p->wait_for(own.id(), 1, 30000)) << p->output();
        ASSERT_TRUE(p->wait_for("10.99.0.3", 1, 30000)) << p->output();
    }
    ASSERT_TRUE(c.reload().ok());
    ASSERT_TRUE(nobody_monitor.wait_for("PolicyReloaded", heard[&nobody_monitor] + 1, 30000))
        << nobody_monitor.output();

    // Nothing of root's bindings reaches uid 65534, subscribed or monitoring.
    for (auto *p : {&nobody_sub, &nobody_monitor})
        for (const std::string &secret :
             {g1->id, g2->id, g1->key_id, g2->key_id, std::string("10.99.0.1"),
              std::string("root-rule"), std::string("maintenance window")})
            EXPECT_FALSE(p->saw(secret)) << "uid 65534 learnt '" << secret << "':\n" << p->output();
    // ... but its own binding's news do (to the subscribed connection).
    EXPECT_TRUE(nobody_sub.saw(own.id())) << nobody_sub.output();
    EXPECT_TRUE(nobody_sub.saw("10.99.0.3")) << nobody_sub.output();

    // Root and the auditor-group member see every step, with the details Get would show them.
    for (auto *p : {&root_sub, &auditor_sub}) {
        const std::string &out = p->output();
        EXPECT_TRUE(p->saw("signal BindingCreated")) << out;
        EXPECT_TRUE(p->saw("signal InterfacesAdded")) << out;
        EXPECT_TRUE(p->saw(g1->key_id)) << out;
        EXPECT_TRUE(p->saw("10.99.0.1:* -> 10.99.0.2:5000")) << out;
        EXPECT_TRUE(p->saw("OwnerUid")) << out;
        EXPECT_TRUE(p->saw("root-rule")) << out;
        EXPECT_TRUE(p->saw("signal PropertiesChanged /org/knod/Policy1/bindings/" + g1->id)) << out;
        EXPECT_TRUE(p->saw("\"active\"")) << out;
        EXPECT_TRUE(p->saw("signal BindingReleased")) << out;
        EXPECT_TRUE(p->saw("\"revoke: maintenance window\"")) << out;
        EXPECT_TRUE(p->saw("signal InterfacesRemoved")) << out;
        EXPECT_TRUE(p->saw(own.id())) << "others' bindings too: " << out;
    }
}

TEST(BindingSignals, TheHolderLearnsWhyItsBindingEnded) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
    Sandbox sb(policy_text);
    auto admin = sb.client();
    // The example client, as an ordinary user, waiting for data when an admin revokes it.
    Process example(
        {KNOD_EXAMPLE_BIN, "--flow", "udp 10.99.0.1:* -> 10.99.0.2:5000", "--timeout-ms", "20000"},
        nobody);
    ASSERT_TRUE(example.wait_for("waiting for data")) << example.output();
    std::string id = example.word_after("granted binding ");
    ASSERT_FALSE(id.empty()) << example.output();
    ASSERT_TRUE(admin.revoke(id, "maintenance window").ok());
    EXPECT_TRUE(example.wait_for("binding " + id + " ended: revoke: maintenance window"))
        << example.output();
    int status = example.wait_exit();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;

    // A holder whose binding a reload no longer allows is told so, as revoked.
    Process holder({KNOD_TEST_CLIENT_BIN, "hold-until-end", "knodsim0", "sim0", "4096",
                    "udp 10.99.0.1:* -> 10.99.0.2:5001"},
                   nobody);
    ASSERT_TRUE(holder.wait_for("ok ")) << holder.output();
    sb.write_policy(R"([[rule]]
name = "root-only"
users = [0]
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
)");
    ASSERT_TRUE(admin.reload().ok());
    EXPECT_TRUE(holder.wait_for("ended revoked policy-reload")) << holder.output();

    // The library tells its own holder (no subscription needed), through end_of.
    auto mine = request(admin, "udp 10.99.0.1:* -> 10.99.0.2:5002");
    ASSERT_TRUE(mine.ok()) << mine.error().message;
    auto before = admin.end_of(mine->id);
    ASSERT_TRUE(before.ok());
    EXPECT_FALSE(before->has_value());
    ASSERT_TRUE(admin.release(mine->id).ok());
    auto end = admin.wait_for_end(mine->id, 5000);
    ASSERT_TRUE(end.ok()) << end.error().message;
    EXPECT_FALSE(end->revoked);
    EXPECT_EQ(end->reason, "release");
}

// A holder that did not subscribe hears the end of each of its bindings on the connection it
// asked from, and nothing else: the rest (BindingCreated, InterfacesAdded, PropertiesChanged,
// InterfacesRemoved) repeats what its own calls' replies told it and is for subscribers.
TEST(BindingSignals, AHolderThatDidNotSubscribeHearsOnlyItsBindingsEnds) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
    Sandbox sb(policy_text);
    auto admin = sb.client();
    Process holder({KNOD_TEST_CLIENT_BIN, "watch-own", "udp 10.99.0.1:* -> 10.99.0.2:5000",
                    "udp 10.99.0.1:* -> 10.99.0.2:5001"},
                   0);
    ASSERT_TRUE(holder.wait_for("ready ")) << holder.output();
    std::string second = holder.word_after("ready ");
    ASSERT_TRUE(admin.revoke(second, "maintenance window").ok());
    // The fence: the daemon sends a connection its signals in order, and the revoke's is last.
    ASSERT_TRUE(holder.wait_for("signal BindingRevoked", 1, 30000)) << holder.output();
    EXPECT_TRUE(holder.saw("\"revoke: maintenance window\"")) << holder.output();
    EXPECT_EQ(holder.count("signal BindingReleased"), 1u) << holder.output();
    EXPECT_TRUE(holder.saw("\"release\"")) << holder.output();
    for (const char *other : {"signal BindingCreated", "signal InterfacesAdded",
                              "signal PropertiesChanged", "signal InterfacesRemoved"})
        EXPECT_FALSE(holder.saw(other)) << holder.output();
}

// A client may address any signal to the daemon, NameOwnerChanged included: only the bus's own
// says that a connection left. Before, one such signal from uid 65534 naming the holder's
// connection ended root's binding as "disconnect".
TEST(BindingSignals, ASpoofedNameOwnerChangedEndsNothing) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
    Sandbox sb(policy_text);
    Holder h(sb, {"knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5000"});
    ASSERT_TRUE(h.ok()) << h.line();
    // Every unique name on the bus, the holder's among them, "left" (old owner, no new one).
    Output names =
        sb.run_program({"busctl", "--address=" + sb.address(), "list", "--unique", "--no-legend"});
    std::istringstream lines(names.out);
    std::string line;
    int sent = 0;
    while (std::getline(lines, line)) {
        std::string name = line.substr(0, line.find(' '));
        if (name.empty() || name[0] != ':') continue;
        Output o =
            sb.run_program({"busctl", "--address=" + sb.address(), "emit",
                            "--destination=org.knod.Policy1", "/org/freedesktop/DBus",
                            "org.freedesktop.DBus", "NameOwnerChanged", "sss", name, name, ""},
                           nobody);
        if (o.status == 0) ++sent;
    }
    ASSERT_GT(sent, 0) << names.out;
    // The daemon has read them once it answers a call sent after them.
    auto c = sb.client();
    auto listed = c.list();
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].id, h.id());
    EXPECT_EQ(sb.sql("select count(*) from sessions where end_reason is not null"), "0");
}
