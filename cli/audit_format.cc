#include "cli/audit_format.h"

#include "journal/export.h"
#include "journal/snapshot.h"
#include "policy/parser.h"

#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <iostream>
#include <string_view>

namespace knod::cli {

const std::vector<std::string> session_columns = {
    "id",      "uid",   "pid",        "netdev",       "gpu",      "mode",       "rule",
    "started", "ended", "end_reason", "region_bytes", "rx_bytes", "rx_packets", "dropped_packets",
    "exe",     "unit",  "key_id",     "flows"};
const std::vector<std::string> event_columns = {
    "event_id", "journal_id", "seq",   "time",   "at_us",     "host",     "machine_id",
    "kind",     "session",    "uid",   "pid",    "rule",      "decision", "reason",
    "netdev",   "gpu",        "flows", "detail", "prev_hash", "hash"};

void read_snapshot_if_live_unreadable(std::string &db) {
    auto snapshot = journal::snapshot_instead(db);
    if (!snapshot) return;
    struct stat st {};
    std::string when;
    if (::stat(snapshot->c_str(), &st) == 0)
        when = " (written " +
               format_time(static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000 +
                           st.st_mtim.tv_nsec / 1000) +
               ")";
    std::cerr << "knod-policy: " << db << " is the daemon's alone; reading its published snapshot "
              << *snapshot << when
              << ", which trails it by up to the daemon's --snapshot-interval "
                 "(docs/audit.md, \"Reading as an auditor\")\n";
    db = *snapshot;
}

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

nlohmann::json session_json(const journal::Session &s, const journal::JournalIdentity &id) {
    auto nonempty = [](const std::string &v) {
        return v.empty() ? nlohmann::json() : nlohmann::json(v);
    };
    return {
        {"id", s.id},
        {"journal_id", nonempty(id.journal_id)},
        {"host", nonempty(id.hostname)},
        {"machine_id", nonempty(id.machine_id)},
        {"uid", s.uid},
        {"pid", s.pid},
        {"netdev", s.netdev},
        {"gpu", s.gpu},
        {"mode", s.mode},
        {"rule", s.rule},
        {"started", journal::rfc3339_us(s.started_us)},
        {"started_us", s.started_us},
        {"ended", s.ended_us ? nlohmann::json(journal::rfc3339_us(*s.ended_us)) : nlohmann::json()},
        {"ended_us", s.ended_us ? nlohmann::json(*s.ended_us) : nlohmann::json()},
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
std::string text(const std::optional<std::string> &v) {
    return v.value_or("");
}
std::string text(const std::optional<std::int64_t> &v) {
    return v ? std::to_string(*v) : "";
}

// Optimal string alignment distance, for "did you mean": short strings only.
std::size_t distance(const std::string &a, const std::string &b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i)
        d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j)
        d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
        for (std::size_t j = 1; j <= b.size(); ++j) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                                d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}
} // namespace

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

std::vector<std::string> event_row(const journal::EventRecord &e,
                                   const journal::JournalIdentity &id) {
    journal::FlatFields flat = journal::flat_fields(e);
    std::string flows;
    for (auto &f : flat.flows.value_or(std::vector<std::string>{}))
        flows += (flows.empty() ? "" : "; ") + f;
    return {journal::export_event_id(id.journal_id, e.seq),
            id.journal_id,
            std::to_string(e.seq),
            journal::rfc3339_us(e.event.at_us),
            std::to_string(e.event.at_us),
            id.hostname,
            id.machine_id,
            e.event.kind,
            text(e.event.session_id),
            text(e.event.uid),
            text(e.event.pid),
            text(e.event.rule),
            text(e.event.decision),
            text(e.event.reason),
            text(flat.netdev),
            text(flat.gpu),
            flows,
            text(e.event.detail),
            journal::to_hex(e.prev_hash),
            journal::to_hex(e.hash)};
}

std::optional<std::string> check_member(const std::string &what, const std::string &value,
                                        const std::vector<std::string> &accepted) {
    if (std::find(accepted.begin(), accepted.end(), value) != accepted.end()) return std::nullopt;
    std::string best;
    std::size_t best_d = std::max<std::size_t>(2, value.size() / 3) + 1;
    for (auto &a : accepted)
        if (std::size_t d = distance(value, a); d < best_d) {
            best_d = d;
            best = a;
        }
    std::string msg = "unknown " + what + " '" + value + "'";
    if (!best.empty()) msg += " (did you mean '" + best + "'?)";
    msg += "; one of: ";
    for (std::size_t i = 0; i < accepted.size(); ++i)
        msg += (i ? ", " : "") + accepted[i];
    return msg;
}

} // namespace knod::cli
