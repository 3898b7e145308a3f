#include "daemon/metrics.h"

#include "daemon/binding_manager.h"
#include "daemon/fd_store.h"
#include "journal/records.h"
#include "knod/json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>

namespace knod::daemon {

void LatencyHistogram::observe(std::chrono::steady_clock::duration d) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    if (ns < 0) ns = 0;
    double s = static_cast<double>(ns) / 1e9;
    std::size_t i = 0;
    while (i < bounds.size() && s > bounds[i])
        ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const {
    Snapshot s;
    std::uint64_t running = 0;
    for (std::size_t i = 0; i < bounds.size(); ++i) {
        running += buckets_[i].load(std::memory_order_relaxed);
        s.cumulative[i] = running;
    }
    s.count = running + buckets_[bounds.size()].load(std::memory_order_relaxed);
    s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
    return s;
}

Metrics::Metrics() : start_us_(journal::now_us()) {
    // Every series an operator alerts on exists from the start, at 0: rate() and absent()
    // need no special case for a daemon that has not refused anything yet.
    for (const char *d : {"allow", "deny"})
        requests_[d] = 0;
    for (const char *k :
         {journal::kind::denied, journal::kind::activate_refused, journal::kind::rate_limited,
          "renew-refused", journal::kind::reload_refused, journal::kind::revoke_refused,
          journal::kind::attest_refused})
        refusals_[k] = 0;
    for (int r = 0; r <= static_cast<int>(EndReason::link_removed); ++r)
        ends_[to_string(static_cast<EndReason>(r))] = 0;
}

void Metrics::refused(const std::string &kind, const std::string &decision) {
    ++refusals_[kind];
    if (kind == journal::kind::denied) ++requests_[decision.empty() ? "deny" : decision];
}

void Metrics::ended(EndReason why, const std::string &netdev, const std::string &gpu,
                    const driver::Counters &c) {
    ++ends_[to_string(why)];
    driver::Counters &t = ended_traffic_[{netdev, gpu}];
    t.rx_bytes += c.rx_bytes;
    t.rx_packets += c.rx_packets;
    t.dropped_packets += c.dropped_packets;
}

std::vector<std::pair<std::string, std::uint64_t>>
job_series(const std::map<std::string, std::uint64_t> &per_job, std::size_t max_series) {
    std::vector<std::pair<std::string, std::uint64_t>> all;
    for (auto &[job, n] : per_job)
        if (n) all.emplace_back(job, n);
    std::stable_sort(all.begin(), all.end(),
                     [](auto &a, auto &b) { return a.second > b.second; }); // names stay sorted
    if (all.size() <= max_series) return all;
    std::uint64_t rest = 0;
    for (std::size_t i = max_series; i < all.size(); ++i)
        rest += all[i].second;
    all.resize(max_series);
    all.emplace_back(other_jobs, rest);
    return all;
}

std::string metrics_json(const BindingManager &manager, const std::string &version) {
    const Metrics &m = manager.metrics();
    const auto &d = manager.driver();
    nlohmann::json j{{"version", version},
                     {"driver", d.name()},
                     {"policy_digest", manager.policy().digest},
                     {"rules", manager.policy().rules.size()},
                     {"permissive", manager.policy().settings.permissive},
                     {"start_time_us", m.start_us()},
                     {"requests", m.requests()},
                     {"refusals", m.refusals()},
                     {"ended", m.ends()},
                     {"rate_limited", m.rate_limited()}};
    // Live bindings, grouped: the groups are bounded by the live bindings, their labels by the
    // driver's inventory and the policy's rule names.
    std::map<std::tuple<std::string, std::string, std::string, std::string>, std::uint64_t> live;
    std::map<Metrics::Device, driver::Counters> traffic = m.ended_traffic();
    std::map<std::string, std::uint64_t> per_job; // tagged bindings only
    for (const Binding *b : manager.bindings()) {
        ++live[{to_string(b->state), b->netdev, b->gpu, b->rule}];
        if (b->job) ++per_job[b->job->job];
        driver::Counters c = manager.counters(b->id);
        driver::Counters &t = traffic[{b->netdev, b->gpu}];
        t.rx_bytes += c.rx_bytes;
        t.rx_packets += c.rx_packets;
        t.dropped_packets += c.dropped_packets;
    }
    j["bindings"] = nlohmann::json::array();
    for (auto &[k, n] : live)
        j["bindings"].push_back({{"state", std::get<0>(k)},
                                 {"netdev", std::get<1>(k)},
                                 {"gpu", std::get<2>(k)},
                                 {"rule", std::get<3>(k)},
                                 {"count", n}});
    j["jobs"] = nlohmann::json::array();
    for (auto &[job, n] : job_series(per_job))
        j["jobs"].push_back({{"job", job}, {"count", n}});
    j["traffic"] = nlohmann::json::array();
    for (auto &[k, c] : traffic)
        j["traffic"].push_back({{"netdev", k.first},
                                {"gpu", k.second},
                                {"rx_bytes", c.rx_bytes},
                                {"rx_packets", c.rx_packets},
                                {"dropped_packets", c.dropped_packets}});
    j["datapath"] = d.stats();
    auto h = m.commit_latency().snapshot();
    nlohmann::json buckets = nlohmann::json::array();
    for (std::size_t i = 0; i < LatencyHistogram::bounds.size(); ++i)
        buckets.push_back({LatencyHistogram::bounds[i], h.cumulative[i]});
    auto st = manager.status();
    j["journal"] = {
        {"available", st.journal_available},
        {"pending_records", st.pending_records},
        {"dropped_records", st.journal_dropped},
        {"commit_seconds", {{"buckets", buckets}, {"count", h.count}, {"sum", h.sum_seconds}}}};
    nlohmann::json sinks = nlohmann::json::array();
    for (auto &k : st.sink_stats)
        sinks.push_back({{"name", k.name},
                         {"written", k.written},
                         {"failed", k.failed},
                         {"dropped", k.dropped},
                         {"failing", k.failing},
                         {"heads_written", k.heads_written},
                         {"last_head_seq", k.last_head_seq}});
    j["sinks"] = sinks;
    j["fd_store"] = fd_store_json();
    return knod::dump_json(j);
}

} // namespace knod::daemon
