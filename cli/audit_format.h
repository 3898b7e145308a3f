// How audit commands print: times, CSV fields, and one JSON object per session or event.
#pragma once

#include "daemon/journal/records.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace knod::cli {

// "2026-11-29T16:31:37Z" from microseconds since the epoch; "" for none.
std::string format_time(std::optional<std::int64_t> us);
// Accepts "now", relative ages ("90s", "15m", "2h", "7d", with or without a leading '-'), and
// UTC dates "2026-11-29", "2026-11-29T10:00[:00][Z]" (a space may replace the T).
std::optional<std::int64_t> parse_time(const std::string &text, std::int64_t now_us);

std::string csv_field(const std::string &v);
std::string csv_row(const std::vector<std::string> &fields);

nlohmann::json session_json(const journal::Session &s);
nlohmann::json event_json(const journal::StoredEvent &e);
std::vector<std::string> session_row(const journal::Session &s);
std::vector<std::string> event_row(const journal::StoredEvent &e);
extern const std::vector<std::string> session_columns;
extern const std::vector<std::string> event_columns;

} // namespace knod::cli
