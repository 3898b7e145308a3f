// knod-policy bindings: the live bindings with their rule, flows, creation, expiry, RX
// counters and job tag (a job's ranks next to each other; --job keeps one job's); --watch redraws
// them like top (plain snapshots when stdout is not a terminal, one JSON object per line with
// --json), with per-binding rates between two frames.
#include "cli/commands.h"
#include "cli/daemon_call.h"
#include "client/client.h"

#include "knod/json.h"
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

namespace knod::cli {
namespace {

struct Options {
    BusOptions bus;
    bool watch = false;
    double interval_s = 2.0;
    std::uint32_t count = 0; // frames to show with --watch; 0: until interrupted
    std::string job;         // --job: only the bindings tagged with this job ("": all)
};

struct Row {
    client::BindingSummary b;
    std::optional<client::BindingDetails> d; // absent when it ended between list and Get
    std::optional<double> rx_bytes_per_s, rx_packets_per_s; // from the previous frame
};

struct Frame {
    std::uint64_t at_us = 0;
    std::vector<Row> rows;
};

std::uint64_t now_us() {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
}

bool tagged(const Row &r) {
    return r.d && !r.d->job.empty();
}

// The rows as listed, then those tagged with a job (SetJob) moved first and sorted by job,
// group and rank (a job's ranks together); untagged ones after, in the daemon's order. With
// a `job`, only that job's rows.
Result<Frame> snapshot(client::Client &c, const std::string &job) {
    auto list = c.list();
    if (!list) return list.error();
    Frame f;
    f.at_us = now_us();
    for (auto &b : *list) {
        auto d = c.details(b.id);
        Row r{b, d ? std::optional(*d) : std::nullopt, {}, {}};
        if (!job.empty() && (!tagged(r) || r.d->job != job)) continue;
        f.rows.push_back(std::move(r));
    }
    std::stable_sort(f.rows.begin(), f.rows.end(), [](const Row &a, const Row &b) {
        if (tagged(a) != tagged(b)) return tagged(a);
        if (!tagged(a)) return false;
        return std::tie(a.d->job, a.d->job_group, a.d->job_rank) <
               std::tie(b.d->job, b.d->job_group, b.d->job_rank);
    });
    return f;
}

// JOB's cell: job[group]#rank ("job#rank" without a group); [, ] and # are in no tag, so the
// parts cannot run into each other. "-" untagged.
std::string job_cell(const Row &r) {
    if (!tagged(r)) return "-";
    const auto &d = *r.d;
    return d.job + (d.job_group.empty() ? "" : "[" + d.job_group + "]") + "#" +
           std::to_string(d.job_rank);
}

// Rates per binding against the frame before (same id, counters that did not go backwards).
void add_rates(Frame &f, const Frame &before) {
    std::map<std::string, const Row *> old;
    for (auto &r : before.rows)
        old[r.b.id] = &r;
    double dt = (static_cast<double>(f.at_us) - static_cast<double>(before.at_us)) / 1e6;
    if (dt <= 0) return;
    for (auto &r : f.rows) {
        auto it = old.find(r.b.id);
        if (it == old.end() || !r.d || !it->second->d) continue;
        auto &o = *it->second->d;
        if (r.d->rx_bytes < o.rx_bytes || r.d->rx_packets < o.rx_packets) continue;
        r.rx_bytes_per_s = static_cast<double>(r.d->rx_bytes - o.rx_bytes) / dt;
        r.rx_packets_per_s = static_cast<double>(r.d->rx_packets - o.rx_packets) / dt;
    }
}

nlohmann::json to_json(const Row &r, bool rates) {
    auto &b = r.b;
    nlohmann::json j{{"id", b.id},   {"path", b.path}, {"netdev", b.netdev},
                     {"gpu", b.gpu}, {"mode", b.mode}, {"state", b.state},
                     {"uid", b.uid}, {"pid", b.pid},   {"region_bytes", b.region_bytes}};
    if (auto &d = r.d) {
        j["rule"] = d->rule;
        j["flows"] = d->flows;
        j["created_us"] = d->created_us;
        j["expires_us"] = d->expires_us;
        j["rx_bytes"] = d->rx_bytes;
        j["rx_packets"] = d->rx_packets;
        j["dropped_packets"] = d->dropped_packets;
        j["pod"] = d->pod.empty() ? nlohmann::json() : nlohmann::json(d->pod);
    }
    // The holder's job tag (SetJob), null untagged.
    bool t = tagged(r);
    j["job"] = t ? nlohmann::json(r.d->job) : nlohmann::json();
    j["group"] = t ? nlohmann::json(r.d->job_group) : nlohmann::json();
    j["rank"] = t ? nlohmann::json(r.d->job_rank) : nlohmann::json();
    if (rates) {
        j["rx_bytes_per_s"] = r.rx_bytes_per_s ? nlohmann::json(*r.rx_bytes_per_s) : nullptr;
        j["rx_packets_per_s"] = r.rx_packets_per_s ? nlohmann::json(*r.rx_packets_per_s) : nullptr;
    }
    return j;
}

std::string human_bytes(double v) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u ? "%.1f%s" : "%.0f%s", v, units[u]);
    return buf;
}

std::string utc_time(std::uint64_t us) {
    std::time_t t = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
    return buf;
}

std::string time_left(std::uint64_t until_us, std::uint64_t now) {
    if (until_us <= now) return "now";
    std::uint64_t s = (until_us - now) / 1000000;
    return s >= 3600 ? std::to_string(s / 3600) + "h" + std::to_string(s % 3600 / 60) + "m"
                     : std::to_string(s / 60) + "m" + std::to_string(s % 60) + "s";
}

// A table whose columns are as wide as their widest cell.
void print_table(const std::vector<std::vector<std::string>> &rows,
                 const std::vector<std::vector<std::string>> &below) {
    std::vector<std::size_t> w;
    for (auto &r : rows)
        for (std::size_t i = 0; i < r.size(); ++i) {
            if (w.size() <= i) w.push_back(0);
            w[i] = std::max(w[i], r[i].size());
        }
    for (std::size_t n = 0; n < rows.size(); ++n) {
        std::string line;
        for (std::size_t i = 0; i < rows[n].size(); ++i)
            line += rows[n][i] +
                    (i + 1 < rows[n].size() ? std::string(w[i] - rows[n][i].size() + 2, ' ') : "");
        std::cout << line << "\n";
        if (n > 0)
            for (auto &extra : below[n - 1])
                std::cout << "    " << extra << "\n";
    }
}

void print_frame(const Frame &f, bool rates) {
    if (f.rows.empty()) {
        std::cout << "no bindings\n";
        return;
    }
    std::vector<std::vector<std::string>> rows;
    std::vector<std::vector<std::string>> below;
    std::vector<std::string> head{"ID",      "STATE",    "UID",       "PID", "NETDEV",
                                  "GPU",     "REGION",   "RULE",      "JOB", "CREATED",
                                  "EXPIRES", "RX BYTES", "RX PACKETS"};
    if (rates) {
        head.push_back("RX/S");
        head.push_back("PKT/S");
    }
    rows.push_back(head);
    for (auto &r : f.rows) {
        auto &b = r.b;
        auto &d = r.d;
        std::vector<std::string> row{b.id,
                                     b.state,
                                     std::to_string(b.uid),
                                     std::to_string(b.pid),
                                     b.netdev,
                                     b.gpu,
                                     human_bytes(static_cast<double>(b.region_bytes)),
                                     d ? d->rule : "-",
                                     job_cell(r),
                                     d ? utc_time(d->created_us) : "-",
                                     d ? time_left(d->expires_us, f.at_us) : "-",
                                     d ? std::to_string(d->rx_bytes) : "-",
                                     d ? std::to_string(d->rx_packets) : "-"};
        if (rates) {
            row.push_back(r.rx_bytes_per_s ? human_bytes(*r.rx_bytes_per_s) + "/s" : "-");
            row.push_back(r.rx_packets_per_s ? std::to_string(std::llround(*r.rx_packets_per_s))
                                             : "-");
        }
        rows.push_back(std::move(row));
        std::vector<std::string> extra;
        if (d) {
            for (auto &fl : d->flows)
                extra.push_back("flow " + fl);
            auto pod = [&](const char *k) {
                auto it = d->pod.find(k);
                return it == d->pod.end() ? std::string() : it->second;
            };
            if (!d->pod.empty())
                extra.push_back("pod " + pod("namespace") + "/" + pod("name") +
                                (pod("uid").empty() ? "" : " (uid " + pod("uid") + ")"));
        }
        below.push_back(std::move(extra));
    }
    print_table(rows, below);
}

// Home and clear, like top. Written past std::cout, whose escaping (terminal_output.h) would
// print the ESC as text; everything else still goes through it.
void clear_screen() {
    std::cout << std::flush;
    static constexpr char seq[] = "\x1b[H\x1b[2J";
    for (std::size_t done = 0; done < sizeof seq - 1;) {
        ssize_t w = ::write(STDOUT_FILENO, seq + done, sizeof seq - 1 - done);
        if (w <= 0) return; // a terminal that went away: the next frame's write fails too
        done += static_cast<std::size_t>(w);
    }
}

int run(const Options &o) {
    auto client = client::Client::connect(o.bus.address);
    if (!client) return call_failed("bindings", client.error(), o.bus.address);
    if (!o.watch) {
        auto f = snapshot(*client, o.job);
        if (!f) return call_failed("bindings", f.error(), o.bus.address);
        if (o.bus.json) {
            nlohmann::json out = nlohmann::json::array();
            for (auto &r : f->rows)
                out.push_back(to_json(r, false));
            std::cout << knod::dump_json_escaped(out, 2) << "\n";
        } else {
            print_frame(*f, false);
        }
        return exit_ok;
    }
    // A terminal gets one screen redrawn in place; a pipe or file gets every frame in turn.
    bool tty = !o.bus.json && isatty(STDOUT_FILENO);
    auto pause = std::chrono::duration<double>(o.interval_s);
    std::optional<Frame> before;
    for (std::uint32_t n = 0; o.count == 0 || n < o.count; ++n) {
        if (n) std::this_thread::sleep_for(pause);
        auto f = snapshot(*client, o.job);
        if (!f) return call_failed("bindings", f.error(), o.bus.address);
        if (before) add_rates(*f, *before);
        if (o.bus.json) {
            nlohmann::json line{{"at_us", f->at_us}, {"bindings", nlohmann::json::array()}};
            for (auto &r : f->rows)
                line["bindings"].push_back(to_json(r, true));
            std::cout << knod::dump_json_escaped(line) << "\n";
        } else {
            if (tty)
                clear_screen();
            else if (n)
                std::cout << "\n";
            std::cout << "knod-policy bindings  " << utc_time(f->at_us) << "  every "
                      << o.interval_s << " s  " << f->rows.size() << " binding(s)"
                      << (tty ? "  (Ctrl-C quits)" : "") << "\n\n";
            print_frame(*f, true);
        }
        std::cout << std::flush;
        before = std::move(*f);
    }
    return exit_ok;
}

} // namespace

Runner add_bindings(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "bindings", "List bindings (your own, or all of them for auditors and admins): rule, "
                    "flows, creation, expiry, RX bytes and packets, state.");
    add_bus_options(cmd, o->bus, true);
    auto *watch = cmd->add_flag(
        "--watch,-w", o->watch,
        "refresh the list every --interval with per-binding RX rates: redrawn in place "
        "on a terminal, one snapshot after another otherwise; with --json, one JSON "
        "object per line");
    cmd->add_option("--interval", o->interval_s, "seconds between --watch frames")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str()
        ->needs(watch);
    cmd->add_option("--job", o->job,
                    "only the bindings tagged with this job (the name each rank's SetJob gave, "
                    "as JOB shows it before its [group] and #rank)");
    cmd->add_option("--count,-n", o->count, "stop --watch after this many frames (0: never)")
        ->capture_default_str()
        ->needs(watch);
    cmd->footer(
        std::string("Without --json: one line per binding, its flows indented below. "
                    "RX BYTES and RX PACKETS count what was delivered to the binding's "
                    "region; REGION is its size; CREATED is UTC. JOB is the job tag the "
                    "holder set (Binding.SetJob, e.g. by knod.distributed): job[group]#rank, "
                    "- for none; a job's ranks are listed together, before untagged "
                    "bindings. A tag is the holder's claim, never a policy input.\n") +
        daemon_exit_codes);
    return [cmd, o]() -> int { return cmd->parsed() ? run(*o) : -1; };
}

} // namespace knod::cli
