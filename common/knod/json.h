// JSON text that cannot throw on bad input: nlohmann's dump() throws on invalid UTF-8, and the
// strings it holds come from callers, /proc, sysfs and files. Invalid bytes become U+FFFD here;
// callers that must keep the bytes readable escape them first (knod/untrusted.h).
#pragma once

#include "knod/untrusted.h"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace knod {

inline std::string dump_json(const nlohmann::json &j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// JSON text for output (a terminal, a pipe, a file an auditor reads): as dump_json, and also
// DEL, the C1 controls, U+2028/2029 and the bidi controls (knod::is_control) \u-escaped, which
// nlohmann leaves raw. The same values to any JSON reader, and no byte a terminal acts on or
// reorders text by, so the CLI's terminal filter (cli/terminal_output.h) finds nothing to
// rewrite. Those code points occur only inside strings (JSON's own syntax is ASCII).
inline std::string dump_json_escaped(const nlohmann::json &j, int indent = -1) {
    std::string text = dump_json(j, indent);
    // DEL, and the lead bytes of U+0080-009F (0xc2) and U+2000-2FFF (0xe2).
    if (text.find_first_of("\x7f\xc2\xe2") == std::string::npos) return text;
    static const char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size() + 32);
    char32_t cp = 0;
    for (std::size_t i = 0; i < text.size();) {
        std::size_t n = utf8_sequence(text, i, cp);
        if (n != 0 && cp >= 0x7f && (is_control(cp) || cp == 0x2028 || cp == 0x2029)) {
            out += "\\u";
            for (int shift = 12; shift >= 0; shift -= 4)
                out += hex[(cp >> shift) & 15];
            i += n;
            continue;
        }
        if (n == 0) n = 1; // never: dump_json replaced invalid UTF-8
        out.append(text, i, n);
        i += n;
    }
    return out;
}

// nlohmann parses any depth, but dumps, copies and compares recursively: text nested 100,000
// deep (a journal detail, an export line) would overflow the stack. Nothing knod writes nests
// near this.
constexpr std::size_t max_json_depth = 256;

// No object knod writes has more than a few dozen keys (a journal detail, an export record).
// nlohmann::ordered_json finds each key it inserts by a linear search, and so did the export's
// duplicate-key check, so an object of N keys took N^2 to read: readers refuse more than this.
constexpr std::size_t max_json_object_keys = 1024;

// What a cheap pre-scan of `text` (outside strings; it does not check the text is JSON) finds
// against the two bounds readers hold JSON to.
struct JsonShape {
    bool too_deep = false; // a bracket nests deeper than max_json_depth
    // The first object of more than max_json_object_keys keys: the top-level member it is in,
    // as its raw text; empty for the top-level object itself or one in a top-level array.
    std::optional<std::string> over_keys;
};

inline JsonShape json_shape(std::string_view text) {
    constexpr std::size_t array = std::string_view::npos;
    JsonShape shape;
    std::vector<std::size_t> keys; // per open bracket: an object's keys so far, or `array`
    std::string_view top_member;
    bool in_string = false, key = false, expect_key = false;
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
                if (key && keys.size() == 1) top_member = text.substr(start, i - start);
            }
            continue;
        }
        switch (c) {
        case '"':
            in_string = true;
            key = expect_key;
            expect_key = false;
            start = i + 1;
            if (key && ++keys.back() > max_json_object_keys && !shape.over_keys)
                shape.over_keys = std::string(keys.size() == 1 ? std::string_view() : top_member);
            break;
        case '{':
        case '[':
            if (keys.size() == max_json_depth) {
                shape.too_deep = true;
                return shape;
            }
            keys.push_back(c == '{' ? 0 : array);
            expect_key = c == '{';
            break;
        case '}':
        case ']':
            if (!keys.empty()) keys.pop_back();
            expect_key = false;
            break;
        case ',':
            expect_key = !keys.empty() && keys.back() != array;
            break;
        default:
            break;
        }
    }
    return shape;
}

// True when no bracket in `text` nests deeper than max_json_depth (json_shape()).
inline bool json_depth_within(std::string_view text) {
    return !json_shape(text).too_deep;
}

// Where `text` first holds an object of more than max_json_object_keys keys (json_shape()).
inline std::optional<std::string> json_object_over_keys(std::string_view text) {
    return json_shape(text).over_keys;
}

struct JsonParseOptions {
    // Set when an object anywhere in the text repeats a key (nlohmann keeps the last value).
    bool *duplicate_key = nullptr;
};

// Parses journal or export text without throwing: text that is not JSON, nests deeper than
// max_json_depth or holds an object of more than max_json_object_keys keys comes back discarded
// (is_discarded()).
template <typename Json = nlohmann::json>
Json parse_json(std::string_view text, JsonParseOptions opts = {}) {
    if (auto shape = json_shape(text); shape.too_deep || shape.over_keys)
        return Json(nlohmann::json::value_t::discarded);
    if (!opts.duplicate_key) return Json::parse(text, nullptr, false);
    // The keys seen so far in each open object, innermost last.
    std::vector<std::set<std::string>> keys;
    bool *dup = opts.duplicate_key;
    *dup = false;
    typename Json::parser_callback_t cb = [&keys, dup](int, nlohmann::json::parse_event_t event,
                                                       Json &parsed) {
        using E = nlohmann::json::parse_event_t;
        if (event == E::object_start) {
            keys.emplace_back();
        } else if (event == E::object_end) {
            if (!keys.empty()) keys.pop_back();
        } else if (event == E::key && !keys.empty() && parsed.is_string()) {
            if (!keys.back().insert(parsed.template get_ref<const std::string &>()).second)
                *dup = true;
        }
        return true;
    };
    return Json::parse(text, cb, false);
}

} // namespace knod
