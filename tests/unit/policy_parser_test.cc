#include "knod/regular_file.h"
#include "policy/parser.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace knod::policy;
namespace fs = std::filesystem;

namespace {

const std::string data_dir = KNOD_SOURCE_DIR "/tests/data/policies";

// Each bad policy's first line says what must be reported: "# expect: LINE:COL: text".
struct Expectation {
    std::uint32_t line = 0, column = 0;
    std::string text;
};

Expectation expectation_of(const std::string &path) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    Expectation e;
    char rest[256] = {};
    if (std::sscanf(first.c_str(), "# expect: %u:%u: %255[^\n]", &e.line, &e.column, rest) < 2)
        ADD_FAILURE() << path << " has no '# expect: LINE:COL: text' first line";
    e.text = rest;
    return e;
}

std::vector<std::string> files_in(const std::string &dir) {
    std::vector<std::string> out;
    for (auto &entry : fs::directory_iterator(dir))
        out.push_back(entry.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

} // namespace

TEST(PolicyParser, EveryBadPolicyIsRejectedAtTheRightPlace) {
    auto files = files_in(data_dir + "/bad");
    ASSERT_GE(files.size(), 15u);
    for (auto &file : files) {
        Expectation want = expectation_of(file);
        PolicyLoad load = load_policy_files({file});
        EXPECT_FALSE(load.ok()) << file;
        bool found = false;
        for (auto &d : load.diagnostics) {
            if (d.severity == Severity::error && d.where.file == file &&
                d.where.line == want.line && d.where.column == want.column &&
                d.message.find(want.text) != std::string::npos)
                found = true;
        }
        EXPECT_TRUE(found) << file << ": wanted " << want.line << ":" << want.column << ": "
                           << want.text << "\n got:\n"
                           << load.errors_text();
    }
}

TEST(PolicyParser, GoodPoliciesAndTheShippedExampleAreAccepted) {
    auto files = files_in(data_dir + "/good");
    files.push_back(KNOD_SOURCE_DIR "/packaging/policy.example.toml");
    for (auto &file : files) {
        PolicyLoad load = load_policy_files({file});
        EXPECT_TRUE(load.ok()) << file << "\n" << load.errors_text();
    }
}

TEST(PolicyParser, ExamplePolicyHasTheRulesItDocuments) {
    PolicyLoad load = load_policy_files({KNOD_SOURCE_DIR "/packaging/policy.example.toml"});
    ASSERT_TRUE(load.ok());
    ASSERT_EQ(load.policy.rules.size(), 3u);
    EXPECT_EQ(load.policy.rules[0].action, Action::deny);
    const Rule &ml = load.policy.rules[1];
    EXPECT_EQ(ml.name, "ml-inference");
    EXPECT_EQ(*ml.max_region_bytes, 256ull << 20);
    EXPECT_EQ(*ml.max_total_bytes_per_uid, 1ull << 30);
    EXPECT_EQ(*ml.max_bindings_per_uid, 4u);
    EXPECT_EQ(ml.key_lifetime, std::chrono::hours(8));
    EXPECT_EQ(ml.flows.size(), 2u);
    EXPECT_EQ(load.policy.settings.admin_group, "knod-admin");
}

TEST(PolicyParser, ShadowedRuleIsAWarningNotAnError) {
    PolicyLoad load = load_policy_files({data_dir + "/good/shadowed.toml"});
    ASSERT_TRUE(load.ok());
    ASSERT_EQ(load.diagnostics.size(), 1u);
    EXPECT_EQ(load.diagnostics[0].severity, Severity::warning);
    EXPECT_EQ(load.diagnostics[0].where.line, 8u);
    EXPECT_NE(load.diagnostics[0].message.find("'narrow' can never match"), std::string::npos);
}

TEST(PolicyParser, ReportsEveryErrorNotJustTheFirst) {
    PolicyLoad load = parse_policy_text(R"(
[[rule]]
name = "a"
colour = "red"
max_region = "lots"
flows = ["udp * -> *:1"]
any_caller = true
)",
                                        "p.toml");
    EXPECT_EQ(load.error_count(), 2u) << load.errors_text();
    EXPECT_TRUE(load.policy.rules.empty()); // a broken rule is never half-loaded
}

TEST(PolicyParser, DropInsAppendRulesAndLaterSettingsWin) {
    fs::path dir = fs::temp_directory_path() / ("knod-policy-test-" + std::to_string(getpid()));
    fs::create_directories(dir / "policy.d");
    std::ofstream(dir / "policy.toml") << "[settings]\npermissive = true\n"
                                          "[[rule]]\nname='main'\naction='deny'\nusers=[5]\n";
    std::ofstream(dir / "policy.d/20-b.toml") << "[[rule]]\nname='b'\naction='deny'\nusers=[7]\n";
    std::ofstream(dir / "policy.d/10-a.toml") << "[settings]\npermissive = false\n"
                                                 "[[rule]]\nname='a'\naction='deny'\nusers=[6]\n";
    std::ofstream(dir / "policy.d/notes.txt") << "not policy";
    auto files = default_policy_files(dir.string());
    PolicyLoad load = load_policy_files(files);
    fs::remove_all(dir);
    ASSERT_TRUE(load.ok()) << load.errors_text();
    ASSERT_EQ(load.policy.rules.size(), 3u);
    EXPECT_EQ(load.policy.rules[0].name, "main");
    EXPECT_EQ(load.policy.rules[1].name, "a");
    EXPECT_EQ(load.policy.rules[2].name, "b");
    EXPECT_FALSE(load.policy.settings.permissive);
}

// #33 item 1: files nobody reviewed (config tools' temporaries, editor interlocks, swap files,
// backups) are never policy, and a directory names the same files for check and the daemon.
TEST(PolicyParser, OnlyReviewedFileNamesArePolicy) {
    fs::path dir = fs::temp_directory_path() / ("knod-policy-names-" + std::to_string(getpid()));
    fs::create_directories(dir / "policy.d");
    std::ofstream(dir / "policy.toml") << "[[rule]]\nname='main'\naction='deny'\nusers=[5]\n";
    for (const char *name : {".ansible_tmpab12cd-lab.toml", ".#lab.toml", ".lab.toml.swp",
                             "lab.toml~", "lab.toml.dpkg-old", "#lab.toml#", ".toml"})
        std::ofstream(dir / "policy.d" / name)
            << "[[rule]]\nname='sneaky'\naction='allow'\nusers=[0]\n";
    std::ofstream(dir / "policy.d/50-lab.toml")
        << "[[rule]]\nname='lab'\naction='deny'\nusers=[6]\n";
    fs::create_directories(dir / "policy.d/dir.toml"); // a directory is not a file
    // The daemon's --policy DIR and `check DIR` both go through expand_policy_paths.
    auto files = expand_policy_paths({dir.string()});
    auto dropins = expand_policy_paths({(dir / "policy.d").string()});
    fs::remove_all(dir);
    ASSERT_EQ(files.size(), 2u) << testing::PrintToString(files);
    EXPECT_EQ(fs::path(files[0]).filename(), "policy.toml");
    EXPECT_EQ(fs::path(files[1]).filename(), "50-lab.toml");
    ASSERT_EQ(dropins.size(), 1u) << testing::PrintToString(dropins);
    EXPECT_EQ(fs::path(dropins[0]).filename(), "50-lab.toml");
    EXPECT_FALSE(is_policy_file_name(".ansible_tmpab12cd-lab.toml"));
    EXPECT_FALSE(is_policy_file_name(".toml"));
    EXPECT_TRUE(is_policy_file_name("a.toml"));
}

// #33 item 3: every key_lifetime check accepts is one the daemon can honour (past ~86,000 days
// now + lifetime overflowed the clock and every key was born expired).
TEST(PolicyParser, KeyLifetimeIsBoundedByWhatTheDaemonHonours) {
    auto rule = [](const std::string &lifetime) {
        return parse_policy_text(
            "[[rule]]\nname='a'\naction='allow'\nusers=[1]\nmax_region='1MiB'\n"
            "flows=['udp * -> *:5000']\n"
            "key_lifetime = " +
            lifetime + "\n");
    };
    EXPECT_TRUE(rule("\"365d\"").ok());
    EXPECT_TRUE(rule("31536000").ok());
    for (const char *bad : {"\"366d\"", "31536001", "\"90000d\"", "\"2562047h\"", "0", "-5"}) {
        auto load = rule(bad);
        EXPECT_FALSE(load.ok()) << bad;
        EXPECT_NE(load.errors_text().find("from 1s to 365d"), std::string::npos)
            << bad << ": " << load.errors_text();
    }
}

// #33 item 2: a rule whose principal lines are missing (a file read half-saved: truncated,
// then rewritten, with the reload between) would match every caller. It is refused unless it
// says so; saying so and naming callers is a contradiction.
TEST(PolicyParser, ARuleThatNamesNoCallerMustSaySo) {
    const std::string head = "[[rule]]\nname='r'\naction='allow'\nmax_region='1MiB'\n"
                             "flows=['udp * -> *:5000']\n";
    auto none = parse_policy_text(head);
    EXPECT_FALSE(none.ok());
    EXPECT_NE(none.errors_text().find("names no caller"), std::string::npos) << none.errors_text();
    EXPECT_NE(none.errors_text().find("any_caller = true"), std::string::npos);
    EXPECT_FALSE(parse_policy_text(head + "users=[]\n").ok()) << "an empty list names nobody";
    EXPECT_FALSE(parse_policy_text("[[rule]]\nname='d'\naction='deny'\n").ok())
        << "a deny rule for everyone says so too";
    EXPECT_TRUE(parse_policy_text(head + "any_caller = true\n").ok());
    EXPECT_TRUE(parse_policy_text("[[rule]]\nname='d'\naction='deny'\nany_caller=true\n").ok());
    for (const char *who : {"users=[1]", "groups=['video']", "units=['a.service']",
                            "user_units=['b.service']", "cgroups=['/x/*']", "executables=['/y']"})
        EXPECT_TRUE(parse_policy_text(head + who + "\n").ok()) << who;
    auto both = parse_policy_text(head + "users=[1]\nany_caller=true\n");
    EXPECT_FALSE(both.ok());
    EXPECT_NE(both.errors_text().find("also names callers"), std::string::npos);
    EXPECT_FALSE(parse_policy_text(head + "any_caller='yes'\n").ok());
    // A catch-all glob is as wide as any_caller: allowed, with a warning that says so.
    auto star = parse_policy_text(head + "units=['*']\n");
    EXPECT_TRUE(star.ok());
    ASSERT_EQ(star.diagnostics.size(), 1u) << star.errors_text();
    EXPECT_NE(star.diagnostics[0].message.find("any_caller = true"), std::string::npos);
    // Nor does an empty flow list allow every flow (the engine reads empty as any).
    auto no_flows =
        parse_policy_text("[[rule]]\nname='f'\nusers=[1]\nmax_region='1MiB'\nflows=[]\n");
    EXPECT_FALSE(no_flows.ok());
    EXPECT_NE(no_flows.errors_text().find("flows = []"), std::string::npos)
        << no_flows.errors_text();
}

// The attack review of #51: users = ["1000"] read as a name matched nobody, so a deny rule
// written that way did nothing (and explain printed it as [1000]). A string of digits is the id.
TEST(PolicyParser, AStringOfDigitsIsAnIdNotAName) {
    auto p = parse_policy_text("[[rule]]\nname='d'\naction='deny'\nusers=['1000']\n"
                               "groups=['3100', 'video']\n");
    ASSERT_TRUE(p.ok()) << p.errors_text();
    ASSERT_EQ(p.policy.rules.size(), 1u);
    auto &r = p.policy.rules[0];
    ASSERT_EQ(r.users.size(), 1u);
    EXPECT_EQ(r.users[0].id, std::optional<std::uint32_t>(1000));
    ASSERT_EQ(r.groups.size(), 2u);
    EXPECT_EQ(r.groups[0].id, std::optional<std::uint32_t>(3100));
    EXPECT_EQ(r.groups[1].name, "video");
    auto far = parse_policy_text("[[rule]]\nname='d'\naction='deny'\nusers=['4294967296']\n");
    EXPECT_FALSE(far.ok());
    EXPECT_NE(far.errors_text().find("out of range"), std::string::npos) << far.errors_text();
}

// #33 item 2: a file that changes while it is read is not loaded (the reload is refused and
// the old policy stays), whatever moved: its bytes in place, or the path to another file.
TEST(PolicyParser, AFileThatChangesWhileItIsReadIsNotLoaded) {
    fs::path dir = fs::temp_directory_path() / ("knod-policy-moving-" + std::to_string(getpid()));
    fs::create_directories(dir);
    fs::path file = dir / "policy.toml";
    std::string whole(64 * 1024, '#'); // more than one read(2), so the hook runs mid-file
    whole += "\n[[rule]]\nname='r'\naction='deny'\nusers=[1]\n";
    std::ofstream(file) << whole;
    EXPECT_TRUE(knod::read_regular_file_unchanged(file.string(), 1 << 20)) << "a still file reads";
    // Rewritten in place (truncate, write) during the read.
    auto in_place = knod::read_regular_file_unchanged(file.string(), 1 << 20, [&] {
        std::ofstream(file, std::ios::trunc) << "[[rule]]\nname='r'\n";
    });
    ASSERT_FALSE(in_place);
    EXPECT_EQ(in_place.error().code, knod::Errc::unavailable);
    EXPECT_NE(in_place.error().message.find("changed while it was read"), std::string::npos)
        << in_place.error().message;
    // Replaced by a rename during the read: what was read is not what the path names now.
    std::ofstream(file, std::ios::trunc) << whole;
    bool once = false;
    auto renamed = knod::read_regular_file_unchanged(file.string(), 1 << 20, [&] {
        if (once) return;
        once = true;
        std::ofstream(dir / "new.toml") << whole;
        fs::rename(dir / "new.toml", file);
    });
    ASSERT_FALSE(renamed);
    // The old inode's link count (so its ctime) moves too, so either check may see it first.
    EXPECT_EQ(renamed.error().code, knod::Errc::unavailable);
    EXPECT_NE(renamed.error().message.find("while it was read"), std::string::npos)
        << renamed.error().message;
    fs::remove_all(dir);
}

TEST(PolicyParser, MissingFileIsAnError) {
    PolicyLoad load = load_policy_files({"/nonexistent/knod.toml"});
    EXPECT_FALSE(load.ok());
    EXPECT_NE(load.errors_text().find("cannot read policy file"), std::string::npos);
}

// The diagnostic at LINE:COL whose message holds `text`, if any.
bool has_error(const PolicyLoad &load, std::uint32_t line, std::uint32_t column,
               const std::string &text) {
    for (auto &d : load.diagnostics)
        if (d.severity == Severity::error && d.where.line == line && d.where.column == column &&
            d.message.find(text) != std::string::npos)
            return true;
    return false;
}

std::string repeat(const std::string &piece, int n) {
    std::string out;
    for (int i = 0; i < n; ++i)
        out += piece;
    return out;
}

// Hostile shapes toml++ would recurse on once per level or part (50,000 dotted parts overflowed
// its stack): each is refused with a position before toml++ sees it.
TEST(PolicyParser, DottedKeysAndNestingAreBoundedBeforeParsing) {
    // The 32nd dot (the 33rd part) is at column 64.
    auto dotted = parse_policy_text("[settings]\na" + repeat(".a", 50000) + " = 1\n", "d.toml");
    EXPECT_TRUE(has_error(dotted, 2, 64, "more than 32 dotted parts")) << dotted.errors_text();
    auto header = parse_policy_text("[a" + repeat(".a", 50000) + "]\n", "h.toml");
    EXPECT_TRUE(has_error(header, 1, 65, "more than 32 dotted parts")) << header.errors_text();
    auto quoted = parse_policy_text("\"a\"" + repeat(".'a'", 50000) + " = 1\n", "q.toml");
    EXPECT_FALSE(quoted.ok());
    auto arrays = parse_policy_text("x = " + repeat("[", 100000) + repeat("]", 100000), "a.toml");
    EXPECT_TRUE(has_error(arrays, 1, 37, "nest deeper than 32")) << arrays.errors_text();
    auto tables = parse_policy_text("x = " + repeat("{a=", 100000) + "1" + repeat("}", 100000));
    EXPECT_FALSE(tables.ok());
    EXPECT_NE(tables.errors_text().find("nest deeper than 32"), std::string::npos);
}

TEST(PolicyParser, DotsInStringsCommentsAndFlatFilesStayAccepted) {
    std::string text = "# " + repeat("a.", 100) + "\n[[rule]]\nname = \"" + repeat("v.", 100) +
                       "\"\niommu = \"any\"\nmax_region = 4096\n" +
                       "flows = [\"udp 10.0.0.1:* -> 10.0.0.2:5000\"]\n" + "executables = '''" +
                       repeat("/x.y", 100) + "'''\n";
    auto load = parse_policy_text(text);
    EXPECT_TRUE(load.ok()) << load.errors_text();
}

TEST(PolicyParser, PolicyFilesOverOneMebibyteAreNotRead) {
    auto path = fs::temp_directory_path() / ("knod-big-" + std::to_string(getpid()) + ".toml");
    {
        std::ofstream out(path);
        out << repeat("# " + std::string(1022, 'x') + "\n", 2048);
    }
    PolicyLoad load = load_policy_files({path.string()});
    fs::remove(path);
    EXPECT_TRUE(has_error(load, 1, 1, "over the limit of 1048576 bytes")) << load.errors_text();
}

// toml++ decodes \u0000 into the string; fnmatch would then see only "*".
TEST(PolicyParser, ControlCharactersInStringsAndKeysAreErrorsWithPositions) {
    auto load = parse_policy_text("[[rule]]\nname = \"r\"\nexecutables = [\"/ok\", "
                                  "\"*\\u0000/opt/app/bin/trainer\"]\n");
    EXPECT_TRUE(has_error(load, 3, 23, "'*\\x00/opt/app/bin/trainer' holds a control character"))
        << load.errors_text();
    EXPECT_TRUE(load.policy.rules.empty()); // nothing of the file is used
    for (const char *text : {"[settings]\nadmin_group = \"adm\\u001b[2J\"\n",
                             "[settings]\n\"adm\\u0085\" = 1\n", "x = \"tab\\there\"\n"})
        EXPECT_FALSE(parse_policy_text(text).ok()) << text;
}

TEST(PolicyParser, SizesAndDurations) {
    EXPECT_EQ(parse_size("4096"), 4096u);
    EXPECT_EQ(parse_size("64MiB"), 64ull << 20);
    EXPECT_EQ(parse_size("2 GiB"), 2ull << 30);
    EXPECT_EQ(parse_size("1MB"), 1000000u);
    EXPECT_FALSE(parse_size("99999999999TiB"));
    EXPECT_FALSE(parse_size("1XB"));
    EXPECT_FALSE(parse_size(""));
    EXPECT_EQ(parse_duration("90s"), std::chrono::seconds(90));
    EXPECT_EQ(parse_duration("15m"), std::chrono::minutes(15));
    EXPECT_EQ(parse_duration("2d"), std::chrono::hours(48));
    EXPECT_FALSE(parse_duration("1y"));
}

// The canonical text the journal stores, and its digest: each file in load order after a
// "# file: PATH" line, ending with a newline.
TEST(PolicyParser, PolicyTextAndDigestAreCanonical) {
    PolicyParser p;
    p.add_text("[settings]\npermissive = false", "/etc/knod/policy.toml");
    p.add_text("", "/etc/knod/policy.d/empty.toml");
    p.add_text("[[rule]]\nname = \"x\"\nany_caller = true\naction = \"deny\"\n",
               "/etc/knod/policy.d/10-x.toml");
    auto load = p.finish();
    ASSERT_TRUE(load.ok()) << load.errors_text();
    EXPECT_EQ(load.policy.text, "# file: /etc/knod/policy.toml\n[settings]\npermissive = false\n"
                                "# file: /etc/knod/policy.d/empty.toml\n"
                                "# file: /etc/knod/policy.d/10-x.toml\n[[rule]]\nname = "
                                "\"x\"\nany_caller = true\naction = \"deny\"\n");
    ASSERT_EQ(load.policy.file_digests.size(), 3u);
    EXPECT_EQ(load.policy.file_digests[1], policy_digest("")) << "each file's own bytes";
    EXPECT_EQ(load.policy.digest, policy_digest(load.policy.text));
    EXPECT_EQ(policy_digest(""),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_NE(parse_policy_text("[settings]\n", "a.toml").policy.digest,
              parse_policy_text("[settings]\n", "b.toml").policy.digest)
        << "the path is part of what was loaded";
}
