#include "client/refusal.h"

#include "protocol/names.h"

#include <cctype>
#include <string_view>

namespace knod::client {
namespace {

// The name the client's bus_failure() put in front: a dotted D-Bus error name, then ": ".
std::string_view bus_name_prefix(std::string_view m) {
    auto colon = m.find(": ");
    if (colon == std::string_view::npos || colon == 0) return {};
    std::string_view name = m.substr(0, colon);
    if (name.find('.') == std::string_view::npos) return {};
    for (char c : name)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_')) return {};
    return name;
}

// The text between `open` and the next `close` in `text`, if both are there.
std::optional<std::string> between(std::string_view text, std::string_view open,
                                   std::string_view close) {
    auto at = text.find(open);
    if (at == std::string_view::npos) return std::nullopt;
    auto start = at + open.size();
    auto end = text.find(close, start);
    if (end == std::string_view::npos) return std::nullopt;
    return std::string(text.substr(start, end - start));
}

} // namespace

Refusal parse_refusal(const std::string &message) {
    Refusal r;
    std::string_view m = message;
    std::string_view name = bus_name_prefix(m);
    if (!name.empty()) {
        r.dbus_name = name;
        m.remove_prefix(name.size() + 2);
    }
    r.message = m;
    if (r.dbus_name == bus::error::denied) {
        // "denied by rule 'R'" then, after "; ", why each earlier rule missed. A default deny
        // ("no rule matched (default deny); rule 'a': ...") names only rules that missed.
        constexpr std::string_view head = "denied by rule '";
        if (m.starts_with(head)) {
            auto rest = m.substr(head.size());
            auto end = rest.find("'; ");
            r.rule =
                std::string(rest.substr(0, end == std::string_view::npos ? rest.rfind('\'') : end));
        }
    } else if (r.dbus_name == bus::error::quota_exceeded) {
        // "uid U already holds N binding(s); rule 'R' allows M", "... region bytes; rule 'R'
        // allows 1 GiB": the rule that allowed the request set the quota.
        r.rule = between(m, "; rule '", "' allows ");
    }
    return r;
}

} // namespace knod::client
