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

// The first `max_bytes` + 1 bytes of the regular file at `path` (one byte more than the cap, so
// the caller can tell a file over it). Opened without blocking (O_NONBLOCK: a FIFO would wait for
// a writer at open) and refused unless regular; a failed read is Errc::io.
inline Result<std::string> read_regular_file(const std::string &path, std::size_t max_bytes) {
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (!fd.valid()) return make_error(Errc::io, path + ": " + std::strerror(errno));
    if (auto r = require_regular(fd.get(), path); !r) return r.error();
    std::string text(max_bytes + 1, '\0');
    std::size_t got = 0;
    while (got < text.size()) {
        ssize_t n = read(fd.get(), text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error(Errc::io, path + ": read failed: " + std::strerror(errno));
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
    }
    text.resize(got);
    return text;
}

} // namespace knod
