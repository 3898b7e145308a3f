// Who the caller is, as the daemon decides it: groups of the calling process (not of the user
// database), the system manager's unit (not one the caller made itself), a daemon that runs
// without root as the shipped unit runs it, and a state dir that must be the daemon's own.
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

const uid_t nobody = 65534;
const std::string flow_5000 = "udp 10.99.0.1:* -> 10.99.0.2:5000";
const std::string flow_5001 = "udp 10.99.0.1:* -> 10.99.0.2:5001";

// A rule body for the sim: for `who` (anyone when empty), on one port.
std::string sim_rule(const std::string &name, const std::string &who, int port) {
    return "[[rule]]\nname = \"" + name + "\"\n" + (who.empty() ? "any_caller = true" : who) +
           "\nnetdevs = [\"knodsim0\"]\ngpus = [\"sim0\"]\nmax_region = \"1MiB\"\n"
           "flows = [\"udp 10.99.0.0/24:* -> 10.99.0.2:" +
           std::to_string(port) + "\"]\niommu = \"any\"\n\n";
}

// setpriv as `uid`, with primary gid `gid` and exactly the supplementary `groups`.
std::vector<std::string> as(uid_t uid, gid_t gid, const std::vector<gid_t> &groups = {}) {
    std::vector<std::string> argv = {"setpriv", "--reuid=" + std::to_string(uid),
                                     "--regid=" + std::to_string(gid)};
    if (groups.empty()) {
        argv.push_back("--clear-groups");
    } else {
        std::string list;
        for (gid_t g : groups)
            list += (list.empty() ? "" : ",") + std::to_string(g);
        argv.push_back("--groups=" + list);
    }
    return argv;
}

// One request, released at once (the client exits): "ok ID KEY" or "error NAME: message".
Output request_once(const Sandbox &s, const std::vector<std::string> &prefix,
                    const std::string &flow) {
    return s.run_client_with(prefix, {"hold", "knodsim0", "sim0", "4096", flow});
}

bool starts_with(const std::string &s, const std::string &prefix) {
    return s.rfind(prefix, 0) == 0;
}

class IdentityTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
    }
};

} // namespace

// Failure 5: a `groups` rule sees the groups the process holds. A process that holds a gid no
// group file lists is granted; one that dropped its primary group is not.
TEST_F(IdentityTest, GroupRulesSeeTheProcesssGroupsNotTheUserDatabase) {
    Sandbox s(sim_rule("gid-4242", "groups = [4242]", 5000) +
              sim_rule("nogroup", "groups = [65534]", 5001));
    EXPECT_TRUE(starts_with(request_once(s, as(nobody, nobody), flow_5000).out, "error"));
    EXPECT_TRUE(starts_with(request_once(s, as(nobody, nobody, {4242}), flow_5000).out, "ok"))
        << "a process holding gid 4242 (in no group file) matches groups = [4242]";
    // nobody's primary group in the user database is 65534; this process does not hold it.
    Output dropped = request_once(s, as(nobody, 4343), flow_5001);
    EXPECT_TRUE(starts_with(dropped.out, "error")) << dropped.out;
    EXPECT_TRUE(starts_with(request_once(s, as(nobody, nobody), flow_5001).out, "ok"))
        << "the effective gid counts";
}

// Failure 5: admin_group and auditor_group are checked against the process's groups too.
TEST_F(IdentityTest, AdminAndAuditorGroupsAreTheProcesss) {
    Sandbox s("[settings]\nadmin_group = \"4244\"\nauditor_group = \"4245\"\n\n" +
              sim_rule("anyone", "", 5000));
    Holder h(s, {"knodsim0", "sim0", "4096", flow_5000});
    ASSERT_TRUE(h.ok()) << h.line();
    EXPECT_EQ(s.run_client_with(as(nobody, nobody), {"list"}).out, "ok");
    EXPECT_EQ(s.run_client_with(as(nobody, nobody, {4245}), {"list"}).out, "ok " + h.id())
        << "an auditor-group process sees every binding";
    EXPECT_TRUE(starts_with(
        s.run_client_with(as(nobody, nobody, {4245}), {"revoke", h.id(), "test"}).out, "error"));
    // An empty reason is bad input: refused as such before anyone is asked whether the caller
    // is an admin (the admin check may ask polkit, which is slow and may prompt).
    Output no_reason = s.run_client_with(as(nobody, nobody), {"revoke", h.id(), ""});
    EXPECT_NE(no_reason.out.find("say why you revoke"), std::string::npos) << no_reason.out;
    EXPECT_EQ(s.run_client_with(as(nobody, nobody, {4244}), {"list"}).out, "ok " + h.id());
    EXPECT_EQ(s.run_client_with(as(nobody, nobody, {4244}), {"revoke", h.id(), "test"}).out, "ok")
        << "a non-root process holding the admin gid may revoke";
    EXPECT_EQ(s.run_client({"list"}).out, "ok");
}

namespace {

// The cgroup v2 hierarchy's mount point, or empty.
std::string cgroup2_root() {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        auto dash = line.find(" - ");
        if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
        std::istringstream f(line);
        std::string id, parent, dev, root, mount;
        f >> id >> parent >> dev >> root >> mount;
        return mount;
    }
    return {};
}

// Cgroups the test makes under the v2 root (and only those), removed deepest first.
class TestCgroup {
  public:
    TestCgroup(const std::string &root, const std::string &path) {
        std::string at = root;
        std::istringstream parts(path);
        std::string part;
        while (std::getline(parts, part, '/')) {
            if (part.empty()) continue;
            at += "/" + part;
            if (::mkdir(at.c_str(), 0755) == 0)
                made_.push_back(at);
            else if (errno != EEXIST)
                return;
        }
        dir_ = at;
    }
    ~TestCgroup() {
        for (auto it = made_.rbegin(); it != made_.rend(); ++it)
            ::rmdir(it->c_str());
    }
    bool ok() const { return !dir_.empty(); }
    const std::string &dir() const { return dir_; }
    // A prefix that moves the process into this cgroup, then runs the rest as `uid`.
    std::vector<std::string> enter_as(uid_t uid) const {
        std::vector<std::string> argv = {
            "sh", "-c", "echo $$ > '" + dir_ + "/cgroup.procs' && exec \"$@\"", "sh"};
        auto who = as(uid, uid);
        argv.insert(argv.end(), who.begin(), who.end());
        return argv;
    }

  private:
    std::string dir_;
    std::vector<std::string> made_;
};

} // namespace

// Failure 6: a unit the caller created under its own user manager is no system unit.
TEST_F(IdentityTest, UnitsAreTheSystemManagersUnitOnly) {
    std::string root = cgroup2_root();
    if (root.empty() || ::access((root + "/cgroup.procs").c_str(), W_OK) != 0)
        GTEST_SKIP() << "no writable cgroup v2 hierarchy";
    std::string tag = std::to_string(getpid());
    TestCgroup evil(root, "user.slice/user-65534.slice/user@65534.service/app.slice/"
                          "inference@evil" +
                              tag + ".service");
    TestCgroup good(root, "system.slice/inference@good" + tag + ".service");
    ASSERT_TRUE(evil.ok() && good.ok());
    Sandbox s(sim_rule("system-unit", "units = [\"inference@*.service\"]", 5000) +
              sim_rule("user-unit", "user_units = [\"inference@*.service\"]", 5001));
    Output o = request_once(s, evil.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(o.out, "error")) << o.out;
    EXPECT_NE(o.out.find("caller unit 'user@65534.service'"), std::string::npos) << o.out;
    o = request_once(s, evil.enter_as(nobody), flow_5001);
    EXPECT_TRUE(starts_with(o.out, "ok")) << "user_units names the user manager's units: " << o.out;
    o = request_once(s, good.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(o.out, "ok")) << "a real system unit matches: " << o.out;
    o = request_once(s, good.enter_as(nobody), flow_5001);
    EXPECT_TRUE(starts_with(o.out, "error")) << o.out;
}

// Failure 10: the daemon as its own account with only the unit's capabilities (no CAP_KILL)
// serves other users: bind, activate, release; and an admin-group member revokes.
TEST_F(IdentityTest, DaemonWithTheUnitsCapabilitiesServesOtherUsers) {
    // An account with a name (the bus policy names users) that is neither root nor a caller.
    struct passwd *pw = getpwnam("daemon");
    if (!pw) GTEST_SKIP() << "no 'daemon' account to run the daemon as";
    const uid_t daemon_uid = pw->pw_uid;
    Sandbox s("[settings]\nadmin_group = \"4244\"\n\n" + sim_rule("anyone", "", 5000), {},
              daemon_uid);
    Holder h(s, {"knodsim0", "sim0", "4096", flow_5000}, nobody, /*activate=*/true);
    ASSERT_TRUE(h.ok()) << h.line();
    EXPECT_EQ(s.run_client({"list"}, nobody).out, "ok " + h.id());
    EXPECT_EQ(s.run_client({"release", h.id()}, nobody).out, "ok");
    EXPECT_EQ(s.run_client({"list"}, nobody).out, "ok");

    Holder h2(s, {"knodsim0", "sim0", "4096", flow_5000}, nobody, /*activate=*/true);
    ASSERT_TRUE(h2.ok()) << h2.line();
    // The bus accepts only uids with a user name: the owner itself stands in for another user;
    // revoking needs the admin group, owner or not.
    Output refused = s.run_client_with(as(nobody, nobody), {"revoke", h2.id(), "test"});
    EXPECT_NE(refused.out.find("Error.Denied"), std::string::npos) << refused.out;
    EXPECT_EQ(s.run_client_with(as(nobody, nobody, {4244}), {"revoke", h2.id(), "test"}).out, "ok");
    EXPECT_EQ(s.run_client({"list"}, nobody).out, "ok");
    struct stat st {};
    ASSERT_EQ(::stat(s.journal().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, daemon_uid);
    EXPECT_EQ(st.st_mode & 0777, 0600u); // the daemon's alone: auditors read snapshot/ (#33)
}

namespace {

// Runs the daemon against `state_dir` until it exits, refusing the state dir before it looks
// for a bus; returns stderr. Exit 78 (EX_CONFIG): the unit's RestartPreventExitStatus= keeps
// systemd from restarting it into the same refusal (#17 item 8).
std::string start_and_fail(const std::string &work, const std::string &state_dir) {
    std::string policy = work + "/policy.toml";
    std::ofstream(policy) << sim_policy;
    std::string log = work + "/daemon.log";
    pid_t pid = fork();
    if (pid == 0) {
        int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execl(KNOD_DAEMON_BIN, KNOD_DAEMON_BIN, "--bus-address=unix:path=/nonexistent/bus",
              "--policy", policy.c_str(), "--state-dir", state_dir.c_str(), "--driver=sim",
              "--sim-datapath=false", static_cast<char *>(nullptr));
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 78) << status;
    return slurp(log);
}

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/knod-state-test.XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

} // namespace

// Failure 12: a state dir that is not the daemon's own is refused, naming the fix.
TEST_F(IdentityTest, StateDirNotTheDaemonsOwnIsRefused) {
    TempDir t;
    std::string state = t.path + "/state";
    ASSERT_EQ(::mkdir(state.c_str(), 0700), 0);
    ASSERT_EQ(::chown(state.c_str(), nobody, nobody), 0);
    std::string err = start_and_fail(t.path, state);
    EXPECT_NE(err.find("refusing to start"), std::string::npos) << err;
    EXPECT_NE(err.find("fix: chown"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(state + "/journal.db")) << "nothing was created in it";

    ASSERT_EQ(::chown(state.c_str(), 0, 0), 0);
    ASSERT_EQ(::chmod(state.c_str(), 0777), 0);
    err = start_and_fail(t.path, state);
    EXPECT_NE(err.find("fix: chmod 0700"), std::string::npos) << err;

    // A journal someone else made, in a dir that is ours.
    ASSERT_EQ(::chmod(state.c_str(), 0700), 0);
    std::string journal = state + "/journal.db";
    ::close(::open(journal.c_str(), O_WRONLY | O_CREAT, 0644));
    ASSERT_EQ(::chown(journal.c_str(), nobody, nobody), 0);
    err = start_and_fail(t.path, state);
    EXPECT_NE(err.find("journal.db belongs to"), std::string::npos) << err;
}

// Failure 12: the daemon's own journal left world-readable is tightened to 0600 (the auditors
// read the published snapshot, #33), its key secret left group-readable to 0600 (and said so); a
// link planted at the anchor's old temporary path is never followed.
TEST_F(IdentityTest, StateFilesArePrivateAndLinksAreNotFollowed) {
    Sandbox s(sim_policy);
    s.stop_daemon(SIGTERM);
    std::string precious = s.dir() + "/precious";
    std::ofstream(precious) << "keep me\n";
    std::string anchor = s.journal() + ".anchor";
    for (const std::string &link : {anchor + ".tmp", anchor + ".tmp.1"})
        ASSERT_EQ(::symlink(precious.c_str(), link.c_str()), 0);
    ASSERT_EQ(::chmod(s.journal().c_str(), 0664), 0);
    std::string secret = s.state_dir() + "/key-secret";
    ASSERT_EQ(::chmod(secret.c_str(), 0640), 0);
    s.start_daemon();
    struct stat st {};
    ASSERT_EQ(::stat(s.journal().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(secret.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    std::string log = slurp(s.dir() + "/daemon.log");
    EXPECT_NE(log.find("journal.db had mode 0664; tightened to 0600"), std::string::npos) << log;
    EXPECT_NE(log.find("key-secret had mode 0640; tightened to 0600"), std::string::npos) << log;
    // Journal writes move the anchor.
    for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(starts_with(request_once(s, {}, flow_5000).out, "ok"));
    EXPECT_TRUE(eventually([&] { return slurp(anchor).find("\"seq\"") != std::string::npos; }));
    EXPECT_EQ(slurp(precious), "keep me\n");
    ASSERT_EQ(::lstat(anchor.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u); // as the journal
    ASSERT_EQ(::lstat(s.state_dir().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// #16 item 5 and #33 item 4: the packaged layout. The state dir is 2750 daemon:auditors
// (tmpfiles.d). The live journal is the daemon's alone (0600: a reader of a WAL database can
// lock bytes of its -shm that every commit needs); the daemon publishes a snapshot in
// snapshot/ (0750 dir, 0640 files, the auditors' group), and an auditor's `audit` given the
// live journal reads that, saying so; someone outside the group reads neither (exit 2).
TEST_F(IdentityTest, AuditorsOfTheStateDirsGroupReadThePublishedSnapshot) {
    struct passwd *pw = getpwnam("daemon");
    if (!pw) GTEST_SKIP() << "no 'daemon' account to run the daemon as";
    const uid_t daemon_uid = pw->pw_uid;
    const gid_t auditors = 4260;
    const uid_t auditor = 4261, outsider = 4262;
    Sandbox s(sim_policy, {"--linux-audit=false", "--snapshot-interval=1"}, daemon_uid,
              /*start=*/false);
    ASSERT_EQ(::chown(s.state_dir().c_str(), daemon_uid, auditors), 0);
    ASSERT_EQ(::chmod(s.state_dir().c_str(), 02750), 0);
    s.start_daemon();
    for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(starts_with(request_once(s, {}, flow_5000).out, "ok"));
    std::string db = s.journal();
    EXPECT_TRUE(eventually([&] { return fs::exists(db + "-shm"); }));
    for (const char *suffix : {"", "-wal", "-shm", ".anchor"}) {
        struct stat st {};
        ASSERT_EQ(::stat((db + suffix).c_str(), &st), 0) << suffix;
        EXPECT_EQ(st.st_mode & 0777, 0600u) << suffix;
    }
    struct stat st {};
    ASSERT_EQ(::stat((s.state_dir() + "/key-secret").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    std::string snapshot = s.state_dir() + "/snapshot/journal.db";
    // The snapshot catches up with the live journal (at most a second after its last commit).
    // Against the live database's newest event, not its anchor: the anchor may trail the
    // newest asynchronous commits by up to 100 ms (docs/audit.md), and a snapshot taken before
    // the grants matched that stale anchor once.
    auto newest = [&] { return std::atoll(s.sql("SELECT max(seq) FROM events").c_str()); };
    EXPECT_TRUE(eventually([&] {
        return slurp(snapshot + ".anchor").find("\"snapshot\"") != std::string::npos &&
               nlohmann::json::parse(slurp(snapshot + ".anchor"), nullptr, false).value("seq", 0) ==
                   newest();
    })) << slurp(snapshot + ".anchor")
        << " vs the newest event " << newest();
    ASSERT_EQ(::stat((s.state_dir() + "/snapshot").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0750u);
    EXPECT_EQ(st.st_gid, auditors);
    for (const char *suffix : {"", ".anchor"}) {
        ASSERT_EQ(::stat((snapshot + suffix).c_str(), &st), 0) << suffix;
        EXPECT_EQ(st.st_mode & 0777, 0640u) << suffix;
        EXPECT_EQ(st.st_gid, auditors) << suffix;
    }

    auto audit = [&](uid_t uid, bool member, const std::string &sub) {
        std::vector<std::string> argv{"setpriv",
                                      "--reuid=" + std::to_string(uid),
                                      "--regid=" + std::to_string(uid),
                                      member ? "--groups=" + std::to_string(auditors)
                                             : std::string("--clear-groups"),
                                      "sh",
                                      "-c",
                                      "exec \"$0\" audit " + sub + " --db \"$1\" 2>&1",
                                      KNOD_CLI_BIN,
                                      db};
        return s.run_program(argv);
    };
    for (std::string sub : {"verify --no-system-journal", "sessions", "events"}) {
        auto out = audit(auditor, true, sub);
        EXPECT_EQ(out.status, 0) << sub << ": " << out.out;
        EXPECT_NE(out.out.find("reading its published snapshot " + snapshot), std::string::npos)
            << out.out;
        if (sub.rfind("verify", 0) == 0) {
            EXPECT_NE(out.out.find("matches the head kept outside the database"), std::string::npos)
                << out.out;
            EXPECT_NE(out.out.find("snapshot: a copy of '" + db + "'"), std::string::npos)
                << out.out;
        }
        out = audit(outsider, false, sub);
        EXPECT_TRUE(WIFEXITED(out.status) && WEXITSTATUS(out.status) == 2)
            << sub << ": " << out.out;
        EXPECT_NE(out.out.find("cannot read the journal"), std::string::npos) << out.out;
        EXPECT_NE(out.out.find("Permission denied"), std::string::npos) << out.out;
    }
    // The auditor's sessions are the daemon's: three grants, in the copy.
    auto listed = audit(auditor, true, "sessions --json");
    EXPECT_EQ(nlohmann::json::parse(listed.out.substr(listed.out.find('[')), nullptr, false).size(),
              3u)
        << listed.out;
    EXPECT_EQ(s.stop_daemon(SIGTERM), 0);
}

namespace {

// Writes `text` to a file (a /proc/sys knob, cgroup.procs); whether it was taken.
bool write_file(const std::string &path, const std::string &text) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return ok;
}

// Moves the calling process into the unit whose cgroup directory is `dir`.
std::function<bool()> join_cgroup(const std::string &dir) {
    return [dir] { return write_file(dir + "/cgroup.procs", "0"); };
}

// The recycled-pid attack of issue #32, played for real. A process of `uid` outside the unit
// connects to the bus (the bus takes its pid from SO_PEERCRED at connect(2)), forks a child that
// keeps the socket, and exits. The test then forks, with /proc/sys/kernel/ns_last_pid set just
// below the attacker's pid, a process of the same uid that joins the unit's cgroup: the
// attacker's pid now names a process of the unit. The child finishes the bus handshake on the
// inherited socket, tries to attest with a socketpair of its own, and asks for a binding.
// Returns what the child saw ("attest: ..." and "request: ..." lines), or "" when the pid could
// not be recycled (another process on the machine took it each time).
std::string recycled_pid_attack(const Sandbox &s, const std::function<bool()> &join, uid_t uid,
                                const std::string &flow) {
    std::string bus_path = s.dir() + "/bus";
    int go[2], result[2], connected[2];
    if (pipe2(go, O_CLOEXEC) != 0 || pipe2(result, O_CLOEXEC) != 0 ||
        pipe2(connected, O_CLOEXEC) != 0)
        return "";
    pid_t attacker = fork();
    if (attacker == 0) {
        if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) _exit(1);
        int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::snprintf(a.sun_path, sizeof a.sun_path, "%s", bus_path.c_str());
        if (sock < 0 || ::connect(sock, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) _exit(1);
        if (fork() == 0) { // the child that inherits the connection
            // Only the test may hold the write end of `go`: closing it is how the test says
            // "no process took the pid" (end of file), and a copy here would wait for ever.
            close(go[1]);
            close(result[0]);
            close(connected[0]);
            close(connected[1]);
            char c;
            if (::read(go[0], &c, 1) != 1) _exit(1);
            std::string said;
            sd_bus *bus = nullptr;
            if (sd_bus_new(&bus) < 0 || sd_bus_set_fd(bus, sock, sock) < 0 ||
                sd_bus_set_bus_client(bus, 1) < 0 || sd_bus_start(bus) < 0) {
                said = "bus: cannot finish the handshake\n";
            } else {
                auto call = [&](const char *member, auto &&...args) {
                    sd_bus_error e = SD_BUS_ERROR_NULL;
                    sd_bus_message *reply = nullptr;
                    int r =
                        sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                           "org.knod.Policy1.Manager", member, &e, &reply, args...);
                    std::string out = r >= 0 ? "ok"
                                             : std::string(e.name ? e.name : "?") + ": " +
                                                   (e.message ? e.message : "");
                    sd_bus_error_free(&e);
                    sd_bus_message_unref(reply);
                    return out;
                };
                int pair[2];
                socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair);
                said += "attest: " + call("AttestProcess", "h", pair[0]) + "\n";
                int region = make_region(4096);
                said += "request: " +
                        call("RequestBinding", "ssshttas", "knodsim0", "sim0", "rx-only", region,
                             std::uint64_t{0}, std::uint64_t{4096}, 1, flow.c_str()) +
                        "\n";
            }
            (void)!::write(result[1], said.data(), said.size());
            _exit(0);
        }
        (void)!::write(connected[1], "c", 1);
        _exit(0); // the pid the bus took is free once the test reaps this process
    }
    close(connected[1]);
    char c;
    bool made = ::read(connected[0], &c, 1) == 1;
    close(connected[0]);
    int status = 0;
    waitpid(attacker, &status, 0);
    // The inheriting child has its ends; the processes forked below must not hold them (the
    // result's end of file comes when the child exits).
    close(go[0]);
    close(result[1]);
    pid_t unit_process = -1;
    for (int attempt = 0; made && attempt < 100 && unit_process < 0; ++attempt) {
        int ready[2];
        if (pipe2(ready, O_CLOEXEC) != 0) break;
        write_file("/proc/sys/kernel/ns_last_pid", std::to_string(attacker - 1));
        pid_t p = fork();
        if (p == 0) {
            close(ready[0]);
            close(go[1]);
            close(result[0]);
            if (getpid() != attacker) _exit(0);
            // Into the unit (or the pod), then as the attacker's uid, and wait (until killed).
            if (!join() || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) _exit(1);
            (void)!::write(ready[1], "r", 1);
            for (;;)
                pause();
        }
        close(ready[1]);
        bool joined = p == attacker && ::read(ready[0], &c, 1) == 1;
        close(ready[0]);
        if (joined) {
            unit_process = p;
        } else if (p > 0) {
            kill(p, SIGKILL);
            waitpid(p, nullptr, 0);
        }
    }
    std::string said;
    if (unit_process > 0) (void)!::write(go[1], "g", 1);
    close(go[1]); // without the byte the child reads end of file and exits
    said = read_all(result[0]);
    close(result[0]);
    if (unit_process > 0) {
        kill(unit_process, SIGKILL);
        waitpid(unit_process, nullptr, 0);
    }
    return unit_process > 0 ? said : std::string();
}

} // namespace

// Issue #32, failure 1: a connection made by a process outside the unit, whose pid a process of
// the unit then took, is not that unit's caller. Before the fix the daemon read the unit off
// the recycled pid and granted; now the connection is known by a pid only (dbus-daemon 1.14
// sends no ProcessFD), its own attestation names another process, and the unit rule does not
// match. An honest process of the unit, through the SDK (which attests), is granted.
TEST_F(IdentityTest, ARecycledPidDoesNotPassForTheUnitThatTookIt) {
    std::string root = cgroup2_root();
    if (root.empty() || ::access((root + "/cgroup.procs").c_str(), W_OK) != 0)
        GTEST_SKIP() << "no writable cgroup v2 hierarchy";
    if (::access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
        GTEST_SKIP() << "/proc/sys/kernel/ns_last_pid is not writable here";
    std::string tag = std::to_string(getpid());
    TestCgroup unit(root, "system.slice/inference@recycled" + tag + ".service");
    ASSERT_TRUE(unit.ok());
    Sandbox s(sim_rule("inference", "units = [\"inference@*.service\"]", 5000));
    std::string said = recycled_pid_attack(s, join_cgroup(unit.dir()), nobody, flow_5000);
    if (said.empty()) GTEST_SKIP() << "the attacker's pid went to another process 100 times";
    EXPECT_NE(said.find("attest: org.knod.Policy1.Error.Denied"), std::string::npos)
        << "a socketpair of the inheriting child names the child, not the bus's pid: " << said;
    EXPECT_NE(said.find("request: org.knod.Policy1.Error.Denied"), std::string::npos) << said;
    EXPECT_NE(said.find("not proven"), std::string::npos) << said;
    // Refusals are committed by the journal's writer after the reply: waited for (a soak run
    // under load read the journal before the denial's row was in it).
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) FROM events WHERE kind = 'request-denied' AND "
                     "json_extract(detail, '$.process_proof') = 'pid-only'") == "1";
    })) << s.sql("SELECT kind, decision, detail FROM events");
    // The attestation's refusal is journaled too (alone, or counted in a coalesced row).
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) > 0 FROM events WHERE kind = 'attest-refused' OR (kind = "
                     "'refusals-coalesced' AND decision = 'attest-refused')") == "1";
    })) << s.sql("SELECT kind, decision, detail FROM events");
    EXPECT_EQ(s.sql("SELECT count(*) FROM events WHERE kind = 'request-granted'"), "0");
    Output honest = request_once(s, unit.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(honest.out, "ok"))
        << "the unit's own process, attested: " << honest.out;
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.process_proof') FROM events WHERE kind = "
                    "'request-granted'"),
              "attested");
}

// Issue #32 on a bus that sends ProcessFD (dbus-broker 37 from bookworm-backports): the bus's
// pidfd proves an honest process of the unit (journaled as bus-pidfd), and the recycled-pid
// attack is refused: the connection's pidfd names the attacker that exited, not the process of
// the unit that took its pid.
TEST_F(IdentityTest, OnDbusBrokerTheBussPidfdDecidesWhoCalls) {
    std::string root = cgroup2_root();
    if (root.empty() || ::access((root + "/cgroup.procs").c_str(), W_OK) != 0)
        GTEST_SKIP() << "no writable cgroup v2 hierarchy";
    if (auto why = dbus_broker_missing(); !why.empty()) GTEST_SKIP() << why;
    std::string tag = std::to_string(getpid());
    TestCgroup unit(root, "system.slice/inference@broker" + tag + ".service");
    ASSERT_TRUE(unit.ok());
    Sandbox s(sim_rule("inference", "units = [\"inference@*.service\"]", 5000), {}, 0, true,
              BusKind::dbus_broker);
    Output honest = request_once(s, unit.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(honest.out, "ok")) << honest.out;
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.process_proof') FROM events WHERE kind = "
                    "'request-granted'"),
              "bus-pidfd");
    if (::access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
        GTEST_SKIP() << "/proc/sys/kernel/ns_last_pid is not writable here";
    std::string said = recycled_pid_attack(s, join_cgroup(unit.dir()), nobody, flow_5000);
    if (said.empty()) GTEST_SKIP() << "the attacker's pid went to another process 100 times";
    // Issue #51: a connection whose connector the bus saw exit speaks for nobody: every call on
    // it is refused, not only its attestation.
    for (const char *call : {"attest", "request"})
        EXPECT_NE(said.find(std::string(call) +
                            ": org.knod.Policy1.Error.Denied: the process that made this "
                            "connection has exited (the bus says so: ProcessFD)"),
                  std::string::npos)
            << call << ": " << said;
    EXPECT_EQ(s.sql("SELECT count(*) FROM events WHERE kind = 'request-granted'"), "1");
}

// Issue #51, failure 4: a pod's identity is lent by a recycled pid no more than a unit's. A
// host process of uid nobody connects, hands the connection to a child and exits; a process of
// a pod the policy allows, with the same uid, takes its pid. Before the fix the daemon read the
// pod off the pid and granted; now pod rules need a proven process, as units do. An honest
// process of the pod, through the SDK (which attests), is granted as that pod.
TEST_F(IdentityTest, ARecycledPidDoesNotPassForThePodThatTookIt) {
    if (::access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
        GTEST_SKIP() << "/proc/sys/kernel/ns_last_pid is not writable here";
    std::string tag = std::to_string(getpid());
    Sandbox s(sim_rule("ml-pods", "k8s_namespaces = [\"ml\"]", 5000));
    TestPod pod("knodid-pod" + tag, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    std::string said = recycled_pid_attack(s, pod.join(), nobody, flow_5000);
    if (said.empty()) GTEST_SKIP() << "the attacker's pid went to another process 100 times";
    EXPECT_NE(said.find("attest: org.knod.Policy1.Error.Denied"), std::string::npos) << said;
    EXPECT_NE(said.find("request: org.knod.Policy1.Error.Denied"), std::string::npos) << said;
    EXPECT_NE(said.find("not proven"), std::string::npos) << said;
    EXPECT_EQ(s.sql("SELECT count(*) FROM events WHERE kind = 'request-granted'"), "0");
    Output honest = request_once(s, pod.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(honest.out, "ok")) << "the pod's own process, attested: " << honest.out;
    EXPECT_EQ(s.sql("SELECT json_extract(detail, '$.pod.namespace') FROM events WHERE kind = "
                    "'request-granted'"),
              "ml");
}

// The attack review of #51: a container's root (uid 0 in a pid namespace of its own, as a root
// pod without a user namespace is) has none of the host root's exemptions: its refused
// AttestProcess calls are coalesced like everyone's, not journaled one by one as the host's
// root (before: 40 calls, 40 attest-refused events of "uid 0").
TEST_F(IdentityTest, AContainersRootsRefusalsAreCoalescedLikeEveryonesNotOneByOne) {
    Sandbox s(sim_rule("nobody", "users = [65534]", 5000));
    std::string address = s.address();
    pid_t outer = fork();
    if (outer == 0) {
        if (unshare(CLONE_NEWPID) != 0) _exit(3);
        pid_t inner = fork(); // the first process of the new pid namespace
        if (inner == 0) {
            sd_bus *bus = nullptr;
            if (sd_bus_new(&bus) < 0 || sd_bus_set_address(bus, address.c_str()) < 0 ||
                sd_bus_set_bus_client(bus, 1) < 0 || sd_bus_negotiate_fds(bus, 1) < 0 ||
                sd_bus_start(bus) < 0)
                _exit(4);
            int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
            int refused = 0;
            for (int i = 0; i < 40; ++i) {
                sd_bus_error e = SD_BUS_ERROR_NULL;
                if (sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                       "org.knod.Policy1.Manager", "AttestProcess", &e, nullptr,
                                       "h", null) < 0)
                    ++refused;
                sd_bus_error_free(&e);
            }
            _exit(refused == 40 ? 0 : 5);
        }
        int st = 0;
        waitpid(inner, &st, 0);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 6);
    }
    int status = 0;
    waitpid(outer, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << status;
    if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "no pid namespace here";
    ASSERT_EQ(WEXITSTATUS(status), 0) << "every AttestProcess with /dev/null is refused";
    EXPECT_TRUE(eventually([&] {
        return s.sql("SELECT count(*) FROM events WHERE kind = 'attest-refused'") == "1";
    })) << "the first refusal in full";
    // All 40 were answered before this count: the rest are only counted (coalesced).
    EXPECT_EQ(s.sql("SELECT count(*) FROM events WHERE kind = 'attest-refused'"), "1");
}

// Issue #51, failure 3 through the daemon: a pod's process whose uid is a host user's gets none
// of her grants, and what it holds under a pod rule does not spend her quota (nor she its).
TEST_F(IdentityTest, APodWithAHostUsersUidGetsNoneOfHerGrantsNorHerQuota) {
    std::string tag = std::to_string(getpid());
    Sandbox s(sim_rule("nobody-on-the-host", "users = [65534]\nmax_bindings_per_uid = 1", 5000) +
              sim_rule("ml-pods-as-nobody",
                       "k8s_namespaces = [\"ml\"]\nusers = [65534]\nmax_bindings_per_uid = 1",
                       5001));
    TestPod pod("knodid-uid" + tag, "ml");
    ASSERT_EQ(pod.register_with(s), "");
    Output o = request_once(s, pod.enter_as(nobody), flow_5000);
    EXPECT_TRUE(starts_with(o.out, "error")) << o.out;
    EXPECT_NE(o.out.find("for host callers only"), std::string::npos) << o.out;
    Holder in_pod(s, pod.enter_as(nobody), {"knodsim0", "sim0", "4096", flow_5001});
    ASSERT_TRUE(in_pod.ok()) << in_pod.line();
    Holder on_host(s, {"knodsim0", "sim0", "4096", flow_5000}, nobody);
    EXPECT_TRUE(on_host.ok()) << "the pod's binding is not the host user's: " << on_host.line();
    // Each holds its own one: a second in the pod is over the pod's quota, not the host's.
    Output second = request_once(s, pod.enter_as(nobody), "udp 10.99.0.1:* -> 10.99.0.2:5001");
    EXPECT_NE(second.out.find("QuotaExceeded"), std::string::npos) << second.out;
}
