// The chain-head copies in the system journal: the daemon sends its journal's head to journald
// as `journal-anchor` records (KNOD_JOURNAL_ID, KNOD_SEQ, KNOD_HASH), at most once a second.
// They live outside the database and outside its anchor file, so a rollback of both together
// still disagrees with them. This reads them (the local system journal, a directory of journal
// files, or named files gathered from a host) and compares each with the database.
#pragma once

#include "journal/retention.h"
#include "journal/sqlite.h"
#include "knod/result.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace knod::journal {

struct SystemJournalSource {
    std::string directory;          // sd_journal_open_directory
    std::vector<std::string> files; // sd_journal_open_files
    // Who may have sent a head beside root: the daemon's account on the node (its uid there;
    // by default this machine's knod-policy account, which a collector may not have).
    std::optional<std::string> daemon_uid;
    // Neither: the local system journal (sd_journal_open, every journal this user may read).
    bool local() const { return directory.empty() && files.empty(); }
    std::string describe() const;
};

struct AnchorCopy {
    std::int64_t seq = 0;
    std::string hash;         // 64 lowercase hex digits
    std::int64_t at_us = 0;   // when journald received it (realtime)
    std::string journal_path; // where the daemon's journal was (KNOD_JOURNAL_PATH)
    std::string machine_id;   // the host whose journald received it (_MACHINE_ID)
    // The daemon run that sent it (KNOD_HEAD_RUN, 32 hex digits) and its number in that run
    // (KNOD_HEAD_N, from 1); empty and 0 for heads of daemons before #52.
    std::string run;
    std::int64_t head_n = 0;
};

// Heads of one daemon run that the system journal does not hold, between two it does: journald
// did not keep them (its rate limit, its disk) or they were removed from it.
struct MissingHeads {
    std::string run;
    std::int64_t first = 0, last = 0; // the missing numbers, first..last
    std::int64_t after_seq = 0;       // the event the head before them names
    std::int64_t before_seq = 0;      // the event the head after them names, or for a tail
                                      // the run's daemon-stop, which says how many it sent
    bool tail = false;                // after the newest head journald holds of that run
};

// The heads of another journal than the one read.
struct OtherJournal {
    std::string journal_id;
    std::string journal_path;
    std::string machine_id;
    std::int64_t records = 0;
    std::int64_t newest_seq = 0;
    std::int64_t newest_at_us = 0; // journald's time of its latest record
};

// What read_anchor_copies found beside the journal's own heads.
struct OtherHeads {
    std::vector<OtherJournal> journals; // by id, path and host; at most max_other_journals
    bool truncated = false;             // more than that: not all are listed
    // Heads of this journal sent by an account that is not trusted, by uid: the daemon's
    // account on the node has another uid than here (SystemJournalSource::daemon_uid).
    std::map<std::string, std::int64_t> untrusted_senders;
};
inline constexpr std::size_t max_other_journals = 4096;
inline constexpr std::size_t max_missing_listed = 16;

// Every anchor record of `journal_id` in `source`, oldest first, sent by a trusted account.
// With `others`, also the heads of every other journal there and this journal's heads from
// untrusted senders; without it those are not read. An error when nothing can be read (no
// journal files, none readable, a named file that does not open): the reason says which.
Result<std::vector<AnchorCopy>> read_anchor_copies(const SystemJournalSource &source,
                                                   const std::string &journal_id,
                                                   OtherHeads *others = nullptr);

// The journals in `others` from the same host as `copies` (this journal's heads), whatever
// their path (root chooses the path), less those in `expected` (ids the auditor knows run
// there). A head without _MACHINE_ID, on either side, counts as from every host. Each is a
// journal beside or before this one whose history is not in it.
std::vector<OtherJournal> other_journals_on_host(const std::vector<AnchorCopy> &copies,
                                                 const std::vector<OtherJournal> &others,
                                                 const std::vector<std::string> &expected);

struct SystemJournalCheck {
    bool ok = true;
    std::int64_t compared = 0; // copies checked against an event still in the database
    std::int64_t pruned = 0;   // copies of events retention has removed since (not checked)
    std::int64_t pruned_by_retention = 0; // of those, shown old enough for --retention
    std::int64_t records = 0;             // copies found for this journal
    std::optional<AnchorCopy> newest;     // the copy with the highest seq
    std::int64_t bad_seq = 0;             // the event a failing copy names
    std::string problem;
    std::int64_t last_event = 0; // the journal's (or snapshot's) last event, for "N of M"
    std::int64_t runs = 0;       // daemon runs whose heads are numbered
    // Gaps in those numbers, oldest first (at most max_missing_listed; missing_ranges counts all).
    // Any makes the check fail: an auditor cannot tell a head journald dropped from a cut.
    std::vector<MissingHeads> missing;
    std::int64_t missing_ranges = 0;
    std::int64_t missing_heads = 0;
    // A snapshot: copies past its end that journald received after it was taken (not in it,
    // as expected), and the newest of them.
    std::int64_t newer_than_snapshot = 0;
};

// Compares each copy with the journal `db` (read-only, one snapshot: begun here unless the
// caller's transaction is open, e.g. the one verify_chain() leaves; `name` names it in
// messages): a copy beyond the last event means the database lost its tail (truncated or rolled
// back), a copy whose hash differs means the event was rewritten, a copy below the first
// remaining event was pruned. Read the copies before the snapshot begins: the daemon sends a
// head only after committing it.
// A copy of an event retention pruned is compared with the checkpoint at its seq where there is
// one (a different hash: rewritten), and makes the check fail whether it matches or not (heads
// are public: a wipe of all history chained on a checkpoint that holds a copied head looks like
// a prune) unless `allow_pruned` (the auditor expects that prune: --allow-pruned-anchor), or
// unless `retention_us` (--retention AGE), a retention-prune in `prunes` (VerifyReport::prunes)
// removed it, and journald received every copy of it at least AGE ago by this machine's clock: the
// event was written no later than its copy, so a retention that keeps AGE may have pruned it by
// now. Nothing the chain says about its prunes' times counts here: whoever rewrites the chain
// writes them, and can send a head to vouch for them. A copy journald received more than an hour in
// this clock's future fails: the node's clock was set forward (or the auditor's is wrong), and such
// times prove nothing. `snapshot_at_us`: `db` is a published snapshot taken then
// (VerifyReport::snapshot): a copy past its end that journald received at or after that time is
// counted in newer_than_snapshot, not a failure; one received before it is (the daemon sends a head
// only after committing it, so the snapshot, whose read began later, must hold that event).
Result<SystemJournalCheck> check_anchor_copies(Database &db, const std::string &name,
                                               const std::vector<AnchorCopy> &copies,
                                               bool allow_pruned = false,
                                               std::optional<std::int64_t> retention_us = {},
                                               std::optional<std::int64_t> snapshot_at_us = {},
                                               const std::vector<PruneRecord> &prunes = {});

} // namespace knod::journal
