// verify --export on records an attacker edited (#31): a JSON number where the chain hashed an
// integer is never equal to it, whatever its value. The lines are made by the real export_line
// from events hashed by the real chain_hash, then edited as text, and read back by verify_export.
#include "journal/export.h"
#include "journal/records.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace knod::journal {
namespace {

// One export line of a first event whose detail is `detail` (spacing kept: not in the form a
// dump gives, so the line carries detail_text beside the parsed detail).
std::string line_for(const std::string &detail) {
    EventRecord e;
    e.seq = 1;
    e.event.at_us = 1795946460000000;
    e.event.kind = "request-denied";
    e.event.uid = 1000;
    e.event.pid = 42;
    e.event.decision = "deny";
    e.event.detail = detail;
    e.prev_hash = Hash{};
    e.hash = chain_hash(e.prev_hash, e.seq, e.event);
    return export_line(e, JournalIdentity{});
}

bool verifies(const std::string &line) {
    std::istringstream in(line + "\n");
    auto r = verify_export(in, false);
    return r && r->ok;
}

// The line with `path` in its parsed detail (or at the top) set to `v`, dumped again.
std::string edited(const std::string &line, const nlohmann::json::json_pointer &path,
                   const nlohmann::json &v) {
    auto j = nlohmann::ordered_json::parse(line);
    j[nlohmann::ordered_json::json_pointer(path.to_string())] = v;
    return j.dump();
}

TEST(HostileExport, UneditedLinesVerify) {
    std::string line = line_for("{\"n\": 9007199254740993}");
    ASSERT_NE(line.find("detail_text"), std::string::npos) << line;
    EXPECT_TRUE(verifies(line)) << line;
    EXPECT_TRUE(verifies(line_for("{\"netdev\":\"eth0\"}")));
}

TEST(HostileExport, FloatAboveTwoTo53IsNotTheHashedInteger) {
    std::string line = line_for("{\"n\": 9007199254740993}");
    // 9007199254740992.0 is the nearest double: equal to the integer as nlohmann compares.
    std::string forged =
        edited(line, nlohmann::json::json_pointer("/detail/n"), 9007199254740992.0);
    ASSERT_NE(forged, line);
    EXPECT_FALSE(verifies(forged)) << forged;
}

TEST(HostileExport, FloatFormOfASmallIntegerIsRefusedToo) {
    std::string line = line_for("{\"region_bytes\": 4096, \"list\": [1, 2]}");
    EXPECT_FALSE(
        verifies(edited(line, nlohmann::json::json_pointer("/detail/region_bytes"), 4096.0)));
    EXPECT_FALSE(verifies(edited(line, nlohmann::json::json_pointer("/detail/list/1"), 2.0)));
}

TEST(HostileExport, TopLevelIntegersMustBeIntegers) {
    std::string line = line_for("{\"n\": 1}");
    for (const char *field : {"/seq", "/at_us", "/uid", "/pid"}) {
        auto j = nlohmann::ordered_json::parse(line);
        auto p = nlohmann::ordered_json::json_pointer(field);
        j[p] = static_cast<double>(j[p].get<std::int64_t>());
        EXPECT_FALSE(verifies(j.dump())) << field;
    }
}

} // namespace
} // namespace knod::journal
