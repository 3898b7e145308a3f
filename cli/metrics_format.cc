#include "cli/metrics_format.h"

#include "knod/untrusted.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace knod::cli {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Shortest text that reads back as the same double ("0.005", "1", "2.5").
std::string number(double v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("NaN");
}

// One metric family: HELP and TYPE once, then its samples. A family without samples is left
// out (node_exporter's textfile collector and promtool both take that best).
class Family {
  public:
    Family(std::string name, const char *type, const char *help)
        : name_(std::move(name)), type_(type), help_(help) {}
    void add(const Labels &labels, const std::string &value, const char *suffix = "") {
        samples_ += name_ + suffix;
        if (!labels.empty()) {
            samples_ += '{';
            for (std::size_t i = 0; i < labels.size(); ++i) {
                if (i) samples_ += ',';
                samples_ += labels[i].first + "=\"" + prom_label_value(labels[i].second) + '"';
            }
            samples_ += '}';
        }
        samples_ += ' ' + value + '\n';
    }
    void add(const Labels &labels, std::uint64_t v) { add(labels, std::to_string(v)); }
    void write(std::string &out) const {
        if (samples_.empty()) return;
        out += "# HELP " + name_ + ' ' + help_ + '\n';
        out += "# TYPE " + name_ + ' ' + type_ + '\n';
        out += samples_;
    }

  private:
    std::string name_;
    const char *type_;
    const char *help_;
    std::string samples_;
};

std::string str(const nlohmann::json &j, const char *key) {
    if (!j.is_object()) return {};
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<std::uint64_t> count(const nlohmann::json &j, const char *key) {
    if (!j.is_object()) return std::nullopt;
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) return std::nullopt;
    return it->get<std::uint64_t>();
}

// {"name": count, ...} as one sample per name, labelled `label`.
void each_count(Family &f, const nlohmann::json &m, const char *key, const char *label) {
    if (!m.is_object() || !m.contains(key) || !m[key].is_object()) return;
    for (auto &[k, v] : m[key].items())
        if (v.is_number_unsigned()) f.add({{label, k}}, v.get<std::uint64_t>());
}

void datapath(std::string &out, const nlohmann::json &d) {
    // The drivers' counters (driver::Driver::stats): the sim's and the filter's are flat names;
    // devmem's are NETDEV.guard.WHAT and NETDEV.rx-queue-N.nic_rx_bytes|nic_rx_packets.
    Family packets("knod_datapath_packets_total", "counter",
                   "Packets the flow filter and driver counted, by event (unmatched_passed, "
                   "unmatched_dropped, malformed, fragments, misrouted, ...), all bindings.");
    Family guard("knod_guard_packets_total", "counter",
                 "Packets the devmem guard counted on a NIC, by event (misrouted, malformed, "
                 "fragments).");
    Family nic_bytes("knod_nic_rx_bytes_total", "counter",
                     "Bytes the NIC received on a bound RX queue (its own queue statistics).");
    Family nic_packets("knod_nic_rx_packets_total", "counter",
                       "Packets the NIC received on a bound RX queue (its own queue statistics).");
    if (!d.is_object()) return;
    for (auto &[key, v] : d.items()) {
        if (!v.is_number_unsigned()) continue;
        std::uint64_t n = v.get<std::uint64_t>();
        // The netdev part may itself hold dots: the known tails are matched from the right.
        if (auto at = key.rfind(".guard."); at != std::string::npos) {
            guard.add({{"netdev", key.substr(0, at)}, {"event", key.substr(at + 7)}}, n);
            continue;
        }
        if (auto at = key.rfind(".rx-queue-"); at != std::string::npos) {
            std::string rest = key.substr(at + 10); // N.nic_rx_bytes
            auto dot = rest.find('.');
            if (dot != std::string::npos) {
                Labels l{{"netdev", key.substr(0, at)}, {"queue", rest.substr(0, dot)}};
                std::string what = rest.substr(dot + 1);
                if (what == "nic_rx_bytes") {
                    nic_bytes.add(l, n);
                    continue;
                }
                if (what == "nic_rx_packets") {
                    nic_packets.add(l, n);
                    continue;
                }
            }
        }
        packets.add({{"event", key}}, n);
    }
    for (const Family *f : {&packets, &guard, &nic_bytes, &nic_packets})
        f->write(out);
}

} // namespace

std::string prom_label_value(std::string_view raw) {
    std::string clean = escape_untrusted(raw, Escape::message);
    std::string out;
    out.reserve(clean.size());
    for (char c : clean) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

std::string render_down() {
    std::string out;
    Family up("knod_up", "gauge",
              "1 when knod-policyd answered for these figures, 0 when it could not be asked.");
    up.add({}, std::uint64_t{0});
    up.write(out);
    return out;
}

std::string render_metrics(const nlohmann::json &m, bool job_tags) {
    std::string out;
    Family up("knod_up", "gauge",
              "1 when knod-policyd answered for these figures, 0 when it could not be asked.");
    up.add({}, std::uint64_t{1});
    up.write(out);

    Family info("knod_info", "gauge",
                "Always 1: the daemon's version, driver and the digest of the policy in force.");
    info.add({{"version", str(m, "version")},
              {"driver", str(m, "driver")},
              {"policy_digest", str(m, "policy_digest")}},
             std::uint64_t{1});
    info.write(out);

    Family start("knod_start_time_seconds", "gauge",
                 "When knod-policyd started, in seconds since the Unix epoch.");
    if (auto us = count(m, "start_time_us")) start.add({}, number(static_cast<double>(*us) / 1e6));
    start.write(out);

    Family rules("knod_policy_rules", "gauge", "Rules in the policy in force.");
    if (auto n = count(m, "rules")) rules.add({}, *n);
    rules.write(out);
    Family permissive("knod_policy_permissive", "gauge",
                      "1 when the policy is permissive (denials are logged, not enforced).");
    if (m.is_object() && m.contains("permissive") && m["permissive"].is_boolean())
        permissive.add({}, std::uint64_t{m["permissive"].get<bool>()});
    permissive.write(out);

    Family bindings("knod_bindings", "gauge",
                    "Live bindings by state (granted, active), netdev, GPU and the rule that "
                    "granted them.");
    if (m.is_object() && m.contains("bindings") && m["bindings"].is_array())
        for (auto &b : m["bindings"])
            if (auto n = count(b, "count"))
                bindings.add({{"state", str(b, "state")},
                              {"netdev", str(b, "netdev")},
                              {"gpu", str(b, "gpu")},
                              {"rule", str(b, "rule")}},
                             *n);
    bindings.write(out);
    // Labelled job_tag, not job: Prometheus sets job on every target (ours would become
    // exported_job).
    Family jobs("knod_job_bindings", "gauge",
                "Live bindings tagged with a job (Binding.SetJob: what the holder claims, e.g. a "
                "torch.distributed job's name), by job: at most 64 jobs, those with the most "
                "bindings, the rest summed as job_tag=\"(other)\"; untagged bindings not counted.");
    if (job_tags && m.is_object() && m.contains("jobs") && m["jobs"].is_array())
        for (auto &j : m["jobs"])
            if (auto n = count(j, "count")) jobs.add({{"job_tag", str(j, "job")}}, *n);
    if (job_tags) jobs.write(out);

    Family requests("knod_requests_total", "counter",
                    "Binding requests by decision: allow and would-deny once the grant is "
                    "durable; deny, quota-exceeded, isolation-violation, flow-conflict, "
                    "driver-failure, invalid-request, journal-unavailable when refused.");
    each_count(requests, m, "requests", "decision");
    requests.write(out);
    Family refusals("knod_refusals_total", "counter",
                    "Refusals by kind, each one counted (the journal coalesces repeats).");
    each_count(refusals, m, "refusals", "kind");
    refusals.write(out);
    Family ended("knod_bindings_ended_total", "counter", "Bindings that ended, by end reason.");
    each_count(ended, m, "ended", "reason");
    ended.write(out);
    Family limited("knod_rate_limited_calls_total", "counter",
                   "Calls refused by the per-user rate limit or a bound on what the daemon "
                   "keeps per user, by method.");
    each_count(limited, m, "rate_limited", "method");
    limited.write(out);

    Family rx_bytes("knod_rx_bytes_total", "counter",
                    "Payload bytes delivered into GPU memory, by netdev and GPU (ended and live "
                    "bindings).");
    Family rx_packets("knod_rx_packets_total", "counter",
                      "Packets delivered into GPU memory, by netdev and GPU.");
    Family dropped("knod_dropped_packets_total", "counter",
                   "Packets dropped on a binding's path (before activation, foreign), by netdev "
                   "and GPU.");
    if (m.is_object() && m.contains("traffic") && m["traffic"].is_array())
        for (auto &t : m["traffic"]) {
            Labels l{{"netdev", str(t, "netdev")}, {"gpu", str(t, "gpu")}};
            if (auto n = count(t, "rx_bytes")) rx_bytes.add(l, *n);
            if (auto n = count(t, "rx_packets")) rx_packets.add(l, *n);
            if (auto n = count(t, "dropped_packets")) dropped.add(l, *n);
        }
    for (const Family *f : {&rx_bytes, &rx_packets, &dropped})
        f->write(out);

    if (m.is_object() && m.contains("datapath")) datapath(out, m["datapath"]);

    const nlohmann::json j =
        m.is_object() ? m.value("journal", nlohmann::json::object()) : nlohmann::json::object();
    Family available("knod_journal_available", "gauge",
                     "1 when the journal takes writes (requests are refused otherwise).");
    if (j.is_object() && j.contains("available") && j["available"].is_boolean())
        available.add({}, std::uint64_t{j["available"].get<bool>()});
    available.write(out);
    Family pending("knod_journal_pending_records", "gauge",
                   "Journal records waiting in memory for the disk to take them again.");
    if (auto n = count(j, "pending_records")) pending.add({}, *n);
    pending.write(out);
    Family lost("knod_journal_dropped_records_total", "counter",
                "Journal records lost because too many were waiting for the disk.");
    if (auto n = count(j, "dropped_records")) lost.add({}, *n);
    lost.write(out);
    Family commit("knod_journal_commit_duration_seconds", "histogram",
                  "Time from handing a session's grant or end to the journal's writer to its "
                  "commit.");
    if (j.is_object() && j.contains("commit_seconds") && j["commit_seconds"].is_object()) {
        const auto &h = j["commit_seconds"];
        auto n = count(h, "count");
        bool ok = n && h.contains("sum") && h["sum"].is_number() && h.contains("buckets") &&
                  h["buckets"].is_array();
        if (ok) {
            for (auto &b : h["buckets"])
                if (b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number_unsigned())
                    commit.add({{"le", number(b[0].get<double>())}},
                               std::to_string(b[1].get<std::uint64_t>()), "_bucket");
            commit.add({{"le", "+Inf"}}, std::to_string(*n), "_bucket");
            commit.add({}, number(h["sum"].get<double>()), "_sum");
            commit.add({}, std::to_string(*n), "_count");
        }
    }
    commit.write(out);

    Family written("knod_sink_written_records_total", "counter",
                   "Journal events a copy sink (journald, linux-audit) took.");
    Family failed("knod_sink_failed_records_total", "counter",
                  "Journal events a copy sink refused.");
    Family sink_dropped("knod_sink_dropped_records_total", "counter",
                        "Journal events that did not fit a copy sink's queue.");
    Family failing("knod_sink_failing", "gauge", "1 while a copy sink's last write failed.");
    Family heads("knod_sink_written_heads_total", "counter",
                 "Chain heads (journal-anchor records) a copy sink took (journald). Whether "
                 "journald kept them is for `knod-policy audit verify` to say.");
    Family head_seq("knod_sink_last_head_event", "gauge",
                    "The journal event the newest chain head a copy sink took names.");
    if (m.is_object() && m.contains("sinks") && m["sinks"].is_array())
        for (auto &k : m["sinks"]) {
            Labels l{{"sink", str(k, "name")}};
            if (auto n = count(k, "written")) written.add(l, *n);
            if (auto n = count(k, "failed")) failed.add(l, *n);
            if (auto n = count(k, "dropped")) sink_dropped.add(l, *n);
            if (k.is_object() && k.contains("failing") && k["failing"].is_boolean())
                failing.add(l, std::uint64_t{k["failing"].get<bool>()});
            if (str(k, "name") != "journald") continue; // only it keeps heads
            if (auto n = count(k, "heads_written")) heads.add(l, *n);
            if (auto n = count(k, "last_head_seq")) head_seq.add(l, *n);
        }
    for (const Family *f : {&written, &failed, &sink_dropped, &failing, &heads, &head_seq})
        f->write(out);

    // systemd's fd store (only where the daemon keeps bindings through a restart): a handle the
    // notify socket did not take is a binding that ends at the next stop.
    const nlohmann::json fs =
        m.is_object() ? m.value("fd_store", nlohmann::json::object()) : nlohmann::json::object();
    if (fs.is_object() && fs.value("enabled", false)) {
        Family kept("knod_fd_store_kept_handles_total", "counter",
                    "Binding handles sent to systemd's file-descriptor store.");
        Family not_kept("knod_fd_store_not_kept_handles_total", "counter",
                        "Binding handles systemd's notify socket did not take (PID 1 not "
                        "reading it): those bindings end at the next stop.");
        Family unremoved("knod_fd_store_remove_failed_total", "counter",
                         "FDSTOREREMOVE messages not sent: the fd stays in the store until the "
                         "next start discards it.");
        if (auto n = count(fs, "kept")) kept.add({}, *n);
        if (auto n = count(fs, "not_kept")) not_kept.add({}, *n);
        if (auto n = count(fs, "remove_failed")) unremoved.add({}, *n);
        for (const Family *f : {&kept, &not_kept, &unremoved})
            f->write(out);
    }
    return out;
}

Result<void> write_textfile(const std::string &dir, const std::string &name,
                            const std::string &text, gid_t gid) {
    auto fail = [&](const std::string &what) {
        return make_error(Errc::io,
                          what + " in " + quote_untrusted(dir) + ": " + std::strerror(errno));
    };
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return fail("cannot open the directory");
    // A dot name without the .prom suffix: the collector reads only *.prom.
    std::string tmp = dir + "/." + name + ".XXXXXX";
    int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (fd < 0) {
        auto e = fail("cannot create a temporary file");
        ::close(dfd);
        return e;
    }
    auto undo = [&](const std::string &what) {
        auto e = fail(what);
        ::close(fd);
        ::unlink(tmp.c_str());
        ::close(dfd);
        return e;
    };
    // node_exporter runs as another user (prometheus): readable by its group, and by nobody
    // else (GetMetrics answers only root, auditors and admins).
    if (::fchown(fd, static_cast<uid_t>(-1), gid) != 0)
        return undo("cannot give " + tmp + " to group " + std::to_string(gid));
    if (::fchmod(fd, 0640) != 0) return undo("cannot set the mode of " + tmp);
    for (std::size_t at = 0; at < text.size();) {
        ssize_t n = ::write(fd, text.data() + at, text.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return undo("cannot write " + tmp);
        at += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) return undo("cannot sync " + tmp);
    if (::close(fd) != 0) {
        auto e = fail("cannot close " + tmp);
        ::unlink(tmp.c_str());
        ::close(dfd);
        return e;
    }
    if (::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
        auto e = fail("cannot rename " + tmp + " to " + name);
        ::unlink(tmp.c_str());
        ::close(dfd);
        return e;
    }
    // The rename itself survives a crash only once the directory is on disk.
    int r = ::fsync(dfd);
    auto e = r != 0 ? Result<void>(fail("cannot sync the directory")) : Result<void>();
    ::close(dfd);
    return e;
}

} // namespace knod::cli
