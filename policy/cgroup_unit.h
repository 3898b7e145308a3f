// The systemd units a cgroup v2 path belongs to, with the semantics of libsystemd's
// sd_pid_get_unit() and sd_pid_get_user_unit() (cg_path_get_unit / cg_path_get_user_unit),
// applied to a path already read, so that the unit and the `cgroups` rule see the same string.
//
// The system unit is the first component after the leading slices, and only that: a process of
// user 1000 that moves itself into `.../user@1000.service/app.slice/x.service` still belongs to
// the system unit `user@1000.service`; `x.service` is a unit of that user's own manager (the user
// unit), which any process of the user may create.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace knod::policy {

// The cgroup v2 path in the text of /proc/PID/cgroup: the line that starts with "0::" (the
// unified hierarchy), or nullopt. On hybrid hosts the v1 lines come first, and a user who can
// create cgroups in a v1 hierarchy (systemd delegates name=systemd too) can put "0::" inside a
// path there; only a whole line counts. cgroupfs refuses newlines in names.
std::optional<std::string> unified_cgroup_path(std::string_view proc_pid_cgroup);

// True for a valid plain or instance unit name ("a.service", "a@b.service"; not "a@.service").
bool valid_unit_name(std::string_view name);

// The system manager's unit for `cgroup` ("/system.slice/foo.service/x" -> "foo.service"), or
// an empty string when the path names none.
std::string system_unit_of(std::string_view cgroup);

// The user manager's unit (below `user@UID.service`, or in a `session-N.scope`), or empty.
std::string user_unit_of(std::string_view cgroup);

} // namespace knod::policy
