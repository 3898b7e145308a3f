// A small std::expected stand-in: g++ 12's libstdc++ has no <expected>.
// Errors carry a code a caller can branch on and a message a person can act on.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace knod {

enum class Errc {
    invalid_argument,
    not_found,
    denied,
    io,
    corrupt,
    unsupported,
    expired,
    revoked,
    wrong_holder,
    wrong_region,
    bad_key,
    too_new,
    unavailable,
    quota_exceeded,
    isolation_violation,
    driver_failure,
    journal_unavailable,
    invalid_policy,
    flow_conflict,    // a requested flow overlaps a live or in-flight binding's on the same NIC
    limits_exceeded,  // a bound on what the daemon keeps for callers (docs/threat-model.md)
    out_of_resources, // fds, memory, disk: knod/system_error.h names which; retry once it is back
};

struct Error {
    Errc code;
    std::string message;

    // Prefixes context while the error travels upward: "open journal: disk full".
    Error context(const std::string &what) const & { return {code, what + ": " + message}; }
    Error context(const std::string &what) && { return {code, what + ": " + std::move(message)}; }
};

inline Error make_error(Errc code, std::string message) {
    return {code, std::move(message)};
}

template <typename T> class [[nodiscard]] Result {
  public:
    Result(T value) : v_(std::move(value)) {}
    Result(Error error) : v_(std::move(error)) {}

    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T &value() & { return std::get<0>(v_); }
    const T &value() const & { return std::get<0>(v_); }
    T &&value() && { return std::get<0>(std::move(v_)); }
    T &operator*() & { return value(); }
    const T &operator*() const & { return value(); }
    T *operator->() { return &value(); }
    const T *operator->() const { return &value(); }

    const Error &error() const & { return std::get<1>(v_); }
    Error &&error() && { return std::get<1>(std::move(v_)); }

  private:
    std::variant<T, Error> v_;
};

template <> class [[nodiscard]] Result<void> {
  public:
    Result() = default;
    Result(Error error) : err_(std::move(error)), failed_(true) {}

    bool ok() const { return !failed_; }
    explicit operator bool() const { return ok(); }
    const Error &error() const & { return err_; }
    Error &&error() && { return std::move(err_); }

  private:
    Error err_{Errc::io, {}};
    bool failed_ = false;
};

} // namespace knod
