// libknod-client for C++ (C++17): RAII handles over the C API in knod/client.h, header-only,
// no exceptions. Every call returns a knod::sdk::Result: a value, or an Error with the code,
// the message, the D-Bus error name and, for a policy refusal, the deciding rule.
//
//   auto client = knod::sdk::Client::connect();            // the system bus
//   auto b = client->register_buffer("knodsim0", "sim0", fd, 0, 4096,
//                                    {"udp 10.99.0.0/24:* -> 10.99.0.2:5000"});
//   if (!b) std::cerr << b.error().message() << " (rule " << b.error().rule() << ")\n";
//   auto rx = b->wait_for_data(0, 100);                     // RxBytes, or Error
//   // b's destructor releases the binding
#ifndef KNOD_CLIENT_HPP
#define KNOD_CLIENT_HPP

#include "knod/client.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace knod::sdk {

class Error {
  public:
    explicit Error(knod_error *e) : e_(e, &knod_error_free) {}
    // KNOD_ERR_LIMITS_EXCEEDED: the daemon keeps as much as it will for callers; retry later.
    knod_errc code() const { return e_ ? knod_error_code(e_.get()) : KNOD_ERR_NO_MEMORY; }
    std::string message() const { return e_ ? knod_error_message(e_.get()) : "out of memory"; }
    // "" when the error did not come over the bus.
    std::string dbus_name() const { return text(e_ ? knod_error_dbus_name(e_.get()) : nullptr); }
    // "" when no rule decided.
    std::string rule() const { return text(e_ ? knod_error_rule(e_.get()) : nullptr); }

  private:
    static std::string text(const char *s) { return s ? s : ""; }
    std::shared_ptr<knod_error> e_;
};

template <typename T> class Result {
  public:
    Result(T value) : v_(std::move(value)) {}
    Result(Error error) : v_(std::move(error)) {}
    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }
    T &operator*() { return std::get<0>(v_); }
    T *operator->() { return &std::get<0>(v_); }
    const Error &error() const { return std::get<1>(v_); }

  private:
    std::variant<T, Error> v_;
};

struct Counters {
    std::uint64_t rx_bytes = 0;
    std::uint64_t rx_packets = 0;
    std::uint64_t dropped_packets = 0;
};

struct End {
    std::string reason; // "release", "expire", "revoke: <reason>", "process-exit", ...
    bool revoked = false;
};

class Binding {
  public:
    explicit Binding(knod_binding *b) : b_(b, &knod_binding_free) {}
    std::string id() const { return knod_binding_id(b_.get()); }
    std::string key_id() const { return knod_binding_key_id(b_.get()); }
    std::string rule() const { return knod_binding_rule(b_.get()); }
    std::uint64_t length() const { return knod_binding_length(b_.get()); }

    Result<bool> activate() {
        knod_error *e = nullptr;
        if (knod_binding_activate(b_.get(), &e) != KNOD_OK) return Error(e);
        return true;
    }
    // RxBytes once it passes `seen`; Error KNOD_ERR_TIMEOUT after `timeout_ms`.
    Result<std::uint64_t> wait_for_data(std::uint64_t seen, int timeout_ms) {
        knod_error *e = nullptr;
        std::uint64_t rx = 0;
        if (knod_binding_wait_for_data(b_.get(), seen, timeout_ms, &rx, &e) != KNOD_OK)
            return Error(e);
        return rx;
    }
    Result<Counters> counters() {
        knod_error *e = nullptr;
        Counters c;
        if (knod_binding_counters(b_.get(), &c.rx_bytes, &c.rx_packets, &c.dropped_packets, &e) !=
            KNOD_OK)
            return Error(e);
        return c;
    }
    // The new expiry, microseconds since the epoch.
    Result<std::uint64_t> renew() {
        knod_error *e = nullptr;
        std::uint64_t until = 0;
        if (knod_binding_renew(b_.get(), &until, &e) != KNOD_OK) return Error(e);
        return until;
    }
    // Tags the binding with its holder's job, group and rank (knod_binding_set_job), once.
    Result<bool> set_job(const std::string &job, const std::string &group = {},
                         std::uint32_t rank = 0) {
        knod_error *e = nullptr;
        if (knod_binding_set_job(b_.get(), job.c_str(), group.c_str(), rank, &e) != KNOD_OK)
            return Error(e);
        return true;
    }
    Result<bool> release() {
        knod_error *e = nullptr;
        if (knod_binding_release(b_.get(), &e) != KNOD_OK) return Error(e);
        return true;
    }
    // nullopt while the binding lives.
    Result<std::optional<End>> end() {
        knod_error *e = nullptr;
        int ended = 0, revoked = 0;
        const char *reason = nullptr;
        if (knod_binding_end(b_.get(), &ended, &reason, &revoked, &e) != KNOD_OK) return Error(e);
        if (!ended) return std::optional<End>();
        return std::optional<End>(End{reason ? reason : "", revoked != 0});
    }

  private:
    std::unique_ptr<knod_binding, void (*)(knod_binding *)> b_;
};

class Client {
  public:
    // "" : the system bus (DBUS_SYSTEM_BUS_ADDRESS is honoured).
    static Result<Client> connect(const std::string &address = {}) {
        knod_client *c = nullptr;
        knod_error *e = nullptr;
        if (knod_client_connect(address.c_str(), &c, &e) != KNOD_OK) return Error(e);
        return Client(c);
    }
    // Granted, not yet active (Binding::activate()).
    Result<Binding> request_binding(const std::string &netdev, const std::string &gpu,
                                    const std::string &mode, int region_fd, std::uint64_t offset,
                                    std::uint64_t length, const std::vector<std::string> &flows) {
        auto f = c_strings(flows);
        knod_binding *b = nullptr;
        knod_error *e = nullptr;
        if (knod_request_binding(c_.get(), netdev.c_str(), gpu.c_str(), mode.c_str(), region_fd,
                                 offset, length, f.data(), f.size(), &b, &e) != KNOD_OK)
            return Error(e);
        return Binding(b);
    }
    // The article's register_buffer: granted and activated.
    Result<Binding> register_buffer(const std::string &netdev, const std::string &gpu,
                                    int region_fd, std::uint64_t offset, std::uint64_t length,
                                    const std::vector<std::string> &flows) {
        auto f = c_strings(flows);
        knod_binding *b = nullptr;
        knod_error *e = nullptr;
        if (knod_register_buffer(c_.get(), netdev.c_str(), gpu.c_str(), region_fd, offset, length,
                                 f.data(), f.size(), &b, &e) != KNOD_OK)
            return Error(e);
        return Binding(b);
    }

  private:
    explicit Client(knod_client *c) : c_(c, &knod_client_unref) {}
    static std::vector<const char *> c_strings(const std::vector<std::string> &v) {
        std::vector<const char *> out;
        for (auto &s : v)
            out.push_back(s.c_str());
        return out;
    }
    std::unique_ptr<knod_client, void (*)(knod_client *)> c_;
};

} // namespace knod::sdk

#endif // KNOD_CLIENT_HPP
