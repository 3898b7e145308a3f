// Where a journal came from: its own random id and the host of the daemon that writes it
// (schema 4's meta table). Exports and the chain-head copies in the system journal carry these,
// so records from many hosts and many journals never collide and a copy says where it was made.
#pragma once

#include "journal/sqlite.h"
#include "knod/result.h"

#include <cstdint>
#include <string>

namespace knod::journal {

struct JournalIdentity {
    std::string journal_id; // 32 lowercase hex digits; empty in a journal older than schema 4
    std::string machine_id; // /etc/machine-id of the writing host; empty if unknown
    std::string hostname;   // gethostname() of the writing host; empty if unknown
};

// An event's id outside the database, unique across journals and hosts: "<journal_id>-<seq>".
std::string event_id(const std::string &journal_id, std::int64_t seq);

// This host's facts: /etc/machine-id (32 lowercase hex digits, else empty) and gethostname().
JournalIdentity this_host();

// The identity stored in `db`; empty fields where the journal predates schema 4.
Result<JournalIdentity> read_identity(Database &db);
// Records this host as the journal's writer (the journal_id is made by the schema, never here).
Result<void> write_host(Database &db, const JournalIdentity &host);

} // namespace knod::journal
