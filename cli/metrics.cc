// knod-policy metrics: the daemon's figures in Prometheus' text format, on stdout or, with
// --textfile DIR, as DIR/knod-policy.prom for node_exporter's textfile collector (written
// atomically; the packaged timer runs this every 10 s). No listening socket anywhere.
#include "cli/commands.h"
#include "cli/daemon_call.h"
#include "cli/metrics_format.h"
#include "client/client.h"

#include <nlohmann/json.hpp>

#include "knod/untrusted.h"

#include <grp.h>

#include <charconv>
#include <iostream>

namespace knod::cli {
namespace {

constexpr const char *textfile_name = "knod-policy.prom";

struct Options {
    BusOptions bus;
    std::string textfile_dir;
    // The whole run's deadline: a daemon that does not answer (stopped, hung) is reported as
    // down (knod_up 0) within it, never after sd-bus's 25 s per call.
    double timeout_s = 4;
    std::string textfile_group = "prometheus"; // Debian's node_exporter runs as prometheus
    bool job_tags = false;
};

// The collector's group, by name or number.
Result<gid_t> collector_group(const std::string &name) {
    gid_t gid = 0;
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), gid);
    if (ec == std::errc() && end == name.data() + name.size() && !name.empty()) return gid;
    if (const struct group *g = ::getgrnam(name.c_str())) return g->gr_gid;
    return make_error(Errc::invalid_argument,
                      "--textfile-group: no group " + quote_untrusted(name) +
                          " here; name the group node_exporter runs as (Debian's: prometheus)");
}

// Where the text goes. A file that cannot be written (the directory, the group) is exit 1, not
// 2: the packaged unit counts 2 (daemon down, the file says so) as success, and a collector
// left with no file at all must see the unit fail.
int deliver(const Options &o, const std::string &text, int rc) {
    if (o.textfile_dir.empty()) {
        std::cout << text << std::flush;
        return rc;
    }
    auto gid = collector_group(o.textfile_group);
    if (!gid) {
        std::cerr << "knod-policy metrics: " << gid.error().message << "\n";
        return exit_failed;
    }
    if (auto w = write_textfile(o.textfile_dir, textfile_name, text, *gid); !w) {
        std::cerr << "knod-policy metrics: " << w.error().message << "\n";
        return exit_failed;
    }
    return rc;
}

int run_metrics(const Options &o) {
    auto failed = [&](const Error &e) {
        int rc = call_failed("metrics", e, o.bus.address);
        // The file says the daemon is down rather than keeping figures it no longer vouches for.
        if (!o.textfile_dir.empty()) return deliver(o, render_down(), rc);
        return rc;
    };
    // Two calls (AttestProcess, GetMetrics) share the deadline.
    auto client =
        client::Client::connect(o.bus.address, static_cast<std::uint64_t>(o.timeout_s * 1e6 / 2));
    if (!client) return failed(client.error());
    auto text = client->metrics();
    if (!text) return failed(text.error());
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_object())
        return failed(make_error(Errc::corrupt, "GetMetrics answered something that is not a "
                                                "JSON object"));
    return deliver(o, render_metrics(j, o.job_tags), exit_ok);
}

} // namespace

Runner add_metrics(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "metrics",
        "Print the daemon's figures in Prometheus' text exposition format (root, the policy's "
        "auditor_group or admin_group): live bindings, requests by decision, refusals by kind, "
        "bindings ended by reason, RX bytes and packets per netdev and GPU, data-path and guard "
        "counters, journal commit latency and backlog, copy sinks, rate-limited calls, start "
        "time. Labels are netdev, GPU, rule, decision, kind, reason, method and sink; never a "
        "binding id, pid, key id or uid. With --textfile DIR it writes DIR/knod-policy.prom "
        "atomically for node_exporter's textfile collector, and knod_up 0 alone when the "
        "daemon cannot be asked. See docs/metrics.md.");
    add_bus_options(cmd, o->bus, false);
    cmd->footer(std::string(daemon_exit_codes) +
                " With --textfile: 1 when the file cannot be written (DIR, --textfile-group); "
                "a daemon that cannot be reached is 2 and leaves knod_up 0 in the file.");
    cmd->add_option("--textfile", o->textfile_dir,
                    "write DIR/knod-policy.prom (temporary file, fsync, rename) instead of "
                    "printing; Debian's node_exporter reads /var/lib/prometheus/node-exporter")
        ->type_name("DIR");
    cmd->add_option("--timeout", o->timeout_s,
                    "seconds to wait for the daemon in all; one that does not answer in time "
                    "counts as down (exit 2, knod_up 0 in the file)")
        ->check(CLI::Range(0.2, 60.0))
        ->type_name("SECONDS")
        ->capture_default_str();
    cmd->add_flag("--job-tags", o->job_tags,
                  "also export knod_job_bindings{job_tag=...}: live bindings per job tag "
                  "(Binding.SetJob). Off by default: each holder picks its tag, so every new "
                  "tag is a new series Prometheus keeps for its retention; turn it on where "
                  "the jobs' names are few (docs/metrics.md)");
    cmd->add_option("--textfile-group", o->textfile_group,
                    "the group the file is readable by (mode 0640): the one node_exporter runs "
                    "as; no other local user reads it")
        ->type_name("GROUP")
        ->capture_default_str();
    return [=]() -> int {
        if (!cmd->parsed()) return -1;
        return run_metrics(*o);
    };
}

} // namespace knod::cli
