// The daemon's state dir (journal, its anchor, the key secret) is trusted only when it is the
// daemon's own: a directory (not a link) owned by the daemon's effective uid that no one else
// may write. Otherwise another user could plant links, swap files or read the journal.
#pragma once

#include "knod/result.h"

#include <sys/types.h>

#include <string>
#include <vector>

namespace knod::daemon {

// Creates `dir` (0700) if absent, then checks it. The error names the fix.
Result<void> prepare_state_dir(const std::string &dir);

// A file of the state dir and the loosest mode it may have: 0600 (the key secret) or 0640 (the
// journal's files, readable by the state dir's group: the auditors, in the packaged layout where
// the dir is 2750 knod-policy:knod-audit).
struct StateFile {
    std::string name;
    mode_t mode;
};

// Checks the daemon's files in `dir` that exist: each must be a regular file (never a link)
// owned by the daemon's effective uid; one with more permissions than its StateFile allows is
// tightened to that mode (it is ours; only its mode was loose), and the returned notes say so.
// A group-readable file whose group is not the dir's group (where the dir lets its group in)
// is given the dir's group when the daemon may, otherwise a note names the fix. Creates
// `create_name`, when absent, with O_CREAT|O_EXCL|O_NOFOLLOW and its StateFile's mode.
Result<std::vector<std::string>> check_state_files(const std::string &dir,
                                                   const std::vector<StateFile> &files,
                                                   const std::string &create_name = {});

// The auditors' snapshot dir, `dir`/snapshot (journal/snapshot.h): created when absent, and
// checked as the state dir is (a directory of the daemon's user, not a link, written by no
// one else). Where the state dir lets its group in (2750 knod-policy:knod-audit, packaged), the
// snapshot dir is 0750 of that group and its files 0640; otherwise 0700 and 0600. Returns the
// files' mode; their modes and owner are checked as check_state_files() does.
Result<mode_t> prepare_snapshot_dir(const std::string &dir);

} // namespace knod::daemon
