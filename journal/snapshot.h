// A published snapshot of the live journal: a consistent copy the auditors read, so that no
// lock or transaction of theirs ever touches the daemon's own files (#33 item 4). A reader of
// a WAL database must be able to read its -shm and can lock bytes there that every commit
// needs; the live files are therefore the daemon's alone (0600), and the auditors' group reads
// this copy instead.
//
// Layout, in the snapshot dir (the state dir's `snapshot/`):
//   journal.db         a rollback-journal database (no -wal, no -shm: a read-only reader needs
//                      nothing but read access), replaced page by page under SQLite's own
//                      locking, never renamed over (an old copy a reader keeps open would pin
//                      its disk space)
//   journal.db.anchor  {"seq": N, "hash": "<hex>", "snapshot": {"at_us": T, "live": PATH}}:
//                      the copy's chain head, when it was taken (realtime, microseconds, read
//                      before its read transaction began) and which journal it copies
// Each publication copies the live journal (one read transaction, SQLite's backup API) into a
// private 0600 work file beside the live journal, turns that into a rollback-journal database,
// then copies the work file into the published one; the first (and one over a file that is not
// a whole copy) is filled in a private file in the snapshot dir, synced and renamed into place,
// so the published path never holds a copy being filled (#52). A reader that holds the published
// copy's lock makes one publication wait `busy_wait`, then fail with Errc::unavailable: the
// snapshot falls behind (the daemon says so in `status`), the live journal never waits.
#pragma once

#include "knod/result.h"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace knod::journal {

// What a snapshot's anchor says beyond the chain head (absent in a live journal's anchor).
struct SnapshotMark {
    std::int64_t at_us = 0; // realtime when the copy's read transaction was about to begin
    std::string live;       // the live journal's path (as the daemon opened it)
};

// The snapshot dir for a live journal at `live_path`: its directory's `snapshot/`.
std::string snapshot_dir(const std::string &live_path);
// The published copy for a live journal at `live_path`.
std::string snapshot_path(const std::string &live_path);

// For a reader given the live journal's path: the published snapshot beside it when `path`
// itself cannot be opened for reading for lack of permission (EACCES: the live files are the
// daemon's alone) and the snapshot can; nullopt otherwise (read `path`, and let its error say
// why not).
std::optional<std::string> snapshot_instead(const std::string &path);

// For an auditor who may not read the live journal at `live_path`: why there is no snapshot to
// read instead, when that is why (the snapshot dir holds none yet, or there is no snapshot dir);
// nullopt when one exists or the reader may not look (it is not told what lies there).
std::optional<std::string> snapshot_not_published(const std::string &live_path);

// The live journal `path` is a published snapshot of, judged by the file system alone, never by
// anything its anchor says: `path` names, with no symbolic link on the way, DIR/snapshot/NAME,
// where the snapshot dir is a directory no one but its owner may write, and DIR/NAME is a
// different regular file of that same owner (the daemon's account, which writes both). Only
// there is a snapshot mark the daemon's word, and only there do auditors read a file that is
// rewritten while they read it. Nullopt otherwise (a copy elsewhere, a link, a lookalike).
std::optional<std::string> published_snapshot_of(const std::string &path);

// Whether an anchor's snapshot mark on `path` is the daemon's word: `path` is a published
// snapshot (published_snapshot_of) of exactly the journal the mark names. A mark anywhere else
// is a claim whoever wrote the anchor could add to a rolled-back live journal, to pass the
// system journal's newer heads off as "after the snapshot".
bool at_snapshot_path(const std::string &path, const SnapshotMark &mark);

struct Published {
    std::int64_t seq = 0;   // the copy's last event (0: the journal had none)
    std::int64_t at_us = 0; // SnapshotMark::at_us
};

class SnapshotPublisher {
  public:
    // `live_path`: the daemon's journal. `mode`: the published files' mode (0640 where the
    // state dir's group reads them, else 0600). The snapshot dir must exist and be the
    // daemon's own (daemon/state_dir.h checks it, as it checks the state dir).
    static Result<SnapshotPublisher>
    open(std::string live_path, mode_t mode,
         std::chrono::milliseconds busy_wait = std::chrono::milliseconds(200));

    // Copies the live journal now and publishes it. Errc::unavailable when a reader held the
    // published copy's lock longer than busy_wait (nothing published; the last copy stays whole);
    // Errc::io on a full disk or another failure to write (the same).
    Result<Published> publish();

    const std::string &path() const { return published_; }

  private:
    SnapshotPublisher(std::string live, std::string dir, mode_t mode,
                      std::chrono::milliseconds busy_wait);
    Result<void> publish_whole();    // the work file renamed into place whole
    Result<void> publish_in_place(); // the work file's pages copied over the published ones
    std::string live_, dir_, published_, work_;
    mode_t mode_;
    std::chrono::milliseconds busy_wait_;
};

} // namespace knod::journal
