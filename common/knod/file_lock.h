// An exclusive, non-blocking flock(2) held for an object's lifetime: one daemon per state dir,
// one sim network per netdev name. The kernel drops it when the process dies, so a crash never
// leaves a stale lock behind.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace knod {

class FileLock {
  public:
    // Locks `path` (a directory is locked as it is; a file is made, mode 0600, if absent, and
    // must be this process's own, tightened to 0600 if it was wider; a symlink is never
    // followed). Errc::unavailable when another process holds the lock.
    static Result<FileLock> acquire(const std::string &path, bool directory) {
        int flags =
            O_CLOEXEC | O_NOFOLLOW | (directory ? O_RDONLY | O_DIRECTORY : O_RDWR | O_CREAT);
        UniqueFd fd(::open(path.c_str(), flags, 0600));
        if (!fd.valid())
            return make_error(Errc::io,
                              "cannot open " + path + " to lock it: " + std::strerror(errno));
        if (!directory) {
            // Only its owner may open a lock file: whoever can open it can hold it.
            struct stat st {};
            if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
                return make_error(Errc::io, path + " is not a regular file; remove it");
            if (st.st_uid != ::geteuid())
                return make_error(Errc::denied, path + " belongs to uid " +
                                                    std::to_string(st.st_uid) +
                                                    ", not to this process; remove it");
            if ((st.st_mode & 077) != 0 && ::fchmod(fd.get(), 0600) != 0)
                return make_error(Errc::io,
                                  "cannot chmod 0600 " + path + ": " + std::strerror(errno));
        }
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
