#include "policy/parser.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

TEST(PolicyParser, MissingFileIsAnError) {
    PolicyLoad load = load_policy_files({"/nonexistent/knod.toml"});
    EXPECT_FALSE(load.ok());
    EXPECT_NE(load.errors_text().find("cannot read policy file"), std::string::npos);
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
