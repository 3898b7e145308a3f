// How audit commands print: times, CSV fields, and one JSON object per session or event.
#pragma once

#include "journal/identity.h"
#include "journal/reader.h"
#include "journal/records.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace knod::cli {

// "2026-11-29T16:31:37Z" from microseconds since the epoch; "" for none.
std::string format_time(std::optional<std::int64_t> us);

// `db` (a --db) replaced by the published snapshot beside it when `db` is the daemon's own
// (unreadable: EACCES) and the snapshot is readable (journal/snapshot.h); says so on stderr,
// with the snapshot's age, so no one mistakes it for the live journal.
void read_snapshot_if_live_unreadable(std::string &db);
// Accepts "now", relative ages ("90s", "15m", "2h", "7d", with or without a leading '-'), and
// UTC dates "2026-11-29", "2026-11-29T10:00[:00][Z]" (a space may replace the T).
std::optional<std::int64_t> parse_time(const std::string &text, std::int64_t now_us);

std::string csv_field(const std::string &v);
std::string csv_row(const std::vector<std::string> &fields);

// Sessions as records: times in RFC 3339 with microseconds (and raw *_us), the journal's host.
nlohmann::json session_json(const journal::Session &s, const journal::JournalIdentity &id = {});
std::vector<std::string> session_row(const journal::Session &s);
// An event as a CSV/table row, the same fields as its export record (journal/export.h): flows
// joined with "; " (a flow spec itself holds spaces), detail as the stored text.
std::vector<std::string> event_row(const journal::EventRecord &e,
                                   const journal::JournalIdentity &id);
extern const std::vector<std::string> session_columns;
extern const std::vector<std::string> event_columns;

// A filter value must be one of `accepted`: nullopt if it is, else the message for the user,
// "unknown kind 'request-deny' (did you mean 'request-denied'?); one of: ...".
std::optional<std::string> check_member(const std::string &what, const std::string &value,
                                        const std::vector<std::string> &accepted);

} // namespace knod::cli
