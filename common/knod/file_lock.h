// An exclusive, non-blocking flock(2) held for an object's lifetime: one daemon per state dir,
// one sim network per netdev name. The kernel drops it when the process dies, so a crash never
// leaves a stale lock behind.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <fcntl.h>
#include <sys/file.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace knod {

class FileLock {
  public:
    // Locks `path` (a directory is locked as it is; a file is made, mode 0600, if absent; a
    // symlink is never followed). Errc::unavailable when another process holds the lock.
    static Result<FileLock> acquire(const std::string &path, bool directory) {
        int flags =
            O_CLOEXEC | O_NOFOLLOW | (directory ? O_RDONLY | O_DIRECTORY : O_RDWR | O_CREAT);
        UniqueFd fd(::open(path.c_str(), flags, 0600));
        if (!fd.valid())
            return make_error(Errc::io,
                              "cannot open " + path + " to lock it: " + std::strerror(errno));
        if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0)
            return make_error(errno == EWOULDBLOCK ? Errc::unavailable : Errc::io,
                              "cannot lock " + path + ": " + std::strerror(errno));
        return FileLock(std::move(fd));
    }

  private:
    explicit FileLock(UniqueFd fd) : fd_(std::move(fd)) {}
    UniqueFd fd_;
};

} // namespace knod
