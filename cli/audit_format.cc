#include "cli/audit_format.h"

#include "policy/parser.h"

#include <ctime>
#include <string_view>

namespace knod::cli {

const std::vector<std::string> session_columns = {
    "id",      "uid",   "pid",        "netdev",       "gpu",      "mode",       "rule",
    "started", "ended", "end_reason", "region_bytes", "rx_bytes", "rx_packets", "dropped_packets",
    "exe",     "unit",  "key_id",     "flows"};
const std::vector<std::string> event_columns = {
    "seq", "time", "kind", "session", "uid", "pid", "rule", "decision", "reason", "detail", "hash"};

std::string format_time(std::optional<std::int64_t> us) {
    if (!us) return {};
    std::time_t secs = static_cast<std::time_t>(*us / 1000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::optional<std::int64_t> parse_time(const std::string &text, std::int64_t now_us) {
    if (text == "now") return now_us;
    std::string t = text;
    if (!t.empty() && t[0] == '-') t = t.substr(1);
    if (auto d = policy::parse_duration(t);
        d && !t.empty() && std::isalpha(static_cast<unsigned char>(t.back())))
        return now_us - d->count() * 1000000;
    std::tm tm{};
    for (const char *fmt : {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                            "%Y-%m-%d %H:%M", "%Y-%m-%d"}) {
        tm = {};
        const char *end = strptime(text.c_str(), fmt, &tm);
        if (end && (*end == '\0' || (end[0] == 'Z' && end[1] == '\0')))
            return static_cast<std::int64_t>(timegm(&tm)) * 1000000;
    }
    return std::nullopt;
}

std::string csv_field(const std::string &raw) {
    // A cell a spreadsheet would read as a formula (OWASP's "CSV injection") starts with ' so it
    // stays text: unit names, executable paths and reasons come from other users.
    std::string v = raw;
    if (!v.empty() && std::string_view("=+-@\t\r").find(v[0]) != std::string_view::npos)
        v.insert(0, 1, '\'');
    if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
    std::string out = "\"";
    for (char c : v) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

std::string csv_row(const std::vector<std::string> &fields) {
    std::string out;
    for (std::size_t i = 0; i < fields.size(); ++i)
        out += (i ? "," : "") + csv_field(fields[i]);
    return out;
}

nlohmann::json session_json(const journal::Session &s) {
    return {{"id", s.id},
            {"uid", s.uid},
            {"pid", s.pid},
            {"netdev", s.netdev},
            {"gpu", s.gpu},
            {"mode", s.mode},
            {"rule", s.rule},
            {"started", format_time(s.started_us)},
            {"ended", s.ended_us ? nlohmann::json(format_time(s.ended_us)) : nlohmann::json()},
            {"end_reason", s.end_reason ? nlohmann::json(*s.end_reason) : nlohmann::json()},
            {"region_bytes", s.region_bytes},
            {"rx_bytes", s.counters.rx_bytes},
            {"rx_packets", s.counters.rx_packets},
            {"dropped_packets", s.counters.dropped_packets},
            {"exe", s.exe},
            {"unit", s.unit},
            {"key_id", s.key_id},
            {"flows", s.flows}};
}

namespace {
nlohmann::json opt(const std::optional<std::string> &v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
}
nlohmann::json opt(const std::optional<std::int64_t> &v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
}
std::string text(const std::optional<std::string> &v) {
    return v.value_or("");
}
std::string text(const std::optional<std::int64_t> &v) {
    return v ? std::to_string(*v) : "";
}
} // namespace

nlohmann::json event_json(const journal::StoredEvent &e) {
    nlohmann::json detail =
        e.event.detail ? nlohmann::json::parse(*e.event.detail, nullptr, false) : nlohmann::json();
    return {{"seq", e.seq},
            {"time", format_time(e.event.at_us)},
            {"kind", e.event.kind},
            {"session", opt(e.event.session_id)},
            {"uid", opt(e.event.uid)},
            {"pid", opt(e.event.pid)},
            {"rule", opt(e.event.rule)},
            {"decision", opt(e.event.decision)},
            {"reason", opt(e.event.reason)},
            {"detail", detail.is_discarded() ? nlohmann::json(*e.event.detail) : detail},
            {"hash", journal::to_hex(e.hash)}};
}

std::vector<std::string> session_row(const journal::Session &s) {
    std::string flows;
    for (auto &f : s.flows)
        flows += (flows.empty() ? "" : "; ") + f;
    return {s.id,
            std::to_string(s.uid),
            std::to_string(s.pid),
            s.netdev,
            s.gpu,
            s.mode,
            s.rule,
            format_time(s.started_us),
            format_time(s.ended_us),
            s.end_reason.value_or(""),
            std::to_string(s.region_bytes),
            std::to_string(s.counters.rx_bytes),
            std::to_string(s.counters.rx_packets),
            std::to_string(s.counters.dropped_packets),
            s.exe,
            s.unit,
            s.key_id,
            flows};
}

std::vector<std::string> event_row(const journal::StoredEvent &e) {
    return {std::to_string(e.seq),    format_time(e.event.at_us), e.event.kind,
            text(e.event.session_id), text(e.event.uid),          text(e.event.pid),
            text(e.event.rule),       text(e.event.decision),     text(e.event.reason),
            text(e.event.detail),     journal::to_hex(e.hash)};
}

} // namespace knod::cli
