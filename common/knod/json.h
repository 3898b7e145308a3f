// JSON text that cannot throw on bad input: nlohmann's dump() throws on invalid UTF-8, and the
// strings it holds come from callers, /proc, sysfs and files. Invalid bytes become U+FFFD here;
// callers that must keep the bytes readable escape them first (knod/untrusted.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace knod {

inline std::string dump_json(const nlohmann::json &j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace knod
