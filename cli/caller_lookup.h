// Builds the policy Caller that `explain` decides for, from the same inputs the daemon uses:
// a uid, and the groups the calling process holds. The daemon takes groups from the process
// (the bus's UnixGroupIDs or /proc/PID/status), never from the user database, so `explain`
// says where its groups came from.
#pragma once

#include "knod/result.h"
#include "policy/engine.h"

#include <string>
#include <vector>

namespace knod::cli {

// Who `explain` evaluates when --user is not given: the person who invoked it. Under sudo
// (euid 0 with SUDO_UID set) that is SUDO_UID, not root; otherwise the real uid.
struct Invoker {
    std::string uid;
    std::string how; // "you", "you (SUDO_UID, under sudo)"
};
Invoker invoking_user();

// The uid and user name; no groups yet.
Result<policy::Caller> lookup_caller(const std::string &user_or_uid);

// Where the caller's groups came from, for the report.
enum class GroupsSource { given, this_process, user_database };
const char *to_string(GroupsSource s);

// Fills c.gids and c.group_names: from `given` (names or gids) when not empty; else this
// process's own groups (getegid + getgroups) when c is this process's uid; else the user
// database (NSS), which the daemon never uses, as a stand-in.
Result<GroupsSource> fill_groups(policy::Caller &c, const std::vector<std::string> &given);

} // namespace knod::cli
