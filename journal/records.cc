#include "journal/records.h"

#include "knod/hex.h"
#include "knod/system_error.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace knod::journal {
namespace {

void put_field(std::string &out, const std::optional<std::string> &v) {
    if (!v) {
        out.push_back('\0');
        return;
    }
    out.push_back('\1');
    std::uint64_t n = v->size();
    for (int shift = 56; shift >= 0; shift -= 8)
        out.push_back(static_cast<char>((n >> shift) & 0xff));
    out += *v;
}

std::optional<std::string> text(const std::optional<std::int64_t> &v) {
    return v ? std::optional<std::string>(std::to_string(*v)) : std::nullopt;
}

} // namespace

std::string canonical_encoding(std::int64_t seq, const Event &e) {
    std::string out = "knod-journal-event-v1";
    put_field(out, std::to_string(seq));
    put_field(out, std::to_string(e.at_us));
    put_field(out, e.kind);
    put_field(out, e.session_id);
    put_field(out, text(e.uid));
    put_field(out, text(e.pid));
    put_field(out, e.rule);
    put_field(out, e.decision);
    put_field(out, e.reason);
    put_field(out, e.detail);
    return out;
}

Hash chain_hash(const Hash &prev, std::int64_t seq, const Event &e) {
    std::string data(reinterpret_cast<const char *>(prev.data()), prev.size());
    data += canonical_encoding(seq, e);
    Hash out{};
    unsigned int len = 0;
    EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
    return out;
}

std::string to_hex(const Hash &h) {
    return knod::to_hex(h);
}

std::string anchor_path(const std::string &journal_path) {
    return journal_path + ".anchor";
}

Result<void> write_anchor_file(const std::string &path, const std::string &text, mode_t mode) {
    std::string tmp = path + ".XXXXXX";
    int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    if (fd < 0) return system_error(Errc::io, errno, "write the anchor " + path);
    (void)::fchmod(fd, mode); // mkostemp makes 0600
    ssize_t n = ::write(fd, text.data(), text.size());
    int write_err = n < 0 ? errno : ENOSPC; // a short write of a few bytes: the disk is full
    bool written = n == static_cast<ssize_t>(text.size());
    if (::close(fd) != 0 && written) {
        written = false;
        write_err = errno;
    }
    if (!written) {
        ::unlink(tmp.c_str());
        return system_error(Errc::io, write_err, "write the anchor " + path);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        return system_error(Errc::io, err, "rename the anchor into place " + path);
    }
    return {};
}

std::int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

} // namespace knod::journal
