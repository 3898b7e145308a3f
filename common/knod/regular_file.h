// Reading a file named by a person or a caller, which may be anything: a FIFO (a read blocks
// until someone writes), a device, a directory, /proc/self/mem (reads fail with EIO). Only a
// regular file is read, and a read error is an error, never an empty file.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

namespace knod {

// What kind of file `mode` is, for an error message ("a FIFO").
inline const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "not a regular file";
}

// Fails with Errc::invalid_argument unless `fd` is a regular file.
inline Result<void> require_regular(int fd, const std::string &path) {
    struct stat st {};
    if (fstat(fd, &st) != 0) return make_error(Errc::io, path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        return make_error(Errc::invalid_argument,
                          path + " is " + file_kind(st.st_mode) + ", not a regular file");
    return {};
}

// Up to `max_bytes` + 1 bytes from `fd` (one more than the cap, so the caller can tell a file
// over it); a failed read is Errc::io naming `path`. `mid_read` runs after each read (tests).
inline Result<std::string> read_up_to(int fd, const std::string &path, std::size_t max_bytes,
                                      const std::function<void()> &mid_read = {}) {
    std::string text(max_bytes + 1, '\0');
    std::size_t got = 0;
    while (got < text.size()) {
        ssize_t n = read(fd, text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error(Errc::io, path + ": read failed: " + std::strerror(errno));
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
        if (mid_read) mid_read();
    }
    text.resize(got);
    return text;
}

// The first `max_bytes` + 1 bytes of the regular file at `path` (one byte more than the cap, so
// the caller can tell a file over it). Opened without blocking (O_NONBLOCK: a FIFO would wait for
// a writer at open) and refused unless regular; a failed read is Errc::io.
inline Result<std::string> read_regular_file(const std::string &path, std::size_t max_bytes) {
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (!fd.valid()) return make_error(Errc::io, path + ": " + std::strerror(errno));
    if (auto r = require_regular(fd.get(), path); !r) return r.error();
    return read_up_to(fd.get(), path, max_bytes);
}

// Whether the file behind `fd` is still the one `before` described: same inode, size and
// modification and change times. A save that rewrites a file in place (truncate, then write)
// moves at least the mtime; a save by rename gives the path a new inode.
inline bool same_file_state(const struct stat &a, const struct stat &b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
           a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
           a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// As read_regular_file(), for a file someone may be saving while it is read (a policy file
// during a config tool's run): the bytes are returned only if the file did not change while
// they were read (inode, size, mtime and ctime the same before and after, the same inode still
// at `path`, and as many bytes as its size). Otherwise Errc::unavailable, naming what moved: the
// caller refuses what it was about to load and keeps what it had. `mid_read`, for tests, runs
// after the first read, where a concurrent save would land.
inline Result<std::string> read_regular_file_unchanged(const std::string &path,
                                                       std::size_t max_bytes,
                                                       const std::function<void()> &mid_read = {}) {
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (!fd.valid()) return make_error(Errc::io, path + ": " + std::strerror(errno));
    if (auto r = require_regular(fd.get(), path); !r) return r.error();
    struct stat before {
    }, after{}, now_at_path{};
    if (fstat(fd.get(), &before) != 0)
        return make_error(Errc::io, path + ": " + std::strerror(errno));
    auto text = read_up_to(fd.get(), path, max_bytes, mid_read);
    if (!text) return text;
    std::size_t got = text->size();
    if (fstat(fd.get(), &after) != 0)
        return make_error(Errc::io, path + ": " + std::strerror(errno));
    const char *moved = nullptr;
    if (!same_file_state(before, after))
        moved = "it changed while it was read (size or modification time moved)";
    else if (stat(path.c_str(), &now_at_path) != 0 || now_at_path.st_dev != before.st_dev ||
             now_at_path.st_ino != before.st_ino)
        moved = "it was replaced while it was read (the path names another file now)";
    else if (got <= max_bytes && static_cast<off_t>(got) != before.st_size)
        moved = "it changed while it was read (fewer or more bytes than its size)";
    if (moved)
        return make_error(Errc::unavailable,
                          path + ": " + moved + "; not loaded (read it again once it is saved)");
    return text;
}

} // namespace knod
