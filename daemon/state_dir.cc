#include "daemon/state_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace knod::daemon {
namespace {

std::string octal(mode_t mode) {
    std::ostringstream s;
    s << std::oct << (mode & 07777);
    return "0" + s.str();
}

std::string user_name(uid_t uid) {
    if (struct passwd *pw = getpwuid(uid)) return pw->pw_name;
    return std::to_string(uid);
}

} // namespace

Result<void> prepare_state_dir(const std::string &dir) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        return make_error(Errc::io,
                          "cannot create the state dir " + dir + ": " + std::strerror(errno));
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0)
        return make_error(Errc::io, "state dir " + dir + ": " + std::strerror(errno));
    std::string me = user_name(::geteuid());
    if (S_ISLNK(st.st_mode))
        return make_error(Errc::denied, "the state dir " + dir +
                                            " is a symbolic link; give --state-dir the real "
                                            "directory");
    if (!S_ISDIR(st.st_mode))
        return make_error(Errc::denied, "the state dir " + dir + " is not a directory");
    if (st.st_uid != ::geteuid())
        return make_error(Errc::denied, "the state dir " + dir + " belongs to " +
                                            user_name(st.st_uid) + ", not to the daemon's user " +
                                            me + "; fix: chown -R " + me + " " + dir +
                                            " (or use another --state-dir)");
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return make_error(Errc::denied, "the state dir " + dir + " is writable by others (mode " +
                                            octal(st.st_mode) + "); fix: chmod 0700 " + dir);
    return {};
}

Result<std::vector<std::string>> check_state_files(const std::string &dir,
                                                   const std::vector<std::string> &names,
                                                   const std::string &create_name) {
    std::vector<std::string> notes;
    if (!create_name.empty()) {
        std::string path = dir + "/" + create_name;
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0)
            ::close(fd);
        else if (errno != EEXIST)
            return make_error(Errc::io, "cannot create " + path + ": " + std::strerror(errno));
    }
    for (const auto &name : names) {
        std::string path = dir + "/" + name;
        // O_PATH|O_NOFOLLOW: a link is opened as itself and refused below; nothing is read.
        int fd = ::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) continue;
            return make_error(Errc::io, "cannot open " + path + ": " + std::strerror(errno));
        }
        struct stat st {};
        int rc = ::fstat(fd, &st);
        auto close_fd = [fd] { ::close(fd); };
        if (rc != 0) {
            close_fd();
            return make_error(Errc::io, "stat " + path + ": " + std::strerror(errno));
        }
        if (!S_ISREG(st.st_mode)) {
            close_fd();
            return make_error(Errc::denied, path + " is not a regular file (a link or other); "
                                                   "remove it");
        }
        if (st.st_uid != ::geteuid()) {
            close_fd();
            return make_error(Errc::denied, path + " belongs to " + user_name(st.st_uid) +
                                                ", not to the daemon's user " +
                                                user_name(::geteuid()) +
                                                "; it was not made by this daemon: move it away");
        }
        if ((st.st_mode & 077) != 0) {
            // fchmod does not work on O_PATH descriptors: go through /proc/self/fd, which
            // names this very file (no path lookup to race).
            std::string self = "/proc/self/fd/" + std::to_string(fd);
            if (::chmod(self.c_str(), 0600) != 0) {
                int e = errno;
                close_fd();
                return make_error(Errc::io,
                                  path + " has mode " + octal(st.st_mode) +
                                      " and cannot be tightened to 0600: " + std::strerror(e));
            }
            notes.push_back(path + " had mode " + octal(st.st_mode) + "; tightened to 0600");
        }
        close_fd();
    }
    return notes;
}

} // namespace knod::daemon
