#include "journal/retention.h"

#include "knod/json.h"

namespace knod::journal {
namespace {

Error malformed(std::int64_t seq, const std::string &what) {
    return make_error(Errc::corrupt, "event " + std::to_string(seq) +
                                         " (retention-prune): " + what + " (malformed)");
}

// An integer member of `d` in [lo, hi]; nullopt when absent; an error for anything else.
Result<std::optional<std::int64_t>> integer(std::int64_t seq, const nlohmann::json &d,
                                            const char *key, std::int64_t lo, std::int64_t hi,
                                            bool null_ok = false) {
    auto it = d.find(key);
    if (it == d.end() || (null_ok && it->is_null())) return std::optional<std::int64_t>();
    // An unsigned above int64 is out of range too: get<std::int64_t> would wrap it.
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() &&
         it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)))
        return malformed(seq, std::string(key) + " is not an integer");
    std::int64_t v = it->get<std::int64_t>();
    if (v < lo || v > hi)
        return malformed(seq, std::string(key) + " " + std::to_string(v) + " is out of range");
    return std::optional<std::int64_t>(v);
}

// The sane time range the audit commands accept (1970-01-01..2200-01-01).
constexpr std::int64_t max_time_us = 7258118400LL * 1000000;

} // namespace

nlohmann::json retention_json(std::optional<std::int64_t> age_us,
                              std::optional<std::int64_t> events) {
    return {{"age_us", age_us ? nlohmann::json(*age_us) : nlohmann::json()},
            {"events", events ? nlohmann::json(*events) : nlohmann::json()}};
}

Result<PruneRecord> read_prune(std::int64_t seq, const nlohmann::json &d) {
    if (!d.is_object()) return malformed(seq, "its detail is not a JSON object");
    PruneRecord p;
    p.seq = seq;
    auto through = integer(seq, d, "pruned_through", 1, seq - 1);
    if (!through) return through.error();
    if (!*through) return malformed(seq, "no integer pruned_through");
    p.pruned_through = **through;
    auto at = integer(seq, d, "pruned_at_us", 0, max_time_us);
    if (!at) return at.error();
    auto through_at = integer(seq, d, "through_at_us", 0, max_time_us);
    if (!through_at) return through_at.error();
    p.through_at_us = *through_at;
    auto r = d.find("retention");
    if (r != d.end()) {
        if (!r->is_object()) return malformed(seq, "retention is not an object");
        auto age = integer(seq, *r, "age_us", 1, max_time_us, true);
        if (!age) return age.error();
        auto events = integer(seq, *r, "events", 0, INT64_MAX, true);
        if (!events) return events.error();
        p.records_retention = true;
        p.age_us = *age;
        p.keep_events = *events;
        // This build writes both times with its settings; without them nothing can be checked.
        if (!*at || !p.through_at_us)
            return malformed(seq, "it records its retention but not pruned_at_us and "
                                  "through_at_us");
    }
    p.pruned_at_us = at->value_or(0);
    if (!*at) p.through_at_us.reset(); // no prune time: its age cannot be told
    return p;
}

std::string age_text(std::int64_t us) {
    const char *sign = us < 0 ? "-" : "";
    // |INT64_MIN| does not fit: such an age is shown as its magnitude's neighbour.
    std::uint64_t u = us < 0 ? static_cast<std::uint64_t>(-(us + 1)) + 1 : us;
    auto text = [&](std::uint64_t n, const char *unit) {
        return std::string(sign) + std::to_string(n) + unit;
    };
    const std::uint64_t s = 1000000;
    if (u % (86400 * s) == 0 && u) return text(u / (86400 * s), "d");
    if (u % (3600 * s) == 0 && u) return text(u / (3600 * s), "h");
    if (u % s == 0) return text(u / s, "s");
    return text(u, "us");
}

std::optional<std::string> prune_problem(const PruneRecord &p,
                                         std::optional<std::int64_t> claimed_age_us) {
    std::string ev = "event " + std::to_string(p.seq) + " (retention-prune)";
    // In 128 bits: the times and ages are bounded, but their sums need not fit in 64.
    auto old_enough = [&](std::int64_t age) {
        return static_cast<wide_int>(*p.through_at_us) + age <
               static_cast<wide_int>(p.pruned_at_us);
    };
    auto removed = [&] {
        wide_int d = static_cast<wide_int>(p.pruned_at_us) - *p.through_at_us;
        return ev + " removed events through " + std::to_string(p.pruned_through) +
               ", the newest written " + age_text(static_cast<std::int64_t>(d)) +
               " before the prune";
    };
    if (p.records_retention) {
        bool by_age = p.age_us && old_enough(*p.age_us);
        // The daemon keeps at least `events` events below the prune event (its head then).
        bool by_count = p.keep_events && static_cast<wide_int>(p.pruned_through) <=
                                             static_cast<wide_int>(p.seq) - 1 - *p.keep_events;
        if (!by_age && !by_count)
            return removed() + ": younger than the retention it records (" +
                   (p.age_us ? "age " + age_text(*p.age_us) : std::string("no age setting")) +
                   ", " +
                   (p.keep_events ? "at most " + std::to_string(*p.keep_events) + " events"
                                  : std::string("no event-count setting")) +
                   "): not a prune retention makes (tampered)";
    }
    if (claimed_age_us) {
        if (!p.through_at_us)
            return ev +
                   " does not record when the newest event it removed was written (an "
                   "older build): it cannot be checked against --retention " +
                   age_text(*claimed_age_us);
        if (!old_enough(*claimed_age_us))
            return removed() + ": younger than --retention " + age_text(*claimed_age_us) +
                   " (a prune the auditor does not expect)";
    }
    return std::nullopt;
}

} // namespace knod::journal
