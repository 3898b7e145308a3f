// The caller's units from its cgroup path, as sd_pid_get_unit / sd_pid_get_user_unit report
// them: the system unit is the first unit after the leading slices, and nothing a user's own
// manager (or the user, moving itself) creates below user@UID.service counts as one.
#include "daemon/peer.h"
#include "policy/cgroup_unit.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

using knod::policy::system_unit_of;
using knod::policy::user_unit_of;
using knod::policy::valid_unit_name;

TEST(CgroupUnit, SystemUnitIsTheFirstUnitAfterTheSlices) {
    struct Case {
        const char *cgroup, *system_unit, *user_unit;
    } cases[] = {
        {"/system.slice/inference@7.service", "inference@7.service", ""},
        {"/system.slice/inference@7.service/worker", "inference@7.service", ""},
        {"/system.slice/foo.service/x.service", "foo.service", ""},
        {"/system.slice/system-inference.slice/inference@7.service", "inference@7.service", ""},
        {"/machine.slice/machine-a.slice/docker-abc.scope", "docker-abc.scope", ""},
        {"/init.scope", "init.scope", ""},
        {"/system.slice/_cgroup.service", "cgroup.service", ""}, // cg_escape'd name
        {"system.slice/foo.service", "foo.service", ""},         // no leading slash
        {"//system.slice//foo.service", "foo.service", ""},
        // A user's processes: the system unit is the user manager or the session scope.
        {"/user.slice/user-1000.slice/user@1000.service/app.slice/inference@evil.service",
         "user@1000.service", "inference@evil.service"},
        {"/user.slice/user-1000.slice/user@1000.service/inference@evil.service",
         "user@1000.service", "inference@evil.service"},
        {"/user.slice/user-1000.slice/user@1000.service/app.slice/app-x.slice/run-u3.scope/a",
         "user@1000.service", "run-u3.scope"},
        {"/user.slice/user-1000.slice/user@1000.service", "user@1000.service", ""},
        {"/user.slice/user-1000.slice/user@1000.service/init.scope", "user@1000.service",
         "init.scope"},
        {"/user.slice/user-1000.slice/session-3.scope", "session-3.scope", ""},
        {"/user.slice/user-1000.slice/session-3.scope/inference@evil.service", "session-3.scope",
         "inference@evil.service"},
        {"/user.slice/user-1000.slice/session-c2.scope/x.scope", "session-c2.scope", "x.scope"},
        // user@ that is not a uid is an ordinary system unit; nothing below it is a user unit.
        {"/system.slice/user@bob.service/inference@1.service", "user@bob.service", ""},
        {"/user.slice/user-1000.slice/user@.service/x.service", "", ""}, // a template
        // No unit at all.
        {"/", "", ""},
        {"", "", ""},
        {"/system.slice", "", ""},
        {"/user.slice/user-1000.slice", "", ""},
        {"/foo/inference@1.service", "", ""},         // "foo" is not a unit
        {"/mygroup/sub/inference@1.service", "", ""}, // a hand-made tree
        {"/system.slice/x.slice.service/a", "x.slice.service", ""},
        {"/system.slice/foo@.service", "", ""}, // templates are not units
        {"/system.slice/@x.service", "", ""},   // no prefix
        {"/system.slice/foo.notatype", "", ""},
        {"/system.slice/fo o.service", "", ""},  // invalid character
        {"/system.slice/foo.service\n", "", ""}, // newline is invalid
        {"/system.slice/x.slice/y.service", "y.service", ""},
        {"/a.slice/b.service/c.slice/d.service", "b.service", ""},
    };
    for (const auto &c : cases) {
        EXPECT_EQ(system_unit_of(c.cgroup), c.system_unit) << c.cgroup;
        EXPECT_EQ(user_unit_of(c.cgroup), c.user_unit) << c.cgroup;
    }
}

TEST(CgroupUnit, ValidUnitNames) {
    for (const char *ok : {"a.service", "a@b.service", "a-b_c:d.e\\x2d.scope", "x.slice",
                           "sys-devices-x.device", "a@b@c.service"})
        EXPECT_TRUE(valid_unit_name(ok)) << ok;
    for (const char *bad : {"", ".service", "a.", "a", "a@.service", "@a.service", "a b.service",
                            "a.services", "a/b.service"})
        EXPECT_FALSE(valid_unit_name(bad)) << bad;
    EXPECT_FALSE(valid_unit_name(std::string(250, 'a') + ".service"));
    EXPECT_TRUE(valid_unit_name(std::string(200, 'a') + ".service"));
}

// On a hybrid host the v1 lines come first; a user who may create cgroups in a v1 hierarchy
// (systemd delegates name=systemd to user@UID.service) can put "0::" inside a path there, as
// "/.../a0::/system.slice/inference@x.service". Only the line that starts with "0::" counts.
TEST(CgroupUnit, UnifiedPathIsTheWholeZeroLineOnly) {
    using knod::policy::unified_cgroup_path;
    std::string hybrid = "9:name=systemd:/user.slice/user-1000.slice/user@1000.service/"
                         "a0::/system.slice/inference@evil.service\n"
                         "4:memory:/x0::/system.slice/inference@evil.service\n"
                         "0::/user.slice/user-1000.slice/user@1000.service/app.slice\n";
    auto path = unified_cgroup_path(hybrid);
    ASSERT_TRUE(path.has_value());
    EXPECT_EQ(*path, "/user.slice/user-1000.slice/user@1000.service/app.slice");
    EXPECT_EQ(system_unit_of(*path), "user@1000.service");
    EXPECT_EQ(unified_cgroup_path("0::/system.slice/a.service\n").value_or("?"),
              "/system.slice/a.service");
    EXPECT_EQ(unified_cgroup_path("0::/system.slice/a.service").value_or("?"),
              "/system.slice/a.service"); // no trailing newline
    EXPECT_FALSE(unified_cgroup_path("9:name=systemd:/a0::/system.slice/x.service\n"));
    EXPECT_FALSE(unified_cgroup_path(""));
}

// The same through identify_peer, on a /proc copy of this very process whose cgroup file is a
// hybrid host's (the old parser took the first "0::" anywhere: unit inference@evil.service).
TEST(CgroupUnit, IdentifyPeerReadsOnlyTheUnifiedLine) {
    std::string root = ::testing::TempDir() + "knod-proc-" + std::to_string(getpid());
    std::string dir = root + "/" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    auto copy = [&](const char *name, const std::string &text) {
        std::ofstream(dir + "/" + name) << text;
    };
    auto slurp = [](const std::string &path) {
        std::ifstream in(path);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    copy("stat", slurp("/proc/self/stat"));
    copy("status", slurp("/proc/self/status"));
    copy("cgroup", "9:name=systemd:/user.slice/user-1000.slice/user@1000.service/"
                   "a0::/system.slice/inference@evil.service\n"
                   "0::/user.slice/user-1000.slice/user@1000.service/app.slice\n");
    auto peer = knod::daemon::identify_peer(geteuid(), getpid(), std::nullopt, ":1.1", {}, root);
    std::filesystem::remove_all(root);
    ASSERT_TRUE(peer) << peer.error().message;
    EXPECT_EQ(peer->cgroup, "/user.slice/user-1000.slice/user@1000.service/app.slice");
    EXPECT_EQ(peer->unit, "user@1000.service");
    EXPECT_EQ(peer->user_unit, "");
}

// identify_peer's /proc parsers (read(2) and from_chars since the callgrind work): a command
// name with spaces and parentheses, tabs in status, truncated or hostile files are errors or
// empty, never a crash, and a status whose effective uid is not the bus's is refused.
TEST(CgroupUnit, ProcParsersTakeHostileFiles) {
    std::string root = ::testing::TempDir() + "knod-procp-" + std::to_string(getpid());
    const pid_t pid = 4242;
    std::string dir = root + "/" + std::to_string(pid);
    std::filesystem::create_directories(dir);
    auto write = [&](const std::string &text) { std::ofstream(dir + "/stat") << text; };
    std::string fields = " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654321 19 20\n";
    write("4242 (a) (b c) ) d)" + fields);
    auto start = knod::daemon::process_start_time(pid, root);
    ASSERT_TRUE(start) << start.error().message;
    EXPECT_EQ(*start, 987654321u);
    write("4242 (x) S 1 2 3");
    EXPECT_FALSE(knod::daemon::process_start_time(pid, root)); // truncated: no field 22
    write("4242 (x)");
    EXPECT_FALSE(knod::daemon::process_start_time(pid, root)); // nothing after the name
    write("4242 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -5 19\n");
    EXPECT_FALSE(knod::daemon::process_start_time(pid, root)); // not a number
    write("");
    EXPECT_FALSE(knod::daemon::process_start_time(pid, root));
    std::filesystem::remove_all(root);

    const char with_nul[] = "Gid:\t1\t2\0Groups: 8\n";
    EXPECT_EQ(knod::daemon::groups_from_status("Name:\tx\nGid:\t10\t20\t20\t20\n"
                                               "Groups:\t30 5 30\t7 \n"),
              (std::vector<gid_t>{5, 7, 20, 30}));
    EXPECT_EQ(knod::daemon::groups_from_status("Groups:\nGid:\t1\n"), std::vector<gid_t>{});
    EXPECT_EQ(knod::daemon::groups_from_status("XGid:\t1\t2\n"), std::vector<gid_t>{});
    EXPECT_EQ(knod::daemon::groups_from_status("Gid:\t1\t2x 3\nGroups:\t99999999999999999999 4\n"),
              std::vector<gid_t>{2});
    EXPECT_EQ(knod::daemon::groups_from_status(std::string(with_nul, sizeof with_nul - 1)),
              std::vector<gid_t>{2});
}

// A status that names another effective uid than the bus vouched for: refused.
TEST(CgroupUnit, IdentifyPeerRefusesAnotherEffectiveUid) {
    std::string root = ::testing::TempDir() + "knod-procu-" + std::to_string(getpid());
    std::string dir = root + "/" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    auto slurp = [](const std::string &path) {
        std::ifstream in(path);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    std::ofstream(dir + "/stat") << slurp("/proc/self/stat");
    std::ofstream(dir + "/status")
        << "Name:\tx\nUid:\t0\t" << geteuid() + 1 << "\t0\t0\nGid:\t0\t0\n";
    std::ofstream(dir + "/cgroup") << "0::/\n";
    auto peer = knod::daemon::identify_peer(geteuid(), getpid(), std::nullopt, ":1.1", {}, root);
    std::filesystem::remove_all(root);
    EXPECT_FALSE(peer);
}
