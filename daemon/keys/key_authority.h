// The access-key authority. A key is 32 bytes from OpenSSL's CSPRNG with a public id; the
// authority keeps only HMAC-SHA256(secret, id || key) and what the key is bound to: one binding,
// one holder process, one region, one expiry. Verification checks all of them and compares the
// MAC in constant time. Revocation and expiry are final: the key's entry is forgotten at once.
#pragma once

#include "knod/boot_clock.h"
#include "knod/result.h"

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace knod::keys {

// Lifetimes run on CLOCK_BOOTTIME: a step of the wall clock neither ends a key early nor
// extends it (#33 item 7).
using Clock = knod::BootClock;
constexpr std::size_t key_size = 32;
using KeyBytes = std::array<std::uint8_t, key_size>;

// A process, named so that a recycled pid does not pass for it: pid plus start time (clock
// ticks since boot, /proc/PID/stat field 22, read through a pidfd-pinned pid).
struct Holder {
    pid_t pid = 0;
    std::uint64_t start_time = 0;
    friend bool operator==(const Holder &, const Holder &) = default;
};

// The identity of a VRAM region: the file behind the fd (device, inode) and the window on it.
struct Region {
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    friend bool operator==(const Region &, const Region &) = default;
};

struct Grant {
    std::string binding_id;
    Holder holder;
    Region region;
    Clock::time_point expires;
};

struct IssuedKey {
    std::string key_id;
    KeyBytes key; // handed to the holder once, never stored
};

class KeyAuthority {
  public:
    // Loads the daemon secret from `secret_path`, creating it (0600, atomically) if absent.
    // Refuses a secret file that others may read or that has the wrong size.
    static Result<KeyAuthority> open(const std::string &secret_path);
    // For tests and tools that need no persistent secret.
    static Result<KeyAuthority> with_secret(std::span<const std::uint8_t> secret);

    Result<IssuedKey> issue(const Grant &grant);
    // Succeeds only for the right bytes, presented by the holder, for the bound region, before
    // expiry, while not revoked.
    Result<void> verify(const std::string &key_id, std::span<const std::uint8_t> key,
                        const Holder &presenter, const Region &region,
                        Clock::time_point now = Clock::now()) const;
    // Final: the key is forgotten at once and never verifies again (Errc::not_found). Unknown
    // ids are not an error (already gone).
    void revoke(const std::string &key_id);
    // Moves a live key's expiry (Binding.Renew). Errc::not_found for an unknown, expired or
    // revoked key.
    Result<void> extend(const std::string &key_id, Clock::time_point expires);
    // Forgets keys that expired before `now`; returns their ids so the caller can end bindings.
    std::vector<std::string> expire(Clock::time_point now = Clock::now());

    // A daemon restart that keeps its bindings (systemd's fd store) carries each live key over:
    // its MAC (never the key, which the daemon does not keep) and its grant. The MAC is only
    // good with this authority's secret, which stays in the state dir.
    struct Carried {
        std::array<std::uint8_t, 32> mac;
        Grant grant;
    };
    Result<Carried> carry(const std::string &key_id) const;
    // Takes a carried key back; refuses an id already held, and an empty id or one with a NUL
    // (issued ids are "k-" and hex; seal()'s inputs start with a NUL, so the two never meet).
    Result<void> restore(const std::string &key_id, const Carried &carried);

    // A MAC under the secret for state the daemon writes and reads back (the restart handoff):
    // HMAC(secret, 0 || purpose || 0 || message). The leading NUL keeps it apart from key MACs
    // (HMAC(secret, key_id || 0 || key), key ids never empty nor starting with NUL); `purpose`
    // (no NUL) keeps one use's MAC from passing for another's.
    std::array<std::uint8_t, 32> seal(std::string_view purpose, std::string_view message) const;
    // True when `mac` is seal(purpose, message), compared in constant time.
    bool sealed(std::string_view purpose, std::string_view message,
                std::span<const std::uint8_t> mac) const;

    // How many keys are held (issued, neither revoked nor expired).
    std::size_t size() const { return entries_.size(); }

  private:
    struct Entry {
        std::array<std::uint8_t, 32> mac;
        Grant grant;
    };
    explicit KeyAuthority(std::array<std::uint8_t, 32> secret);
    std::array<std::uint8_t, 32> mac(const std::string &key_id,
                                     std::span<const std::uint8_t> key) const;
    // HMAC(secret, the parts one after another).
    std::array<std::uint8_t, 32> hmac(std::initializer_list<std::string_view> parts) const;

    std::array<std::uint8_t, 32> secret_;
    // An HMAC-SHA256 context keyed with the secret once (an EVP_MAC_CTX; null if OpenSSL could
    // not make one, then each MAC is computed from scratch): each MAC starts from a copy of it,
    // so no call fetches the algorithm or hashes the key again.
    std::shared_ptr<void> keyed_;
    std::map<std::string, Entry> entries_;
};

} // namespace knod::keys
