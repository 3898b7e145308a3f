// Events as records for other systems (a SIEM, an archive), and the check that a JSON-lines
// export still holds what the journal held, without the database. docs/audit-export.md
// describes the record; in short: one JSON object per event with a global event id, the
// writing host, the time in RFC 3339 with microseconds (and the raw at_us), netdev, GPU and flows
// as top-level fields, and every field the chain hash covers, in a form that rebuilds the hashed
// bytes exactly:
//   - `detail` is the stored detail text parsed, when dumping it back gives that very text;
//     otherwise (text that is not JSON, or JSON written differently) `detail_text` carries the
//     text as well, and `detail` must agree with it;
//   - a hashed text field whose bytes are not valid UTF-8 (JSON cannot carry them) shows with
//     U+FFFD in place of the bad bytes, and `raw` maps the field's name to the hex of its bytes.
#pragma once

#include "journal/identity.h"
#include "journal/reader.h"
#include "knod/result.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace knod::journal {

// "2026-12-01T03:17:55.123456Z": RFC 3339, UTC, always six fractional digits.
std::string rfc3339_us(std::int64_t at_us);

// An event's id in exports: event_id(journal_id, seq), or the bare seq for a journal that has
// no id (written before schema 4): unique only within that journal.
std::string export_event_id(const std::string &journal_id, std::int64_t seq);
struct EventId {
    std::string journal_id; // empty for a bare seq
    std::int64_t seq = 0;
};
// The inverse of export_event_id(); nullopt for text that is neither form.
std::optional<EventId> parse_event_id(std::string_view text);

// What an event says about where it happened: its own detail first (it is in the chain), else
// its session row. Flows that an older daemon stored as a JSON-encoded string are decoded.
struct FlatFields {
    std::optional<std::string> netdev, gpu;
    std::optional<std::vector<std::string>> flows;
};
FlatFields flat_fields(const EventRecord &e);

// One event's record: a line of a JSON-lines export, ASCII only (\u escapes), no newline.
std::string export_line(const EventRecord &e, const JournalIdentity &id);

// Writes the events `f` selects as JSON lines, in chain order; returns how many. This is the
// whole export path of `knod-policy audit export` (and what bench/journal_bench measures).
Result<std::int64_t> export_jsonl(JournalReader &reader, const Filter &f, const JournalIdentity &id,
                                  std::ostream &out);

// The result of checking an export. `ok` false is tampering (or a gap, unless allowed);
// malformed input is an error from verify_export() instead.
struct ExportCheck {
    bool ok = true;
    std::int64_t events = 0;
    std::string journal_id; // of the first record ("" for a journal without one)
    std::int64_t first_seq = 0, last_seq = 0;
    std::string first_prev_hash;   // what the export chains on from (zeros for event 1)
    std::string head_hash;         // the last record's hash
    std::vector<std::string> gaps; // "events 5-7 (between lines 4 and 5)"
    std::int64_t bad_line = 0;     // the first line that failed, 1-based
    std::string bad_event_id;
    std::string problem;
};

// The longest line verify_export reads: the journal's 64 MiB cap on a value, and 1 MiB more. A
// daemon's journal exports about a kilobyte a line; a longer line (or a file with no newline)
// is an error, not memory.
inline constexpr std::size_t max_export_line_bytes = (64 << 20) + (1 << 20);

// Recomputes each record's hash from its own fields and its prev_hash, and checks that each
// record chains to the one before it. Gaps (a filtered export) fail unless `allow_gaps`. A line
// over max_export_line_bytes, or holding an object of more than knod::max_json_object_keys
// keys, is an error naming the line (and the field).
Result<ExportCheck> verify_export(std::istream &in, bool allow_gaps);

} // namespace knod::journal
