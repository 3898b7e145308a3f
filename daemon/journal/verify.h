// Chain verification: reads a journal read-only and checks that every event follows the one
// before it (sequence without gaps, stored prev_hash, recomputed hash).
#pragma once

#include "knod/result.h"

#include <cstdint>
#include <functional>
#include <string>

namespace knod::journal {

struct VerifyReport {
    bool ok = true;
    std::int64_t events_checked = 0;
    std::int64_t total_events = 0;
    std::int64_t first_bad_seq = 0; // 0 when ok
    std::string problem;            // what is wrong with the first bad event
    std::string head_hash;          // hex of the last good event's hash
};

// `progress(done, total)` is called now and then for long journals.
using VerifyProgress = std::function<void(std::int64_t done, std::int64_t total)>;

Result<VerifyReport> verify_chain(const std::string &path, const VerifyProgress &progress = {});

} // namespace knod::journal
