#include "daemon/keys/key_authority.h"

#include "knod/hex.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace knod::keys {
namespace {

std::string errno_text() {
    return std::strerror(errno);
}

class Fd {
  public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    int get() const { return fd_; }

  private:
    int fd_;
};

Result<std::array<std::uint8_t, 32>> read_secret(const std::string &path) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) return make_error(Errc::io, "open " + path + ": " + errno_text());
    struct stat st {};
    if (fstat(fd.get(), &st) != 0)
        return make_error(Errc::io, "stat " + path + ": " + errno_text());
    if (!S_ISREG(st.st_mode)) return make_error(Errc::corrupt, path + " is not a regular file");
    if ((st.st_mode & 077) != 0)
        return make_error(Errc::denied, path + " is readable by others (mode " +
                                            std::to_string(st.st_mode & 0777) +
                                            "); the key secret must be 0600");
    if (st.st_uid != geteuid())
        return make_error(Errc::denied, path + " is not owned by the daemon's user");
    std::array<std::uint8_t, 32> secret{};
    ssize_t n = ::read(fd.get(), secret.data(), secret.size() + 0);
    char extra = 0;
    if (n != static_cast<ssize_t>(secret.size()) || ::read(fd.get(), &extra, 1) != 0)
        return make_error(Errc::corrupt, path + " must hold exactly 32 bytes");
    return secret;
}

// Writes a fresh secret to a temporary file and links it into place, so that a crash never
// leaves a half-written secret and two starters never both win.
Result<std::array<std::uint8_t, 32>> create_secret(const std::string &path) {
    std::array<std::uint8_t, 32> secret{};
    if (RAND_bytes(secret.data(), static_cast<int>(secret.size())) != 1)
        return make_error(Errc::unavailable, "OpenSSL RAND_bytes failed");
    std::string dir =
        path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
    if (dir.empty()) dir = ".";
    Fd fd(::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
    if (fd.get() < 0) return make_error(Errc::io, "create secret in " + dir + ": " + errno_text());
    if (::write(fd.get(), secret.data(), secret.size()) != static_cast<ssize_t>(secret.size()) ||
        ::fsync(fd.get()) != 0)
        return make_error(Errc::io, "write " + path + ": " + errno_text());
    std::string proc = "/proc/self/fd/" + std::to_string(fd.get());
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
        if (errno == EEXIST) return read_secret(path); // another starter won the race
        return make_error(Errc::io, "link " + path + ": " + errno_text());
    }
    Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dirfd.get() >= 0) ::fsync(dirfd.get());
    return secret;
}

} // namespace

Result<KeyAuthority> KeyAuthority::open(const std::string &secret_path) {
    auto secret = access(secret_path.c_str(), F_OK) == 0 ? read_secret(secret_path)
                                                         : create_secret(secret_path);
    if (!secret) return std::move(secret).error().context("key secret");
    return KeyAuthority(*secret);
}

Result<KeyAuthority> KeyAuthority::with_secret(std::span<const std::uint8_t> secret) {
    if (secret.size() != 32) return make_error(Errc::invalid_argument, "secret must be 32 bytes");
    std::array<std::uint8_t, 32> s{};
    std::memcpy(s.data(), secret.data(), s.size());
    return KeyAuthority(s);
}

KeyAuthority::KeyAuthority(std::array<std::uint8_t, 32> secret) : secret_(secret) {
    EVP_MAC *hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    EVP_MAC_CTX *ctx = hmac ? EVP_MAC_CTX_new(hmac) : nullptr;
    EVP_MAC_free(hmac); // the context holds its own reference
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                           OSSL_PARAM_construct_end()};
    if (ctx && EVP_MAC_init(ctx, secret_.data(), secret_.size(), params) == 1)
        keyed_.reset(ctx, [](void *c) { EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX *>(c)); });
    else
        EVP_MAC_CTX_free(ctx);
}

std::array<std::uint8_t, 32>
KeyAuthority::hmac(std::initializer_list<std::string_view> parts) const {
    std::array<std::uint8_t, 32> out{};
    if (EVP_MAC_CTX *ctx =
            keyed_ ? EVP_MAC_CTX_dup(static_cast<EVP_MAC_CTX *>(keyed_.get())) : nullptr) {
        std::size_t len = 0;
        bool ok = true;
        for (auto part : parts)
            ok = ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char *>(part.data()),
                                      part.size()) == 1;
        ok = ok && EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == out.size();
        EVP_MAC_CTX_free(ctx); // cleanses its state
        if (ok) return out;
    }
    std::string message;
    for (auto part : parts)
        message.append(part);
    unsigned int len = 0;
    HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
         reinterpret_cast<const unsigned char *>(message.data()), message.size(), out.data(), &len);
    OPENSSL_cleanse(message.data(), message.size());
    return out;
}

std::array<std::uint8_t, 32> KeyAuthority::mac(const std::string &key_id,
                                               std::span<const std::uint8_t> key) const {
    // The id is inside the MAC so that a stored MAC cannot be moved to another key id:
    // HMAC(secret, key_id || 0 || key).
    return hmac({key_id,
                 std::string_view("\0", 1),
                 {reinterpret_cast<const char *>(key.data()), key.size()}});
}

std::array<std::uint8_t, 32> KeyAuthority::seal(std::string_view purpose,
                                                std::string_view message) const {
    const std::string_view nul("\0", 1);
    return hmac({nul, purpose, nul, message});
}

bool KeyAuthority::sealed(std::string_view purpose, std::string_view message,
                          std::span<const std::uint8_t> mac_bytes) const {
    auto want = seal(purpose, message);
    return mac_bytes.size() == want.size() &&
           CRYPTO_memcmp(want.data(), mac_bytes.data(), want.size()) == 0;
}

Result<IssuedKey> KeyAuthority::issue(const Grant &grant) {
    IssuedKey issued{};
    std::array<std::uint8_t, 12> id_bytes{};
    if (RAND_bytes(issued.key.data(), static_cast<int>(issued.key.size())) != 1 ||
        RAND_bytes(id_bytes.data(), static_cast<int>(id_bytes.size())) != 1)
        return make_error(Errc::unavailable, "OpenSSL RAND_bytes failed");
    issued.key_id = "k-" + to_hex(id_bytes);
    entries_[issued.key_id] = Entry{mac(issued.key_id, issued.key), grant};
    return issued;
}

Result<void> KeyAuthority::verify(const std::string &key_id, std::span<const std::uint8_t> key,
                                  const Holder &presenter, const Region &region,
                                  Clock::time_point now) const {
    auto it = entries_.find(key_id);
    if (it == entries_.end())
        return make_error(Errc::not_found, "unknown key id " + key_id +
                                               " (revoked, released, expired or never issued)");
    const Entry &e = it->second;
    // The MAC first and always, so the time taken does not say which check failed for bad bytes.
    bool bytes_ok = key.size() == key_size &&
                    CRYPTO_memcmp(mac(key_id, key).data(), e.mac.data(), e.mac.size()) == 0;
    if (!bytes_ok) return make_error(Errc::bad_key, "key does not match key id " + key_id);
    if (now >= e.grant.expires) return make_error(Errc::expired, "key " + key_id + " has expired");
    if (!(presenter == e.grant.holder))
        return make_error(Errc::wrong_holder, "key " + key_id + " belongs to another process");
    if (!(region == e.grant.region))
        return make_error(Errc::wrong_region, "key " + key_id + " is bound to another region");
    return {};
}

void KeyAuthority::revoke(const std::string &key_id) {
    // Forgotten at once: ids are random and never reissued, so an unknown id is as final as a
    // revoked one, and churn cannot grow memory until the keys' expiry.
    if (auto it = entries_.find(key_id); it != entries_.end()) {
        OPENSSL_cleanse(it->second.mac.data(), it->second.mac.size());
        entries_.erase(it);
    }
}

Result<void> KeyAuthority::extend(const std::string &key_id, Clock::time_point expires) {
    auto it = entries_.find(key_id);
    // Revoked keys leave at once, so an unknown key is also a revoked or released one.
    if (it == entries_.end())
        return make_error(Errc::not_found, "no live key " + key_id + " (revoked or expired)");
    it->second.grant.expires = expires;
    return {};
}

Result<KeyAuthority::Carried> KeyAuthority::carry(const std::string &key_id) const {
    auto it = entries_.find(key_id);
    if (it == entries_.end()) return make_error(Errc::not_found, "no live key " + key_id);
    return Carried{it->second.mac, it->second.grant};
}

Result<void> KeyAuthority::restore(const std::string &key_id, const Carried &carried) {
    if (key_id.empty() || key_id.find('\0') != std::string::npos)
        return make_error(Errc::invalid_argument, "a key id is never empty nor holds a NUL");
    if (entries_.count(key_id))
        return make_error(Errc::invalid_argument, "key " + key_id + " is already held");
    entries_.emplace(key_id, Entry{carried.mac, carried.grant});
    return {};
}

std::vector<std::string> KeyAuthority::expire(Clock::time_point now) {
    std::vector<std::string> gone;
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (now >= it->second.grant.expires) {
            gone.push_back(it->first);
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    return gone;
}

} // namespace knod::keys
