// JSON text that cannot throw on bad input: nlohmann's dump() throws on invalid UTF-8, and the
// strings it holds come from callers, /proc, sysfs and files. Invalid bytes become U+FFFD here;
// callers that must keep the bytes readable escape them first (knod/untrusted.h).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace knod {

inline std::string dump_json(const nlohmann::json &j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// nlohmann parses any depth, but dumps, copies and compares recursively: text nested 100,000
// deep (a journal detail, an export line) would overflow the stack. Nothing knod writes nests
// near this.
constexpr std::size_t max_json_depth = 256;

// True when no bracket in `text` (outside strings) nests deeper than `max`. A cheap pre-scan;
// it does not check the text is JSON.
inline bool json_depth_within(std::string_view text, std::size_t max = max_json_depth) {
    std::size_t depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) return false;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return true;
}

struct JsonParseOptions {
    // Set when an object anywhere in the text repeats a key (nlohmann keeps the last value).
    bool *duplicate_key = nullptr;
};

// Parses journal or export text without throwing: text that is not JSON, or nests deeper than
// max_json_depth, comes back discarded (is_discarded()).
template <typename Json = nlohmann::json>
Json parse_json(std::string_view text, JsonParseOptions opts = {}) {
    if (!json_depth_within(text)) return Json(nlohmann::json::value_t::discarded);
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
