// The systemd units a cgroup v2 path belongs to, with the semantics of libsystemd's
// sd_pid_get_unit() and sd_pid_get_user_unit() (cg_path_get_unit / cg_path_get_user_unit),
// applied to a path already read, so that the unit and the `cgroups` rule see the same string.
//
// The system unit is the first component after the leading slices, and only that: a process of
// user 1000 that moves itself into `.../user@1000.service/app.slice/x.service` still belongs to
// the system unit `user@1000.service`; `x.service` is a unit of that user's own manager (the user
// unit), which any process of the user may create.
#pragma once

#include <string>
#include <string_view>

namespace knod::policy {

// True for a valid plain or instance unit name ("a.service", "a@b.service"; not "a@.service").
bool valid_unit_name(std::string_view name);

// The system manager's unit for `cgroup` ("/system.slice/foo.service/x" -> "foo.service"), or
// an empty string when the path names none.
std::string system_unit_of(std::string_view cgroup);

// The user manager's unit (below `user@UID.service`, or in a `session-N.scope`), or empty.
std::string user_unit_of(std::string_view cgroup);

} // namespace knod::policy
