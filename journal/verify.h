// Chain verification: reads a journal read-only and checks that every event follows the one
// before it (sequence without gaps, stored prev_hash, recomputed hash), then that the tables
// beside the chain (sessions, policies, meta, checkpoints) hold what the chain's events say
// (table_check.h).
#pragma once

#include "journal/reader.h"
#include "journal/retention.h"
#include "journal/snapshot.h"
#include "knod/result.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace knod::journal {

struct VerifyReport {
    bool ok = true;
    std::int64_t events_checked = 0;
    std::int64_t total_events = 0;
    std::int64_t first_bad_seq = 0; // 0 when ok
    std::string problem;            // what is wrong with the first bad event
    std::string head_hash;          // hex of the last good event's hash
    std::int64_t first_seq = 0;     // above 1 after retention pruned the oldest events
    bool anchor_checked = false;    // the head recorded outside the database was compared
    bool anchor_pruned = false;     // it names a pruned event, accepted (AnchorUse::allow_pruned)
    // Accepted by --retention: a prune in the chain removed it, and the anchor file (its mtime)
    // is at least that old by this clock.
    bool anchor_pruned_by_retention = false;
    std::int64_t anchor_seq = 0;
    // The retention-prune events in the chain, by the last event each removed (ascending).
    std::vector<PruneRecord> prunes;
    // The tables beside the chain (table_check.h), checked once the chain is intact: when they
    // fail, chain_intact stays true and first_bad_seq is the event the bad row contradicts (0
    // for a row no event explains).
    bool chain_intact = true;
    std::int64_t sessions_checked = 0;     // rows that match the values their events carry
    std::int64_t sessions_not_covered = 0; // opened by an older build: the chain has no values
    std::int64_t policies_checked = 0;     // stored policy texts that match their digests
    // What the anchor claims when it says the file is a published snapshot (journal/snapshot.h).
    // A claim only: anyone who can write the anchor can add it. Take it (check_anchor_copies'
    // `snapshot_at_us`) where at_snapshot_path() says the file lies where the daemon publishes,
    // or where the auditor says so (audit verify --as-snapshot).
    std::optional<SnapshotMark> snapshot_mark;
};

// How verify treats the anchor beside the journal.
enum class AnchorUse {
    require, // a missing anchor is a failure: it is what finds a truncated tail
    ignore,  // the chain alone (--no-anchor): a truncated tail goes unnoticed
    // As require, but an anchor naming an event retention has pruned since is accepted
    // (--allow-pruned-anchor): the auditor expects that prune. A checkpoint at its seq must
    // still hold its hash. Without it such an anchor makes the verdict not-ok: wiping history up to
    // and past the anchor, then chaining a new one on an invented checkpoint, looks the same.
    allow_pruned,
};

// `progress(done, total)` is called now and then for long journals.
using VerifyProgress = std::function<void(std::int64_t done, std::int64_t total)>;

// `anchor`: a file holding the chain head as the daemon last wrote it (see anchor_path());
// empty means the default beside the database. A journal that ends before the anchor's event
// was truncated; one whose event differs from the anchor was rewritten; with AnchorUse::require
// a missing anchor is a failure. A malformed or unreadable anchor file is an error.
// `retention_us` (--retention AGE): the auditor's word that the node prunes only events older
// than that. Every retention-prune in the chain must show its newest pruned event that old (a
// prune that records no times cannot, and fails), and an anchor naming a pruned event is
// accepted when a prune in the chain removed it and the anchor file's mtime (when the daemon
// wrote it, or when it was copied: after its event either way) is at least that old by this
// clock. Never on the prune's own times (a wipe writes them), nor on a checkpoint holding the
// anchor's hash alone: heads are public, and a wipe of all history chained on such a
// checkpoint looks like a prune.
// Whatever it is given, each prune is checked against the retention it records itself.
Result<VerifyReport> verify_chain(const std::string &path, const VerifyProgress &progress = {},
                                  const std::string &anchor = {},
                                  AnchorUse use = AnchorUse::require,
                                  std::optional<std::int64_t> retention_us = std::nullopt);

// The same on a journal the caller opened (`path` names it in messages and places the default
// anchor). The reads share one transaction, begun here unless the caller began one, and left
// open: whatever the caller reads next on this connection sees the snapshot that was verified.
Result<VerifyReport> verify_chain(ReadOnlyJournal &journal, const std::string &path,
                                  const VerifyProgress &progress = {},
                                  const std::string &anchor = {},
                                  AnchorUse use = AnchorUse::require,
                                  std::optional<std::int64_t> retention_us = std::nullopt);

} // namespace knod::journal
