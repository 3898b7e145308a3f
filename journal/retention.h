// What a retention-prune event records about the retention in force, and the checks verify
// makes with it (#31): a prune of events younger than the journal's own recorded retention, or
// than the retention the auditor names (`audit verify --retention AGE`), is reported.
#pragma once

#include "knod/result.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace knod::journal {

// Times, ages and seqs from a journal are attacker data: their sums and differences are taken
// in 128 bits, where they cannot overflow.
__extension__ typedef __int128 wide_int;

// The daemon's retention settings as the journal records them, in a retention-prune's detail
// and in daemon-start's: {"age_us": N or null, "events": N or null} (null: not set).
nlohmann::json retention_json(std::optional<std::int64_t> age_us,
                              std::optional<std::int64_t> events);

// A retention-prune event's detail, as far as its times and settings go.
struct PruneRecord {
    std::int64_t seq = 0;            // the prune event itself
    std::int64_t pruned_through = 0; // the last event it removed (its checkpoint's seq)
    std::int64_t pruned_at_us = 0;
    std::optional<std::int64_t> through_at_us; // when that event was written (absent before #31)
    bool records_retention = false;            // "retention" present (a build after #31)
    std::optional<std::int64_t> age_us;        // the age setting in force, if any
    std::optional<std::int64_t> keep_events;   // the event-count setting in force, if any
};

// Reads a retention-prune event's detail. An error (the field named) for a detail that is not
// what retention writes: pruned_through, pruned_at_us and, where present, through_at_us and
// retention of the wrong type or out of range.
Result<PruneRecord> read_prune(std::int64_t seq, const nlohmann::json &detail);

// Why `p` is not a prune retention makes, if it is not: with the settings it records, the
// newest event it removed must be older than the age setting at the prune, or the prune must
// leave at least the event-count setting's events. `claimed_age_us` (the auditor's --retention):
// the newest pruned event must also be at least that old, whatever the journal records; a prune
// that records no times cannot show that and is reported too.
std::optional<std::string> prune_problem(const PruneRecord &p,
                                         std::optional<std::int64_t> claimed_age_us);

// An age as verify's messages show it ("180d", "36h", "90s", "1500000us").
std::string age_text(std::int64_t us);

} // namespace knod::journal
