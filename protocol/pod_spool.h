// The CNI plugin's spool (issue 52): where knod-cni leaves a pod's registration (ADD) or
// deletion (DEL) that knod-policyd could not take within the plugin's budget (hung, stopped,
// not started yet), and which the daemon carries out when it runs again (at its start and on
// each tick). Shared by the writer (cni/knod_cni.cc) and the reader (daemon/pod_admission.cc).
//
// One file per sandbox attachment, named "<container id>@<ifname>" (both checked to
// [A-Za-z0-9_.-], so a name is never a path), holding one JSON object:
//   {"op": "add" | "del", "container_id", "ifname", "network",
//    "netns": the runtime's CNI_NETNS path, "netns_dev", "netns_ino": what the plugin's fstat
//    of it said (the daemon opens the path again and must find the same namespace),
//    "pod": {namespace, name, uid, network}, "annotations": {...},
//    "delivered": "no" (the daemon was not running: nothing reached it) | "unknown" (a timeout:
//    the call may still be served), "written_us"}
// Written as a temporary file, fsync'd and renamed: a reader sees a whole file or none. A later
// operation for the same attachment replaces the earlier one (the newest is what holds).
//
// Trust (docs/threat-model.md): the directory must be owned by root and closed to others
// (mode 0700, or 2770 with the daemon's group so that the daemon's account reads and removes
// entries); an entry counts only as a regular file owned by root, with one link, writable by
// nobody else. Bounded: at most max_entries files, each at most max_entry_bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace knod::pod_spool {

inline constexpr const char *default_dir = "/run/knod-cni";
inline constexpr std::size_t max_entries = 1024;
inline constexpr std::size_t max_entry_bytes = 64 * 1024;

inline bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

// The entry's file name, or nullopt when either part is not [A-Za-z0-9_.-] (1-128 bytes for
// the container id, 1-15 for the ifname) or starts with '.'.
inline std::optional<std::string> entry_name(const std::string &container_id,
                                             const std::string &ifname) {
    auto ok = [](const std::string &s, std::size_t max) {
        if (s.empty() || s.size() > max || s[0] == '.') return false;
        for (char c : s)
            if (!name_char(c)) return false;
        return true;
    };
    if (!ok(container_id, 128) || !ok(ifname, 15)) return std::nullopt;
    return container_id + "@" + ifname;
}

} // namespace knod::pod_spool
