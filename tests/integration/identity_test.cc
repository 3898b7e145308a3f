// Who the caller is, as the daemon decides it: groups of the calling process (not of the user
// database), the system manager's unit (not one the caller made itself), a daemon that runs
// without root as the shipped unit runs it, and a state dir that must be the daemon's own.
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
    EXPECT_EQ(st.st_mode & 0777, 0640u); // the state dir's group (the auditors) may read it
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

// Failure 12: the daemon's own journal left world-readable is tightened to 0640 (its group, the
// auditors, may read it), its key secret left group-readable to 0600 (and said so); a link
// planted at the anchor's old temporary path is never followed.
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
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    ASSERT_EQ(::stat(secret.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    std::string log = slurp(s.dir() + "/daemon.log");
    EXPECT_NE(log.find("journal.db had mode 0664; tightened to 0640"), std::string::npos) << log;
    EXPECT_NE(log.find("key-secret had mode 0640; tightened to 0600"), std::string::npos) << log;
    // Journal writes move the anchor.
    for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(starts_with(request_once(s, {}, flow_5000).out, "ok"));
    EXPECT_TRUE(eventually([&] { return slurp(anchor).find("\"seq\"") != std::string::npos; }));
    EXPECT_EQ(slurp(precious), "keep me\n");
    ASSERT_EQ(::lstat(anchor.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0640u); // as the journal
    ASSERT_EQ(::lstat(s.state_dir().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// #16 item 5: the packaged layout. The state dir is 2750 daemon:auditors (tmpfiles.d); the
// journal's files take its group and are 0640, so an auditor reads the live journal (WAL, with
// a -shm it may only read); the key secret stays the daemon's alone; someone outside the group
// cannot read the journal and is told so (exit 2).
TEST_F(IdentityTest, AuditorsOfTheStateDirsGroupReadTheLiveJournal) {
    struct passwd *pw = getpwnam("daemon");
    if (!pw) GTEST_SKIP() << "no 'daemon' account to run the daemon as";
    const uid_t daemon_uid = pw->pw_uid;
    const gid_t auditors = 4260;
    const uid_t auditor = 4261, outsider = 4262;
    Sandbox s(sim_policy, {"--linux-audit=false"}, daemon_uid, /*start=*/false);
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
        EXPECT_EQ(st.st_mode & 0777, 0640u) << suffix;
        EXPECT_EQ(st.st_gid, auditors) << suffix;
    }
    struct stat st {};
    ASSERT_EQ(::stat((s.state_dir() + "/key-secret").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);

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
        if (sub.rfind("verify", 0) == 0) {
            EXPECT_NE(out.out.find("matches the head kept outside the database"), std::string::npos)
                << out.out;
        }
        out = audit(outsider, false, sub);
        EXPECT_TRUE(WIFEXITED(out.status) && WEXITSTATUS(out.status) == 2)
            << sub << ": " << out.out;
        EXPECT_NE(out.out.find("cannot read the journal"), std::string::npos) << out.out;
        EXPECT_NE(out.out.find("Permission denied"), std::string::npos) << out.out;
    }
    EXPECT_EQ(s.stop_daemon(SIGTERM), 0);
}
