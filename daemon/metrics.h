// The daemon's running figures for fleet monitoring (Manager.GetMetrics, `knod-policy metrics`):
// counters since the start, each keyed by a set the daemon bounds (decisions, refusal kinds and
// end reasons are the daemon's own words; netdevs and GPUs are the driver's inventory), never by
// a binding id, pid, key id or uid. Part of the core: no D-Bus here.
#pragma once

#include "daemon/driver/driver.h"
#include "daemon/end_reason.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace knod::daemon {

// A histogram with fixed buckets, observed from any thread (the journal's writer answers on its
// own): a handful of atomic adds, no lock, no allocation.
class LatencyHistogram {
  public:
    // Upper bounds in seconds, Prometheus' default buckets: a commit is a few ms on a disk,
    // up to SQLite's 5 s busy timeout on a locked journal.
    static constexpr std::array<double, 11> bounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,    2.5,   5,    10};
    void observe(std::chrono::steady_clock::duration d);
    struct Snapshot {
        std::array<std::uint64_t, bounds.size()> cumulative{}; // observations <= each bound
        std::uint64_t count = 0;
        double sum_seconds = 0;
    };
    Snapshot snapshot() const;

  private:
    std::array<std::atomic<std::uint64_t>, bounds.size() + 1> buckets_{}; // the last: above all
    std::atomic<std::uint64_t> sum_ns_{0};
};

class Metrics {
  public:
    Metrics();
    // A refusal of `kind` (journal::kind: request-denied, activate-refused, rate-limited, ...);
    // a refused request also counts under its decision (deny, flow-conflict, ...). Counted
    // before coalescing: the journal keeps one record per window, this every refusal.
    void refused(const std::string &kind, const std::string &decision);
    // A request whose grant is durable; `decision`: allow, or would-deny (permissive mode).
    void granted(const std::string &decision) { ++requests_[decision]; }
    // A call over the rate limit or a bound on the caller's state; `method` is the daemon's own
    // method name.
    void rate_limited(const std::string &method) { ++rate_limited_[method]; }
    // A live binding ended, with what it received: its figures move to the per-device totals.
    void ended(EndReason why, const std::string &netdev, const std::string &gpu,
               const driver::Counters &c);
    LatencyHistogram &commit_latency() { return commit_; }
    const LatencyHistogram &commit_latency() const { return commit_; }

    std::int64_t start_us() const { return start_us_; }
    const std::map<std::string, std::uint64_t> &requests() const { return requests_; }
    const std::map<std::string, std::uint64_t> &refusals() const { return refusals_; }
    const std::map<std::string, std::uint64_t> &ends() const { return ends_; }
    const std::map<std::string, std::uint64_t> &rate_limited() const { return rate_limited_; }
    using Device = std::pair<std::string, std::string>; // netdev, GPU
    const std::map<Device, driver::Counters> &ended_traffic() const { return ended_traffic_; }

  private:
    std::int64_t start_us_;
    std::map<std::string, std::uint64_t> requests_;
    std::map<std::string, std::uint64_t> refusals_;
    std::map<std::string, std::uint64_t> ends_;
    std::map<std::string, std::uint64_t> rate_limited_;
    std::map<Device, driver::Counters> ended_traffic_;
    LatencyHistogram commit_;
};

// Live bindings per job tag (Binding.SetJob), as GetMetrics reports them: at most
// `max_series` jobs by name, those with the most live bindings (ties: the smaller name), and the
// rest summed under "(other)", a name no tag can have (tags have no parentheses). Empty counts
// are left out. Bounded whatever callers tag: tags are callers' claims.
inline constexpr std::size_t max_job_series = 64;
inline constexpr const char *other_jobs = "(other)";
std::vector<std::pair<std::string, std::uint64_t>>
job_series(const std::map<std::string, std::uint64_t> &per_job,
           std::size_t max_series = max_job_series);

class BindingManager;

// GetMetrics' answer: the counters above, the live bindings grouped by state, netdev, GPU and
// rule, the tagged ones per job (job_series), RX per netdev and GPU (ended plus live), the driver's
// data-path counters, the journal's and sinks' state, and who is running (version, driver, policy
// digest). JSON text.
std::string metrics_json(const BindingManager &manager, const std::string &version);

} // namespace knod::daemon
