// knod-policy audit: the parts of exports that are more than printing rows: which journal the
// records come from, where an incremental export resumes, and re-verifying an export file.
#pragma once

#include "journal/identity.h"
#include "journal/reader.h"
#include "knod/result.h"

#include <cstdint>
#include <string>

namespace knod::cli {

// The journal's identity for records; a journal written before schema 4 has none, and stderr
// says so once (event ids are then bare sequence numbers, host and machine_id null).
Result<journal::JournalIdentity> record_identity(journal::JournalReader &reader,
                                                 const std::string &db, const std::string &command);

// The seq that `--after EVENT_ID` resumes after. An id of another journal is an error naming
// both; an id past the head is fine (nothing follows it).
Result<std::int64_t> resume_after(const std::string &event_id, const journal::JournalIdentity &id,
                                  const std::string &db);

// `audit verify --export FILE` ("-": stdin): exit 0 intact, 1 edited/reordered/gap, 2 unreadable
// or not an export.
int verify_export_file(const std::string &file, bool allow_gaps, bool json);

} // namespace knod::cli
