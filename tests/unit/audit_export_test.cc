// Export records (journal/export.h) and the audit CLI's filter checks: times, event ids,
// flat fields, and that an export rebuilds every event's hashed bytes exactly, whatever the
// stored detail looks like, while any edit shows.
#include "cli/audit_format.h"
#include "journal/compact_json.h"
#include "journal/export.h"
#include "journal/vocabulary.h"
#include "knod/json.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

using namespace knod;
using namespace knod::journal;

namespace {

TEST(ExportTime, Rfc3339WithMicroseconds) {
    EXPECT_EQ(rfc3339_us(0), "1970-01-01T00:00:00.000000Z");
    EXPECT_EQ(rfc3339_us(1796095621390768), "2026-12-01T03:27:01.390768Z");
    EXPECT_EQ(rfc3339_us(1796095621000001), "2026-12-01T03:27:01.000001Z");
    EXPECT_EQ(rfc3339_us(-1), "1969-12-31T23:59:59.999999Z");
}

// The export's fast path (compact_json.h) may only recognise a text that the general path
// (nlohmann parse, compact dump) would give back byte for byte, with the same lifted fields.
void expect_fast_path_agrees(const std::string &text, bool expect_recognised) {
    auto fast = scan_compact_object(text);
    EXPECT_EQ(fast.has_value(), expect_recognised) << text;
    if (!fast) return;
    auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_EQ(j.dump(), text);
    EventRecord e;
    e.event.detail = text;
    FlatFields slow = flat_fields(e);
    EXPECT_EQ(fast->netdev, slow.netdev) << text;
    EXPECT_EQ(fast->gpu, slow.gpu) << text;
    EXPECT_EQ(fast->flows, slow.flows) << text;
}

TEST(ExportFastPath, RecognisesOnlyTheDaemonsExactForm) {
    for (const char *yes :
         {R"({})", R"({"a":1})",
          R"({"netdev":"eth0","gpu":"0000:c1:00.0","flows":["udp * -> *:5000"]})",
          R"({"a":{"netdev":"x"},"netdev":"y"})", R"({"q":"say \"hi\" \\ /"})",
          R"({"n":-12,"z":0,"t":true,"f":false,"u":null,"a":[1,[2,{}],"x"]})", R"({"flows":[]})",
          R"({"netdev":null})", R"({"session":{"flows":["a"],"id":"b1"}})"})
        expect_fast_path_agrees(yes, true);
    for (const char *no : {R"([])",
                           R"("x")",
                           R"({"a":1} )",
                           R"( {"a":1})",
                           R"({"a": 1})",
                           R"({"a":1,"a":2})",
                           R"({"a":{"b":1,"b":1}})",
                           R"({"a":-0})",
                           R"({"a":01})",
                           R"({"a":1.0})",
                           R"({"a":1e2})",
                           R"({"a":"\n"})",
                           R"({"a":"\u0041"})",
                           R"({"a":"\/"})",
                           R"({"a":"é"})",
                           R"({"a":""})",
                           R"({"flows":"[\"udp\"]"})",
                           R"({"flows":["a",1]})",
                           R"({"a":1234567890123456789})",
                           R"({"a":1,})",
                           R"({"a":tru})",
                           R"({"a")",
                           R"({)"})
        expect_fast_path_agrees(no, false);
    std::string deep(70, '[');
    expect_fast_path_agrees("{\"a\":" + deep + std::string(70, ']') + "}", false);
}

// Random details as the daemon dumps them: every one the fast path takes must round-trip, and
// the plain-ASCII integer ones must all be taken.
TEST(ExportFastPath, AgreesWithTheGeneralPathOnRandomDetails) {
    std::mt19937 rng(20261201);
    const std::string alphabet = "ab\"\\/ -_:.*>x\n\x01\x7f\xc3\xa9";
    auto str = [&] {
        std::string s;
        for (int n = rng() % 6; n > 0; --n)
            s += alphabet[rng() % alphabet.size()];
        return s;
    };
    std::function<nlohmann::ordered_json(int)> value = [&](int depth) -> nlohmann::ordered_json {
        switch (rng() % (depth > 3 ? 4 : 6)) {
        case 0:
            return static_cast<std::int64_t>(rng()) - (1 << 30);
        case 1:
            return str();
        case 2:
            return rng() % 2 == 0;
        case 3:
            return nullptr;
        case 4: {
            auto a = nlohmann::ordered_json::array();
            for (int n = rng() % 4; n > 0; --n)
                a.push_back(value(depth + 1));
            return a;
        }
        default: {
            auto o = nlohmann::ordered_json::object();
            for (int n = rng() % 4; n > 0; --n)
                o[rng() % 3 == 0 ? std::string("netdev") : str()] = value(depth + 1);
            return o;
        }
        }
    };
    int taken = 0;
    for (int i = 0; i < 3000; ++i) {
        auto o = nlohmann::ordered_json::object();
        for (int n = rng() % 5; n > 0; --n) {
            static const char *keys[] = {"netdev", "gpu", "flows", "k", "session"};
            o[keys[rng() % 5]] = value(1);
        }
        std::string text = o.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        bool plain =
            std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; }) &&
            text.find("\\n") == std::string::npos && text.find("\\u") == std::string::npos;
        auto fast = scan_compact_object(text);
        if (fast) {
            ++taken;
            expect_fast_path_agrees(text, true);
        } else if (plain && !o.contains("flows")) {
            ADD_FAILURE() << "not taken: " << text;
        }
    }
    EXPECT_GT(taken, 300);
}

TEST(ExportEventId, RoundTrips) {
    auto id = parse_event_id(export_event_id("0123abcd", 42));
    ASSERT_TRUE(id);
    EXPECT_EQ(id->journal_id, "0123abcd");
    EXPECT_EQ(id->seq, 42);
    auto bare = parse_event_id(export_event_id("", 7));
    ASSERT_TRUE(bare);
    EXPECT_EQ(bare->journal_id, "");
    EXPECT_EQ(bare->seq, 7);
    auto dashed = parse_event_id("a-b-3");
    ASSERT_TRUE(dashed);
    EXPECT_EQ(dashed->journal_id, "a-b");
    for (const char *bad : {"", "abc-", "-5", "x-1a", "x-+1", "yesterday", "x- 1"})
        EXPECT_FALSE(parse_event_id(bad)) << bad;
}

EventRecord event(std::int64_t seq, const std::optional<std::string> &detail) {
    EventRecord e;
    e.seq = seq;
    e.event.at_us = 1796095621000000 + seq;
    e.event.kind = kind::granted;
    e.event.session_id = "b" + std::to_string(seq);
    e.event.uid = 1000;
    e.event.decision = "allow";
    e.event.detail = detail;
    return e;
}

TEST(ExportFlatFields, FromDetailOldDetailOrSession) {
    auto flat = flat_fields(event(1, R"({"flows":["udp * -> *:5000"],"gpu":"g","netdev":"n"})"));
    EXPECT_EQ(flat.netdev, "n");
    EXPECT_EQ(flat.gpu, "g");
    EXPECT_EQ(flat.flows, std::vector<std::string>{"udp * -> *:5000"});
    // A daemon before #16 stored the flows as a JSON string holding the array.
    auto old = flat_fields(event(1, R"({"flows":"[\"udp * -> *:5000\",\"tcp * -> *:1\"]"})"));
    EXPECT_EQ(old.flows, (std::vector<std::string>{"udp * -> *:5000", "tcp * -> *:1"}));
    auto ended = event(2, R"({"rx_bytes":1})");
    ended.session_netdev = "eth2";
    ended.session_gpu = "sim0";
    ended.session_flows = R"(["udp * -> *:9"])";
    auto from_session = flat_fields(ended);
    EXPECT_EQ(from_session.netdev, "eth2");
    EXPECT_EQ(from_session.gpu, "sim0");
    EXPECT_EQ(from_session.flows, std::vector<std::string>{"udp * -> *:9"});
    auto none = flat_fields(event(3, std::nullopt));
    EXPECT_FALSE(none.netdev || none.gpu || none.flows);
}

// A chain of events with the given details, hashed as the journal does, exported line by line.
std::vector<std::string> export_chain(std::vector<EventRecord> events) {
    JournalIdentity id{"00112233445566778899aabbccddeeff", "m", "host-1"};
    Hash prev{};
    std::vector<std::string> lines;
    for (auto &e : events) {
        e.prev_hash = prev;
        e.hash = chain_hash(prev, e.seq, e.event);
        prev = e.hash;
        lines.push_back(export_line(e, id));
    }
    return lines;
}

Result<ExportCheck> check(const std::vector<std::string> &lines, bool allow_gaps = false) {
    std::stringstream in;
    for (auto &l : lines)
        in << l << "\n";
    return verify_export(in, allow_gaps);
}

// Stored details that parsing and dumping would not give back byte for byte, and fields that
// are not valid UTF-8: the export still rebuilds the hashed bytes.
const std::vector<std::optional<std::string>> awkward_details = {
    std::nullopt,
    R"({"a":1,"flows":["udp * -> *:5000"],"netdev":"n"})", // as the daemon writes it
    R"({"b":1,"a":2})",                                    // keys not sorted
    R"({ "a" : 1 })",                                      // spaces
    R"({"x":1e2,"y":0.1})",                                // numbers written differently
    "null",
    "\"text\"",
    "not json at all",
    "{\"exe\":\"/tmp/\\u001b]0;x\"}", // an escape, escaped
    "{\"exe\":\"/tmp/\xff/x\"}",      // not UTF-8 (as a sqlite3 edit could leave)
    "",
};

TEST(ExportVerify, RebuildsEveryDetailExactly) {
    std::vector<EventRecord> events;
    for (std::size_t i = 0; i < awkward_details.size(); ++i)
        events.push_back(event(static_cast<std::int64_t>(i + 1), awkward_details[i]));
    events[2].event.reason = "bad \xc3\x28 utf-8";
    events[3].event.kind = "kind\xfe";
    // Valid UTF-8 that needs escaping: quotes, backslashes, controls, BMP and astral code points.
    events[4].event.reason =
        "a \"quote\" \\ back\\slash \x01\x1b\x7f caf\xc3\xa9 \xf0\x9f\x98\x80 \xc2\x85";
    events[5].event.rule = "\"";
    auto lines = export_chain(events);
    EXPECT_EQ(nlohmann::json::parse(lines[4])["reason"], *events[4].event.reason);
    auto c = check(lines);
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_TRUE(c->ok) << c->problem << " line " << c->bad_line;
    EXPECT_EQ(c->events, static_cast<std::int64_t>(events.size()));
    EXPECT_EQ(c->first_seq, 1);
    // Only details that would not round-trip carry their text, and only bad bytes a raw copy.
    auto record = [&](std::size_t i) { return nlohmann::json::parse(lines[i]); };
    EXPECT_FALSE(record(1).contains("detail_text"));
    EXPECT_TRUE(record(1)["detail"].is_object());
    EXPECT_FALSE(record(2).contains("detail_text")); // key order is kept
    EXPECT_TRUE(record(3).contains("detail_text"));
    EXPECT_TRUE(record(5).contains("detail_text")); // "null" is not an absent detail
    EXPECT_TRUE(record(2)["raw"].contains("reason"));
    EXPECT_TRUE(record(3)["raw"].contains("kind"));
    EXPECT_TRUE(record(9)["raw"].contains("detail"));
    for (auto &l : lines) // ASCII only: safe through any terminal escaping
        EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](char ch) { return ch > 0 && ch < 0x7f; }));
}

TEST(ExportVerify, FindsEditsOfEveryKind) {
    std::vector<EventRecord> events;
    for (std::size_t i = 0; i < awkward_details.size(); ++i)
        events.push_back(event(static_cast<std::int64_t>(i + 1), awkward_details[i]));
    events[2].event.reason = "bad \xc3\x28 utf-8";
    auto lines = export_chain(events);
    struct Edit {
        std::size_t line;
        std::function<void(nlohmann::json &)> change;
    };
    std::vector<Edit> edits = {
        {0, [](auto &r) { r["uid"] = 0; }},
        {1, [](auto &r) { r["detail"]["a"] = 2; }},
        {1, [](auto &r) { r["netdev"] = "other"; }},
        {1, [](auto &r) { r["flows"] = nlohmann::json::array(); }},
        {2, [](auto &r) { r["raw"]["reason"] = "41"; }},
        {2, [](auto &r) { r["reason"] = "fine"; }},
        {3,
         [](auto &r) {
             r["detail"] = {{"a", 2}};
         }}, // detail_text left as it was
        {3, [](auto &r) { r["detail_text"] = R"({ "a" : 2 })"; }},
        {4, [](auto &r) { r["event_id"] = "00112233445566778899aabbccddeeff-99"; }},
        {4, [](auto &r) { r["time"] = "2026-12-01T03:27:01.000009Z"; }},
        {5, [](auto &r) { r.erase("detail_text"); }},
        {6, [](auto &r) { r["seq"] = 70; }},
        {7, [](auto &r) { r["hash"] = std::string(64, 'a'); }},
        {9, [](auto &r) { r["detail"] = "{\"exe\":\"/tmp/?/x\"}"; }},
    };
    for (auto &edit : edits) {
        auto changed = lines;
        auto r = nlohmann::json::parse(changed[edit.line]);
        edit.change(r);
        changed[edit.line] = r.dump();
        auto c = check(changed, true);
        ASSERT_TRUE(c) << c.error().message;
        EXPECT_FALSE(c->ok) << "edit of line " << edit.line + 1 << " not found: " << r.dump();
        EXPECT_EQ(c->bad_line, static_cast<std::int64_t>(edit.line + 1)) << c->problem;
    }
}

TEST(ExportVerify, GapsOrderAndMalformedInput) {
    std::vector<EventRecord> events;
    for (int i = 1; i <= 6; ++i)
        events.push_back(event(i, R"({"a":1})"));
    auto lines = export_chain(events);
    auto gap = lines;
    gap.erase(gap.begin() + 2);
    auto c = check(gap);
    ASSERT_TRUE(c);
    EXPECT_FALSE(c->ok);
    ASSERT_EQ(c->gaps.size(), 1u);
    EXPECT_EQ(c->gaps[0], "event 3 (between lines 2 and 3)");
    c = check(gap, true);
    ASSERT_TRUE(c);
    EXPECT_TRUE(c->ok) << c->problem;
    // A later export alone starts mid-chain: fine, and it says what it chains on from.
    c = check({lines.begin() + 3, lines.end()});
    ASSERT_TRUE(c);
    EXPECT_TRUE(c->ok);
    EXPECT_EQ(c->first_seq, 4);
    EXPECT_EQ(
        c->first_prev_hash,
        to_hex(chain_hash(chain_hash(chain_hash(Hash{}, 1, events[0].event), 2, events[1].event), 3,
                          events[2].event)));
    auto swapped = lines;
    std::swap(swapped[1], swapped[2]);
    c = check(swapped, true);
    ASSERT_TRUE(c);
    EXPECT_FALSE(c->ok);
    EXPECT_FALSE(check({"{\"seq\": 1}"}));
    EXPECT_FALSE(check({lines[0], "garbage"}));
    // An empty export proves nothing: it is not "ok".
    c = check({});
    ASSERT_FALSE(c);
    EXPECT_NE(c.error().message.find("no events"), std::string::npos);
}

TEST(BoundedJson, RefusesDeepNestingOutsideStringsOnly) {
    auto nested = [](std::size_t n) { return std::string(n, '[') + std::string(n, ']'); };
    EXPECT_TRUE(knod::parse_json(nested(max_json_depth)).is_array());
    EXPECT_TRUE(knod::parse_json(nested(max_json_depth + 1)).is_discarded());
    EXPECT_TRUE(knod::parse_json("{\"x\":" + nested(100000) + "}").is_discarded());
    // Brackets inside strings (escaped quotes included) are text, not nesting.
    std::string in_string = "[\"\\\"" + std::string(1000, '[') + "\"]";
    EXPECT_TRUE(knod::parse_json(in_string).is_array());
    EXPECT_TRUE(knod::parse_json("not json").is_discarded());
}

TEST(BoundedJson, FindsARepeatedKeyAtAnyDepthOnly) {
    bool dup = false;
    EXPECT_TRUE(knod::parse_json(R"({"a":{"b":1,"c":2},"d":{"b":1}})", {.duplicate_key = &dup})
                    .is_object());
    EXPECT_FALSE(dup); // the same key in sibling objects is fine
    knod::parse_json(R"({"a":1,"a":2})", {.duplicate_key = &dup});
    EXPECT_TRUE(dup);
    knod::parse_json(R"({"x":[{"n":"eth-evil","n":"knodsim0"}]})", {.duplicate_key = &dup});
    EXPECT_TRUE(dup);
}

TEST(BoundedJson, OutputEscapesTerminalAndBidiControlsAsTheSameStrings) {
    // DEL, C1, U+2028 and the bidi controls nlohmann leaves raw; an ordinary non-ASCII letter
    // stays.
    std::string s = "a\x7f\xc2\x85\xe2\x80\xae\xe2\x80\xa8\xe2\x81\xa6\xe2\x80\x8f\xc3\xa9\x01";
    nlohmann::json j = {{"k", s}};
    std::string out = knod::dump_json_escaped(j);
    EXPECT_EQ(out, R"({"k":"a\u007f\u0085\u202e\u2028\u2066\u200f)"
                   "\xc3\xa9"
                   R"(\u0001"})");
    EXPECT_EQ(nlohmann::json::parse(out), j); // the same value to any reader
    EXPECT_EQ(knod::dump_json_escaped(j, 2),
              "{\n  \"k\": " + out.substr(5, out.size() - 6) + "\n}");
}

TEST(ExportVerify, ADetailTooDeepToParseIsExportedAsTextAndStillVerifies) {
    std::string deep = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
    auto lines = export_chain({event(1, R"({"netdev":"n"})"), event(2, deep)});
    auto r = knod::parse_json(lines[1]);
    ASSERT_TRUE(r.is_object());
    EXPECT_EQ(r["detail"], deep);
    EXPECT_EQ(r["detail_text"], deep);
    auto c = check(lines);
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_TRUE(c->ok) << c->problem;
}

TEST(ExportVerify, RepeatedKeysAndUnknownFieldsAreRefused) {
    auto lines = export_chain({event(1, R"({"gpu":"g","netdev":"knodsim0"})")});
    ASSERT_TRUE(check(lines)->ok);
    auto edited = lines[0];
    auto at = edited.find(R"("netdev":"knodsim0")");
    ASSERT_NE(at, std::string::npos);
    edited.insert(at, R"("netdev":"eth-evil",)");
    auto c = check({edited});
    ASSERT_TRUE(c);
    EXPECT_FALSE(c->ok);
    EXPECT_NE(c->problem.find("repeats a key"), std::string::npos) << c->problem;
    auto extra = lines[0];
    extra.insert(1, R"("note":"x",)");
    EXPECT_FALSE(check({extra}));
}

TEST(FilterValues, UnknownValuesAreNamedWithTheAcceptedOnes) {
    EXPECT_FALSE(cli::check_member("kind", "request-denied", known_kinds()));
    auto typo = cli::check_member("kind", "request-deny", known_kinds());
    ASSERT_TRUE(typo);
    EXPECT_EQ(typo->rfind("unknown kind 'request-deny' (did you mean 'request-denied'?); one of: "
                          "request-granted, request-denied",
                          0),
              0u)
        << *typo;
    auto far = cli::check_member("decision", "zzzzzzzzzz", known_decisions());
    ASSERT_TRUE(far);
    EXPECT_EQ(far->find("did you mean"), std::string::npos) << *far;
}

std::string slurp(const std::filesystem::path &p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Every kind, decision and end reason the daemon writes is one the filters accept.
TEST(FilterValues, CoverWhatTheDaemonWrites) {
    namespace fs = std::filesystem;
    fs::path src = KNOD_SOURCE_DIR;
    std::set<std::string> kinds(known_kinds().begin(), known_kinds().end());
    std::set<std::string> decisions(known_decisions().begin(), known_decisions().end());
    std::set<std::string> reasons(known_end_reasons().begin(), known_end_reasons().end());
    std::string records = slurp(src / "journal/records.h");
    auto ns = records.substr(records.find("namespace kind {"));
    ns = ns.substr(0, ns.find("} // namespace kind"));
    std::regex constant(R"re(constexpr const char \*\s*(\w+)\s*=\s*"([^"]+)")re");
    int seen = 0;
    for (std::sregex_iterator it(ns.begin(), ns.end(), constant), end; it != end; ++it, ++seen)
        if ((*it)[2] != kind::anchor) {
            EXPECT_TRUE(kinds.count((*it)[2])) << "kind " << (*it)[2];
        }
    EXPECT_GT(seen, 10);
    std::regex kind_literal(
        R"re((?:event_for|refuse_action)\(\s*"([^"\n]+)"|\.kind\s*=\s*"([^"\n]+)")re");
    std::regex decision_literal(R"re((?:\.decision\s*=\s*|refuse_action\([^;]*?,\s*)"([^"]+)")re");
    // Every text of the daemon's EndReason (to_string in daemon/end_reason.cc).
    std::string end_reasons = slurp(src / "daemon/end_reason.cc");
    std::regex reason_text(R"re(case EndReason::\w+:\s*return "([^"]+)")re");
    int reasons_seen = 0;
    for (std::sregex_iterator it(end_reasons.begin(), end_reasons.end(), reason_text), end;
         it != end; ++it, ++reasons_seen)
        EXPECT_TRUE(reasons.count((*it)[1])) << "end reason " << (*it)[1];
    EXPECT_GE(reasons_seen, 9);
    int literals = 0;
    for (auto &f : fs::recursive_directory_iterator(src / "daemon")) {
        if (f.path().extension() != ".cc") continue;
        std::string text = slurp(f.path());
        for (std::sregex_iterator it(text.begin(), text.end(), kind_literal), end; it != end;
             ++it, ++literals) {
            std::string k = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
            EXPECT_TRUE(kinds.count(k)) << "kind " << k << " in " << f.path();
        }
        for (std::sregex_iterator it(text.begin(), text.end(), decision_literal), end; it != end;
             ++it, ++literals)
            EXPECT_TRUE(decisions.count((*it)[1])) << "decision " << (*it)[1] << " in " << f.path();
    }
    EXPECT_GT(literals, 8);
}

} // namespace
