#include "policy/cgroup_unit.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace knod::policy {
namespace {

constexpr std::array<std::string_view, 11> unit_types = {"service", "mount",  "swap",      "socket",
                                                         "target",  "device", "automount", "timer",
                                                         "path",    "slice",  "scope"};

bool valid_unit_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '-' || c == '_' ||
           c == '.' || c == '\\';
}

// systemd escapes a unit's cgroup name with a leading '_' when it could clash with the kernel's
// own names (cg_escape); a leading '_' is always such an escape.
std::string_view unescape(std::string_view s) {
    return s.starts_with('_') ? s.substr(1) : s;
}

// The next component of `p` (after any slashes); `p` is advanced past it.
std::string_view next_component(std::string_view &p) {
    while (p.starts_with('/'))
        p.remove_prefix(1);
    std::size_t n = std::min(p.find('/'), p.size());
    std::string_view part = p.substr(0, n);
    p.remove_prefix(n);
    return part;
}

bool is_slice(std::string_view part) {
    if (part.size() < 7 || !part.ends_with(".slice")) return false;
    std::string_view name = unescape(part);
    return valid_unit_name(name) && name.find('@') == std::string_view::npos;
}

// Skips the leading slices ("/user.slice/user-1000.slice/..."): what follows is the unit.
std::string_view skip_slices(std::string_view p) {
    for (;;) {
        std::string_view rest = p;
        if (!is_slice(next_component(rest))) return p;
        p = rest;
    }
}

bool all_digits(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool all_alnum(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c));
    });
}

// "user@1000.service" (never escaped) -> the rest of the path; otherwise nullopt-like npos.
bool skip_exact(std::string_view &p, std::string_view prefix, std::string_view suffix,
                bool (*middle_ok)(std::string_view)) {
    std::string_view rest = p;
    std::string_view part = next_component(rest);
    if (part.size() <= prefix.size() + suffix.size() || !part.starts_with(prefix) ||
        !part.ends_with(suffix))
        return false;
    if (!middle_ok(part.substr(prefix.size(), part.size() - prefix.size() - suffix.size())))
        return false;
    p = rest;
    return true;
}

} // namespace

bool valid_unit_name(std::string_view n) {
    if (n.empty() || n.size() >= 256) return false;
    std::size_t dot = n.rfind('.');
    if (dot == std::string_view::npos || dot == 0) return false;
    std::string_view type = n.substr(dot + 1);
    if (std::find(unit_types.begin(), unit_types.end(), type) == unit_types.end()) return false;
    std::size_t at = std::string_view::npos;
    for (std::size_t i = 0; i < dot; ++i) {
        if (n[i] == '@') {
            if (at == std::string_view::npos) at = i;
        } else if (!valid_unit_char(n[i])) {
            return false;
        }
    }
    if (at == 0) return false;
    return at == std::string_view::npos || dot > at + 1; // plain, or an instance (not a template)
}

std::optional<std::string> unified_cgroup_path(std::string_view text) {
    while (!text.empty()) {
        std::size_t nl = std::min(text.find('\n'), text.size());
        std::string_view line = text.substr(0, nl);
        text.remove_prefix(std::min(nl + 1, text.size()));
        if (line.starts_with("0::")) return std::string(line.substr(3));
    }
    return std::nullopt;
}

std::string system_unit_of(std::string_view cgroup) {
    std::string_view rest = skip_slices(cgroup);
    std::string_view part = next_component(rest);
    if (part.size() < 3) return {};
    std::string_view name = unescape(part);
    // Slices were skipped: one now would be a slice inside a unit, which is no unit.
    if (!valid_unit_name(name) || name.ends_with(".slice")) return {};
    return std::string(name);
}

std::string user_unit_of(std::string_view cgroup) {
    std::string_view p = skip_slices(cgroup);
    if (!skip_exact(p, "user@", ".service", all_digits) &&
        !skip_exact(p, "session-", ".scope", all_alnum))
        return {};
    return system_unit_of(p);
}

} // namespace knod::policy
