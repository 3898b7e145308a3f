#include "cli/report_html.h"

#include "knod/untrusted.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <utility>
#include <vector>

namespace knod::cli {
namespace {

// Arithmetic on journal times, where no int64 sum or difference can overflow.
__extension__ typedef __int128 wide;

// Entities only; `clean` has been through escape_untrusted already.
std::string entities(std::string_view clean) {
    std::string out;
    out.reserve(clean.size());
    for (char c : clean) {
        switch (c) {
        case '&':
            out += "&amp;";
            break;
        case '<':
            out += "&lt;";
            break;
        case '>':
            out += "&gt;";
            break;
        case '"':
            out += "&quot;";
            break;
        case '\'':
            out += "&#39;";
            break;
        default:
            out += c;
        }
    }
    return out;
}

// At most `max` characters of an escaped label, with an ellipsis when cut; the full text goes
// into the bar's <title>.
std::string cut(const std::string &untrusted, std::size_t max) {
    std::string clean = escape_untrusted(untrusted); // valid UTF-8 from here on
    std::vector<std::size_t> starts;
    char32_t cp = 0;
    for (std::size_t i = 0; i < clean.size(); i += utf8_sequence(clean, i, cp))
        starts.push_back(i);
    if (starts.size() <= max) return entities(clean);
    return entities(clean.substr(0, starts[max - 1])) + "\u2026";
}

std::string human_bytes(std::int64_t v) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double d = static_cast<double>(v);
    int u = 0;
    while (d >= 1024 && u < 6) {
        d /= 1024;
        ++u;
    }
    if (u == 0) return std::to_string(v) + " B";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f %s", d, units[u]);
    return buf;
}

struct Chart {
    std::string id;
    std::string title;
    const char *colour; // solid, used by no other chart and by no text
    bool bytes = false; // values are byte counts
};

std::string shown(std::int64_t v, bool bytes) {
    return bytes ? human_bytes(v) : std::to_string(v);
}
std::string exact(std::int64_t v, bool bytes) {
    return bytes ? std::to_string(v) + " bytes" : std::to_string(v);
}

std::string open_svg(const Chart &c, int width, int height, const std::string &desc) {
    std::string w = std::to_string(width), h = std::to_string(height);
    return "<svg id=\"" + c.id + "\" class=\"chart\" data-bar-colour=\"" + c.colour +
           "\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h +
           "\" role=\"img\" aria-labelledby=\"" + c.id + "-t " + c.id + "-d\">\n<title id=\"" +
           c.id + "-t\">" + entities(c.title) + "</title>\n<desc id=\"" + c.id + "-d\">" + desc +
           "</desc>\n";
}

std::string figure(const Chart &c, const std::string &body) {
    return "<figure>\n<figcaption>" + entities(c.title) + "</figcaption>\n" + body + "</figure>\n";
}

std::string none(const Chart &c) {
    return figure(c, "<p class=\"none\">none in this period</p>\n");
}

struct Bar {
    std::string label; // untrusted text
    std::int64_t value = 0;
    bool italic = false; // a label that is no name from the journal: "(default deny)"
};

// Horizontal bars, largest first: one row per user, device or rule with a value.
std::string hbar_chart(const Chart &c, std::vector<Bar> bars) {
    constexpr int width = 580, label_right = 165, plot_x = 170, plot_w = 320, row_h = 20,
                  bar_h = 14, top = 4;
    constexpr std::size_t max_rows = 25;
    std::erase_if(bars, [](const Bar &b) { return b.value <= 0; });
    if (bars.empty()) return none(c);
    std::stable_sort(bars.begin(), bars.end(),
                     [](const Bar &a, const Bar &b) { return a.value > b.value; });
    std::size_t more = bars.size() > max_rows ? bars.size() - max_rows : 0;
    bars.resize(bars.size() - more);
    std::string desc;
    for (auto &b : bars)
        desc += (desc.empty() ? "" : "; ") + entities(escape_untrusted(b.label)) + ": " +
                exact(b.value, c.bytes);
    int height = top * 2 + static_cast<int>(bars.size()) * row_h;
    std::string svg = open_svg(c, width, height, desc);
    double max = static_cast<double>(bars.front().value);
    svg += "<rect x=\"" + std::to_string(plot_x - 1) + "\" y=\"0\" width=\"1\" height=\"" +
           std::to_string(height) + "\" fill=\"#999999\"/>\n";
    for (std::size_t i = 0; i < bars.size(); ++i) {
        auto &b = bars[i];
        int y = top + static_cast<int>(i) * row_h;
        int len = std::max(1, static_cast<int>(std::lround(b.value / max * plot_w)));
        svg += "<g><title>" + entities(escape_untrusted(b.label)) + ": " + exact(b.value, c.bytes) +
               "</title><text x=\"" + std::to_string(label_right) + "\" y=\"" +
               std::to_string(y + 14) + "\" text-anchor=\"end\"" +
               (b.italic ? " font-style=\"italic\"" : "") + ">" + cut(b.label, 26) +
               "</text><rect x=\"" + std::to_string(plot_x) + "\" y=\"" + std::to_string(y + 3) +
               "\" width=\"" + std::to_string(len) + "\" height=\"" + std::to_string(bar_h) +
               "\" fill=\"" + c.colour + "\"/><text x=\"" + std::to_string(plot_x + len + 4) +
               "\" y=\"" + std::to_string(y + 14) + "\">" + shown(b.value, c.bytes) +
               "</text></g>\n";
    }
    svg += "</svg>\n";
    if (more)
        svg += "<p class=\"note\">and " + std::to_string(more) + " more (see the table)</p>\n";
    return figure(c, svg);
}

std::string hour_label(wide us) {
    std::time_t secs = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%m-%d %H:00", &tm);
    return buf;
}

// The timeline's slots: whole hours from the first to the last with events, several hours a
// slot when there are too many to draw each a few pixels wide.
struct Slots {
    std::int64_t first_us = 0;
    std::int64_t slot_us = 3600LL * 1000000;
    std::size_t count = 0;
};

// Vertical bars over time, one per slot with a value.
std::string vbar_chart(const Chart &c, const Slots &s,
                       const std::vector<std::pair<std::int64_t, std::int64_t>> &points) {
    constexpr int width = 580, left = 70, plot_w = 500, top = 18, plot_h = 120, height = 172;
    std::vector<std::int64_t> v(s.count, 0);
    // The points are the report's, read from a journal: a start outside the slots is not
    // drawn, a negative value is none, and a slot's sum saturates (in 128 bits: no overflow).
    for (auto &[start, value] : points) {
        wide i = (static_cast<wide>(start) - s.first_us) / s.slot_us;
        if (start < s.first_us || i >= static_cast<wide>(v.size()) || value <= 0) continue;
        auto &slot = v[static_cast<std::size_t>(i)];
        if (__builtin_add_overflow(slot, value, &slot)) slot = INT64_MAX;
    }
    std::int64_t max = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
    if (max <= 0) return none(c);
    std::string desc;
    for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] > 0)
            desc += (desc.empty() ? "" : "; ") +
                    hour_label(s.first_us + static_cast<wide>(i) * s.slot_us) + ": " +
                    exact(v[i], c.bytes);
    std::string svg = open_svg(c, width, height, desc);
    double slot = static_cast<double>(plot_w) / static_cast<double>(s.count);
    int bw = slot >= 3 ? std::max(1, static_cast<int>(slot * 0.8)) : std::max(1, int(slot));
    bool labels = slot >= 40;
    auto x_of = [&](std::size_t i) {
        return left + static_cast<int>(std::floor(static_cast<double>(i) * slot)) +
               static_cast<int>((slot - bw) / 2);
    };
    // Axes: the baseline under the bars, the top value and zero on the left.
    svg += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top + plot_h) +
           "\" width=\"" + std::to_string(plot_w) + "\" height=\"1\" fill=\"#999999\"/>\n";
    svg += "<text x=\"" + std::to_string(left - 6) + "\" y=\"" + std::to_string(top + 4) +
           "\" text-anchor=\"end\">" + shown(max, c.bytes) + "</text><text x=\"" +
           std::to_string(left - 6) + "\" y=\"" + std::to_string(top + plot_h + 4) +
           "\" text-anchor=\"end\">0</text>\n";
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] <= 0) continue;
        int h = std::max(1, static_cast<int>(std::lround(static_cast<double>(v[i]) /
                                                         static_cast<double>(max) * plot_h)));
        int x = x_of(i), y = top + plot_h - h;
        svg += "<g><title>" + hour_label(s.first_us + static_cast<wide>(i) * s.slot_us) + ": " +
               exact(v[i], c.bytes) + "</title><rect x=\"" + std::to_string(x) + "\" y=\"" +
               std::to_string(y) + "\" width=\"" + std::to_string(bw) + "\" height=\"" +
               std::to_string(h) + "\" fill=\"" + c.colour + "\"/>";
        if (labels)
            svg += "<text x=\"" + std::to_string(x + bw / 2) + "\" y=\"" + std::to_string(y - 3) +
                   "\" text-anchor=\"middle\">" + shown(v[i], c.bytes) + "</text>";
        svg += "</g>\n";
    }
    // Up to five time labels under the axis, the first and the last among them.
    std::size_t n = std::min<std::size_t>(5, s.count);
    for (std::size_t k = 0; k < n; ++k) {
        std::size_t i = n == 1 ? 0 : k * (s.count - 1) / (n - 1);
        int x = x_of(i) + bw / 2;
        // Under its bar where the slots are wide enough, else kept inside the chart.
        bool edges = slot < 80 && s.count > 1;
        const char *anchor = edges && k == 0 ? "start" : edges && k == n - 1 ? "end" : "middle";
        if (edges && k == 0) x = left;
        if (edges && k == n - 1) x = left + plot_w;
        svg += "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(top + plot_h + 18) +
               "\" text-anchor=\"" + anchor + "\">" +
               hour_label(s.first_us + static_cast<wide>(i) * s.slot_us) + "</text>\n";
    }
    svg += "</svg>\n";
    return figure(c, svg);
}

std::int64_t num(const nlohmann::json &j, const char *field) {
    auto it = j.find(field);
    return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
}

std::string str(const nlohmann::json &j, const char *field) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) return {};
    return it->is_string() ? it->get<std::string>() : it->dump();
}

std::string td(const std::string &escaped, bool key = false) {
    return key ? "<td class=\"k\">" + escaped + "</td>" : "<td>" + escaped + "</td>";
}

std::string others(const nlohmann::json &t) {
    std::string out;
    if (auto it = t.find("other_refusals_by_decision"); it != t.end() && it->is_object())
        for (auto &[decision, n] : it->items())
            out += (out.empty() ? "" : ", ") + html_escape(decision) + " " +
                   std::to_string(n.get<std::int64_t>());
    return out;
}

// Label for a user: "name (uid)", or "uid N" where this host has no name for it.
std::string user_label(const nlohmann::json &u) {
    std::string name = str(u, "user");
    return name.empty() ? "uid " + str(u, "key") : name + " (" + str(u, "key") + ")";
}

std::string tally_table(const nlohmann::json &rows, const char *view, const char *heading,
                        const char *key_header) {
    bool users = std::string_view(view) == "user";
    std::string out = "<table>\n<caption>" + std::string(heading) + ", every count</caption>\n<tr>";
    if (users)
        out += "<th class=\"k\" scope=\"col\">User</th><th class=\"k\" scope=\"col\">Group</th>"
               "<th scope=\"col\">UID</th>";
    else
        out += std::string("<th class=\"k\" scope=\"col\">") + key_header + "</th>";
    out += "<th scope=\"col\">Sessions</th><th scope=\"col\">RX bytes</th><th "
           "scope=\"col\">Denials</th><th scope=\"col\">Quota refusals</th><th "
           "scope=\"col\">Other refusals</th><th scope=\"col\">Revocations</th></tr>\n";
    for (auto &t : rows) {
        out += "<tr>";
        if (users)
            out += td(html_escape(str(t, "user").empty() ? "-" : str(t, "user")), true) +
                   td(html_escape(str(t, "group").empty() ? "-" : str(t, "group")), true) +
                   td(html_escape(str(t, "key")));
        else
            out += td(html_escape(str(t, "key")), true);
        std::string other = std::to_string(num(t, "other_refusals"));
        if (num(t, "other_refusals") > 0) other += " (" + others(t) + ")";
        out += td(std::to_string(num(t, "sessions"))) + td(std::to_string(num(t, "rx_bytes"))) +
               td(std::to_string(num(t, "denials"))) +
               td(std::to_string(num(t, "quota_refusals"))) + td(other) +
               td(std::to_string(num(t, "revocations"))) + "</tr>\n";
    }
    if (rows.empty()) out += "<tr><td class=\"k\" colspan=\"9\">none in this period</td></tr>\n";
    return out + "</table>\n";
}

// One view (users, netdevs, GPUs or Kubernetes namespaces): four charts and the table.
std::string view_section(const nlohmann::json &rows, const char *view, const char *heading,
                         const char *key_header, const std::array<const char *, 4> &colours) {
    auto bars = [&](const char *field) {
        std::vector<Bar> out;
        for (auto &t : rows)
            out.push_back(
                {std::string_view(view) == "user" ? user_label(t) : str(t, "key"), num(t, field)});
        return out;
    };
    std::string v = view, noun = v == "gpu" ? "GPU" : v;
    std::string out = "<section>\n<h2>" + std::string(heading) + "</h2>\n<div class=\"charts\">\n";
    out += hbar_chart({v + "-sessions", "Sessions per " + noun, colours[0]}, bars("sessions"));
    out +=
        hbar_chart({v + "-rx-bytes", "RX bytes per " + noun, colours[1], true}, bars("rx_bytes"));
    out += hbar_chart({v + "-denials", "Denials per " + noun, colours[2]}, bars("denials"));
    out += hbar_chart({v + "-quota-refusals", "Quota refusals per " + noun, colours[3]},
                      bars("quota_refusals"));
    return out + "</div>\n" + tally_table(rows, view, heading, key_header) + "</section>\n";
}

const char *style =
    R"(body{font-family:sans-serif;margin:16px;color:#222222;background:#ffffff;width:1180px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 8px}
p{font-size:13px;margin:4px 0}.none,.note{color:#555555;font-style:italic}
.charts{display:flex;flex-wrap:wrap;gap:12px 16px;margin-bottom:12px}
figure{margin:0;width:580px}figcaption{font-size:13px;font-weight:bold;margin-bottom:4px}
svg{display:block}svg text{font-size:11px;fill:#222222;font-family:sans-serif}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
caption{text-align:left;font-weight:bold;padding-bottom:4px}
td,th{border:1px solid #cccccc;padding:2px 6px;text-align:right}th{background:#f3f3f3}
td.k,th.k{text-align:left}details{font-size:13px;margin:8px 0})";

} // namespace

std::string html_escape(std::string_view untrusted) {
    return entities(escape_untrusted(untrusted));
}

std::string report_html(const nlohmann::json &report, const HtmlContext &ctx) {
    const nlohmann::json empty = nlohmann::json::array();
    auto list = [&](const char *field) -> const nlohmann::json & {
        auto it = report.find(field);
        return it != report.end() && it->is_array() ? *it : empty;
    };
    std::string since = str(report, "since"), until = str(report, "until");
    std::string period = (since.empty() ? "the first event" : since) + " to " +
                         (until.empty() ? "the last event" : until) + " (UTC)";
    std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                      "style-src 'unsafe-inline'\">\n<title>knod-policy audit report: " +
                      html_escape(period) + "</title>\n<style>\n" + style +
                      "\n</style>\n</head>\n<body>\n<h1>knod-policy audit report</h1>\n";
    out += "<p>Journal: " + html_escape(ctx.journal) + "</p>\n<p>Period: " + html_escape(period) +
           "</p>\n";
    if (auto f = report.find("filter"); f != report.end() && f->is_object()) {
        std::string only;
        for (auto &[k, v] : f->items())
            if (!v.is_null())
                only += (only.empty() ? "" : ", ") + html_escape(k) + " " +
                        html_escape(v.is_string() ? v.get<std::string>() : v.dump());
        if (!only.empty()) out += "<p>Only: " + only + "</p>\n";
    }
    out += "<p>Generated: " + html_escape(ctx.generated) + " by knod-policy audit report</p>\n";

    // Totals, as text first.
    const nlohmann::json &t = report.contains("totals") ? report["totals"] : nlohmann::json();
    out += "<section>\n<h2>Totals</h2>\n<table>\n<tr><th scope=\"col\">Sessions</th><th "
           "scope=\"col\">RX bytes</th><th scope=\"col\">Denials</th><th scope=\"col\">Quota "
           "refusals</th><th scope=\"col\">Other refusals</th><th "
           "scope=\"col\">Revocations</th><th scope=\"col\">Permissive grants that would "
           "deny</th></tr>\n<tr>" +
           td(std::to_string(num(t, "sessions"))) +
           td(std::to_string(num(t, "rx_bytes")) + " (" + human_bytes(num(t, "rx_bytes")) + ")") +
           td(std::to_string(num(t, "denials"))) + td(std::to_string(num(t, "quota_refusals"))) +
           td(std::to_string(num(t, "other_refusals")) +
              (num(t, "other_refusals") ? " (" + others(t) + ")" : "")) +
           td(std::to_string(num(t, "revocations"))) +
           td(std::to_string(num(t, "would_deny_grants"))) + "</tr>\n</table>\n</section>\n";

    // The timeline: one small chart per count, on the same slots.
    const nlohmann::json &timeline = list("timeline");
    Slots slots;
    if (!timeline.empty()) {
        // In 128 bits: the starts are journal values, and any two int64 differ by less than
        // 2^64. The first and the last are the least and the greatest, whatever the order.
        std::int64_t first = INT64_MAX, last = INT64_MIN;
        for (auto &h : timeline) {
            first = std::min(first, num(h, "start_us"));
            last = std::max(last, num(h, "start_us"));
        }
        constexpr wide hour = 3600LL * 1000000;
        wide span = static_cast<wide>(last) - first;
        wide hours = span / hour + 1;
        wide per = (hours + 249) / 250; // at least 2 pixels a slot; at most 251 slots
        wide slot_us = per * hour;
        slots.first_us = first;
        slots.slot_us = slot_us > INT64_MAX ? INT64_MAX : static_cast<std::int64_t>(slot_us);
        slots.count = static_cast<std::size_t>(span / slots.slot_us + 1);
    }
    std::string per_slot =
        slots.slot_us == 3600LL * 1000000
            ? "per hour"
            : "per " + std::to_string(slots.slot_us / (3600LL * 1000000)) + " hours";
    out += "<section>\n<h2>Over time (" + per_slot + ", UTC)</h2>\n<div class=\"charts\">\n";
    struct Series {
        const char *field, *id, *title, *colour;
        bool bytes;
    };
    for (auto &s :
         {Series{"grants", "timeline-grants", "Grants", "#1f77b4", false},
          Series{"denials", "timeline-denials", "Denials", "#d62728", false},
          Series{"quota_refusals", "timeline-quota-refusals", "Quota refusals", "#ff7f0e", false},
          Series{"other_refusals", "timeline-other-refusals",
                 "Other refusals (isolation, flow conflict, driver, coalesced)", "#9467bd", false},
          Series{"revocations", "timeline-revocations", "Revocations", "#17becf", false},
          Series{"rx_bytes", "timeline-rx-bytes", "RX bytes (of sessions ended)", "#2ca02c",
                 true}}) {
        std::vector<std::pair<std::int64_t, std::int64_t>> points;
        for (auto &h : timeline)
            points.emplace_back(num(h, "start_us"), num(h, s.field));
        out += vbar_chart({s.id, std::string(s.title) + " " + per_slot, s.colour, s.bytes}, slots,
                          points);
    }
    // Open when short: the numbers as text, for readers who do not see the bars.
    out += std::string("</div>\n<details") + (timeline.size() <= 48 ? " open" : "") +
           ">\n<summary>The timeline as a table</summary>\n<table>\n<tr><th "
           "class=\"k\" scope=\"col\">Hour (UTC)</th><th scope=\"col\">Grants</th><th "
           "scope=\"col\">Denials</th><th scope=\"col\">Quota refusals</th><th "
           "scope=\"col\">Other refusals</th><th scope=\"col\">Revocations</th><th "
           "scope=\"col\">RX bytes</th></tr>\n";
    for (auto &h : timeline) {
        out += "<tr>" + td(html_escape(str(h, "hour")), true);
        for (const char *f :
             {"grants", "denials", "quota_refusals", "other_refusals", "revocations", "rx_bytes"})
            out += td(std::to_string(num(h, f)));
        out += "</tr>\n";
    }
    out += "</table>\n</details>\n</section>\n";

    out += view_section(list("by_user"), "user", "Per user", "User",
                        {"#2b83c6", "#238b23", "#c0392b", "#e8700a"});
    out += view_section(list("by_netdev"), "netdev", "Per netdev", "Netdev",
                        {"#4a98d3", "#4cb84c", "#e05a4f", "#ff9a3c"});
    out += view_section(list("by_gpu"), "gpu", "Per GPU", "GPU",
                        {"#6aaedf", "#74c874", "#ea7a70", "#ffb36b"});
    // Pods' namespaces: only on a node that had pods (a host of plain users has no such view).
    if (!list("by_k8s_namespace").empty())
        out += view_section(list("by_k8s_namespace"), "namespace", "Per Kubernetes namespace",
                            "Namespace", {"#3d7cb0", "#3f9a3f", "#c94d43", "#e0862f"});

    // Why requests were refused.
    std::vector<Bar> denied, quota, decisions;
    for (auto &r : list("top_denied_rules"))
        denied.push_back(r["rule"].is_null() ? Bar{"(default deny)", num(r, "denials"), true}
                                             : Bar{str(r, "rule"), num(r, "denials")});
    for (auto &r : list("quota_refusals_by_rule"))
        quota.push_back({str(r, "rule"), num(r, "quota_refusals")});
    for (auto &r : list("refusals_by_decision"))
        decisions.push_back({str(r, "decision"), num(r, "count")});
    out += "<section>\n<h2>Refusals</h2>\n<p>Denials: a deny rule, or <i>(default deny)</i> when "
           "no rule matched. Quota refusals: the named rule allowed the request but the "
           "caller's quota was full. Coalesced: refusals the daemon only counted (decision not "
           "recorded).</p>\n<div class=\"charts\">\n";
    out += hbar_chart({"denied-rules", "Denials by rule", "#a51d1d"}, denied);
    out += hbar_chart({"quota-rules", "Quota refusals by allowing rule", "#c85f00"}, quota);
    out += hbar_chart({"refusal-decisions", "Refusals by decision", "#8c564b"}, decisions);
    out += "</div>\n</section>\n</body>\n</html>\n";
    return out;
}

} // namespace knod::cli
