// The daemon's state dir (journal, its anchor, the key secret) is trusted only when it is the
// daemon's own: a directory (not a link) owned by the daemon's effective uid that no one else
// may write. Otherwise another user could plant links, swap files or read the journal.
#pragma once

#include "knod/result.h"

#include <string>
#include <vector>

namespace knod::daemon {

// Creates `dir` (0700) if absent, then checks it. The error names the fix.
Result<void> prepare_state_dir(const std::string &dir);

// Checks the daemon's files in `dir` that exist: each must be a regular file (never a link)
// owned by the daemon's effective uid; one that others may read or write is tightened to 0600
// (it is ours; only its mode was loose), and the returned notes say so. Creates `create_name`,
// when absent, with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600.
Result<std::vector<std::string>> check_state_files(const std::string &dir,
                                                   const std::vector<std::string> &names,
                                                   const std::string &create_name = {});

} // namespace knod::daemon
