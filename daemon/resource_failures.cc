#include "daemon/resource_failures.h"

#include "knod/untrusted.h"

#include <iostream>

namespace knod::daemon {

ResourceFailures &ResourceFailures::instance() {
    static ResourceFailures failures;
    return failures;
}

void ResourceFailures::note(const Error &e) {
    if (e.code != Errc::out_of_resources) return;
    std::lock_guard lock(mu_);
    ++count_;
    last_ = e.message;
    auto now = std::chrono::steady_clock::now();
    if (count_ > 1 && now - logged_ < std::chrono::seconds(10)) {
        ++unlogged_;
        return;
    }
    std::cerr << "knod-policyd: out of resources: "
              << escape_untrusted(e.message, Escape::message, 512);
    if (unlogged_) std::cerr << " (and " << unlogged_ << " more since the last line)";
    std::cerr << std::endl;
    unlogged_ = 0;
    logged_ = now;
}

std::uint64_t ResourceFailures::count() const {
    std::lock_guard lock(mu_);
    return count_;
}

std::string ResourceFailures::last() const {
    std::lock_guard lock(mu_);
    return last_;
}

} // namespace knod::daemon
