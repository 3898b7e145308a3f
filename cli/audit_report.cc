#include "cli/audit_report.h"

#include "cli/audit_format.h"
#include "cli/report_html.h"
#include "knod/json.h"
#include "knod/untrusted.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <iostream>

namespace knod::cli {

const char *const report_help =
    "Counts events in [--since, --until) (default: all). A session counts by its grant, its "
    "bytes (rx_bytes) by its end, a revocation for the session's owner. Refusals are counted "
    "as what they were: denials (a deny rule, or \"(default deny)\" when no rule matched), "
    "quota refusals (a rule allowed the request, the caller's quota was full; listed per "
    "allowing rule, never among the denying rules), and other refusals by decision "
    "(isolation-violation, flow-conflict, driver-failure, journal-unavailable; \"coalesced\": "
    "refusals the daemon only counted, decision not recorded, which have no device and count "
    "per user and per hour only). Users are shown with the user and primary group names of "
    "this host's user database (null or the number when unknown).\n\n"
    "JSON: {since, until, filter: {uid, netdev, gpu}, totals: TALLY, by_user: [TALLY + {key, "
    "uid, user, gid, group}], by_netdev: [TALLY + {key, netdev}], by_gpu: [TALLY + {key, gpu}], "
    "by_k8s_namespace: [TALLY + {key, k8s_namespace}] (a pod's namespace, from the events' "
    "detail.pod), "
    "top_denied_rules: [{rule (null: no rule matched), default_deny, denials}], "
    "quota_refusals_by_rule: [{rule, quota_refusals}], refusals_by_decision: [{decision, "
    "count}], timeline: [{hour (UTC), start_us, grants, denials, quota_refusals, "
    "other_refusals, revocations, rx_bytes}] (hours with events only)}; TALLY is {sessions, "
    "rx_bytes, denials, quota_refusals, other_refusals, other_refusals_by_decision: {DECISION: "
    "n}, revocations, would_deny_grants}.\n\n"
    "--html FILE writes the same data as one self-contained page (inline SVG charts, no "
    "scripts, nothing fetched); '-' writes it to stdout.";

namespace {

nlohmann::json tally_json(const journal::Tally &t) {
    nlohmann::json other = nlohmann::json::object();
    for (auto &[decision, n] : t.other_refusals)
        other[decision] = n;
    return {{"sessions", t.sessions},
            {"rx_bytes", t.rx_bytes},
            {"denials", t.denials},
            {"quota_refusals", t.quota_refusals},
            {"other_refusals", t.other_refusals_total()},
            {"other_refusals_by_decision", other},
            {"revocations", t.revocations},
            {"would_deny_grants", t.would_deny_grants}};
}

template <typename T> nlohmann::json or_null(const std::optional<T> &v) {
    return v ? nlohmann::json(*v) : nlohmann::json();
}

// The user and primary group names this host gives a uid; null where it has none.
nlohmann::json account_json(const std::string &uid_text) {
    nlohmann::json j{{"user", nullptr}, {"gid", nullptr}, {"group", nullptr}};
    std::int64_t uid = std::stoll(uid_text);
    j["uid"] = uid;
    if (uid < 0 || uid > 0xfffffffe) return j;
    if (struct passwd *pw = getpwuid(static_cast<uid_t>(uid))) {
        j["user"] = pw->pw_name;
        j["gid"] = pw->pw_gid;
        if (struct group *gr = getgrgid(pw->pw_gid)) j["group"] = gr->gr_name;
    }
    return j;
}

std::string text(const nlohmann::json &v) {
    if (v.is_null()) return "-";
    if (v.is_string()) return escape_untrusted(v.get<std::string>());
    return v.dump();
}

void print_tallies(const char *title, const nlohmann::json &rows,
                   const std::vector<std::pair<std::string, std::string>> &keys) {
    std::cout << title << "\n  ";
    for (auto &[field, head] : keys)
        std::cout << std::left << std::setw(18) << head << " ";
    std::cout << std::right;
    for (const char *head :
         {"SESSIONS", "RX_BYTES", "DENIALS", "QUOTA_REFUSALS", "OTHER_REFUSALS", "REVOCATIONS"})
        std::cout << std::setw(15) << head;
    std::cout << "\n";
    for (auto &t : rows) {
        std::cout << "  ";
        for (auto &[field, head] : keys)
            std::cout << std::left << std::setw(18) << text(t[field]) << " ";
        std::cout << std::right;
        for (const char *f :
             {"sessions", "rx_bytes", "denials", "quota_refusals", "other_refusals", "revocations"})
            std::cout << std::setw(15) << t[f].get<std::int64_t>();
        std::cout << "\n";
    }
    if (rows.empty()) std::cout << "  (none)\n";
}

void print_counts(const char *title, const nlohmann::json &rows, const char *label_field,
                  const char *count_field) {
    std::cout << title << "\n";
    for (auto &row : rows) {
        std::string label = row[label_field].is_null() ? "(default deny)" : text(row[label_field]);
        std::cout << "  " << std::left << std::setw(40) << label << " " << std::right
                  << row[count_field].get<std::int64_t>() << "\n";
    }
    if (rows.empty()) std::cout << "  (none)\n";
}

void print_tables(const nlohmann::json &j) {
    std::cout << "period: " << (j["since"].is_null() ? "the start" : text(j["since"])) << " to "
              << (j["until"].is_null() ? "now" : text(j["until"])) << " (UTC)\n";
    auto &t = j["totals"];
    std::cout << "totals: " << t["sessions"] << " session(s), " << t["rx_bytes"] << " rx bytes, "
              << t["denials"] << " denial(s), " << t["quota_refusals"] << " quota refusal(s), "
              << t["other_refusals"] << " other refusal(s), " << t["revocations"]
              << " revocation(s)";
    if (t["would_deny_grants"].get<std::int64_t>() > 0)
        std::cout << "; " << t["would_deny_grants"] << " grant(s) in permissive mode would deny";
    std::cout << "\n";
    print_tallies("per user", j["by_user"], {{"user", "USER"}, {"group", "GROUP"}, {"uid", "UID"}});
    print_tallies("per netdev", j["by_netdev"], {{"netdev", "NETDEV"}});
    print_tallies("per GPU", j["by_gpu"], {{"gpu", "GPU"}});
    if (!j["by_k8s_namespace"].empty())
        print_tallies("per Kubernetes namespace", j["by_k8s_namespace"],
                      {{"k8s_namespace", "NAMESPACE"}});
    print_counts("denials by rule", j["top_denied_rules"], "rule", "denials");
    print_counts("quota refusals by rule", j["quota_refusals_by_rule"], "rule", "quota_refusals");
    print_counts("refusals by decision", j["refusals_by_decision"], "decision", "count");
    std::cout << "timeline (per hour, UTC)\n  " << std::left << std::setw(21) << "HOUR"
              << std::right;
    for (const char *head :
         {"GRANTS", "DENIALS", "QUOTA_REFUSALS", "OTHER_REFUSALS", "REVOCATIONS", "RX_BYTES"})
        std::cout << std::setw(15) << head;
    std::cout << "\n";
    for (auto &h : j["timeline"]) {
        std::cout << "  " << std::left << std::setw(21) << text(h["hour"]) << std::right;
        for (const char *f :
             {"grants", "denials", "quota_refusals", "other_refusals", "revocations", "rx_bytes"})
            std::cout << std::setw(15) << h[f].get<std::int64_t>();
        std::cout << "\n";
    }
    if (j["timeline"].empty()) std::cout << "  (none)\n";
}

Result<void> write_file(const std::string &path, const std::string &content) {
    if (path == "-") {
        // Raw bytes: the page escapes everything itself; the terminal filter would mangle it.
        std::cout.flush();
        std::fwrite(content.data(), 1, content.size(), stdout);
        std::fflush(stdout);
        return {};
    }
    // The page names users, devices and rules: not world-readable. A symlink at the path (one
    // planted in a shared directory) is refused, never followed.
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0 && errno == ELOOP)
        return make_error(Errc::invalid_argument,
                          "cannot write " + path + ": it is a symbolic link (not followed)");
    if (fd < 0) return make_error(Errc::io, "cannot write " + path + ": " + std::strerror(errno));
    if (::fchmod(fd, 0640) != 0) { // an existing file keeps its mode through O_TRUNC
        int err = errno;
        ::close(fd);
        return make_error(Errc::io, "cannot write " + path + ": chmod: " + std::strerror(err));
    }
    std::size_t done = 0;
    while (done < content.size()) {
        ssize_t n = ::write(fd, content.data() + done, content.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            return make_error(Errc::io, "cannot write " + path + ": " + std::strerror(err));
        }
        done += static_cast<std::size_t>(n);
    }
    if (::close(fd) != 0)
        return make_error(Errc::io, "cannot write " + path + ": " + std::strerror(errno));
    return {};
}

} // namespace

nlohmann::json report_json(const journal::Report &r, const journal::Filter &f) {
    nlohmann::json j;
    j["since"] = f.since_us ? nlohmann::json(format_time(f.since_us)) : nlohmann::json();
    j["until"] = f.until_us ? nlohmann::json(format_time(f.until_us)) : nlohmann::json();
    j["filter"] = {{"uid", or_null(f.uid)}, {"netdev", or_null(f.netdev)}, {"gpu", or_null(f.gpu)}};
    j["totals"] = tally_json(r.totals);
    j["by_user"] = nlohmann::json::array();
    for (auto &t : r.by_user) {
        nlohmann::json u = tally_json(t);
        u["key"] = t.key;
        u.update(account_json(t.key));
        j["by_user"].push_back(std::move(u));
    }
    for (auto [name, tallies] : {std::pair{"netdev", &r.by_netdev}, std::pair{"gpu", &r.by_gpu},
                                 std::pair{"k8s_namespace", &r.by_k8s_namespace}}) {
        auto &out = j[std::string("by_") + name] = nlohmann::json::array();
        for (auto &t : *tallies) {
            nlohmann::json v = tally_json(t);
            v["key"] = t.key;
            v[name] = t.key;
            out.push_back(std::move(v));
        }
    }
    // Ten each, as before: the full lists are a query over `audit events` away.
    j["top_denied_rules"] = nlohmann::json::array();
    for (std::size_t i = 0; i < r.denied_by_rule.size() && i < 10; ++i)
        j["top_denied_rules"].push_back({{"rule", or_null(r.denied_by_rule[i].rule)},
                                         {"default_deny", !r.denied_by_rule[i].rule},
                                         {"denials", r.denied_by_rule[i].count}});
    j["quota_refusals_by_rule"] = nlohmann::json::array();
    for (std::size_t i = 0; i < r.quota_by_rule.size() && i < 10; ++i)
        j["quota_refusals_by_rule"].push_back({{"rule", or_null(r.quota_by_rule[i].rule)},
                                               {"quota_refusals", r.quota_by_rule[i].count}});
    j["refusals_by_decision"] = nlohmann::json::array();
    for (auto &[decision, n] : r.refusals_by_decision)
        j["refusals_by_decision"].push_back({{"decision", decision}, {"count", n}});
    j["timeline"] = nlohmann::json::array();
    for (auto &[start, t] : r.timeline)
        j["timeline"].push_back({{"hour", format_time(start)},
                                 {"start_us", start},
                                 {"grants", t.sessions},
                                 {"denials", t.denials},
                                 {"quota_refusals", t.quota_refusals},
                                 {"other_refusals", t.other_refusals_total()},
                                 {"revocations", t.revocations},
                                 {"rx_bytes", t.rx_bytes}});
    return j;
}

Result<void> run_report(const ReportRequest &req) {
    if (req.html == "-" && req.json)
        return make_error(Errc::invalid_argument, "--html - and --json both want stdout");
    auto reader = journal::JournalReader::open(req.db);
    if (!reader) return reader.error();
    auto rep = reader->report(req.filter);
    if (!rep) return rep.error();
    nlohmann::json j = report_json(*rep, req.filter);
    if (!req.html.empty()) {
        HtmlContext ctx{req.db, format_time(journal::now_us())};
        std::string page = report_html(j, ctx);
        if (auto w = write_file(req.html, page); !w) return w.error();
        if (req.html != "-")
            std::cerr << "wrote " << req.html << " (" << page.size() << " bytes)\n";
        if (req.json) std::cout << knod::dump_json_escaped(j, 2) << "\n";
        return {};
    }
    if (req.json)
        std::cout << knod::dump_json_escaped(j, 2) << "\n";
    else
        print_tables(j);
    return {};
}

} // namespace knod::cli
