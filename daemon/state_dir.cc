#include "daemon/state_dir.h"

#include <fcntl.h>
#include <grp.h>
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

std::string group_name(gid_t gid) {
    if (struct group *gr = getgrgid(gid)) return gr->gr_name;
    return std::to_string(gid);
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
                                                   const std::vector<StateFile> &files,
                                                   const std::string &create_name) {
    std::vector<std::string> notes;
    struct stat dir_st {};
    if (::stat(dir.c_str(), &dir_st) != 0)
        return make_error(Errc::io, "state dir " + dir + ": " + std::strerror(errno));
    for (const auto &file : files) {
        if (file.name != create_name) continue;
        std::string path = dir + "/" + file.name;
        int fd =
            ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file.mode);
        if (fd >= 0)
            ::close(fd);
        else if (errno != EEXIST)
            return make_error(Errc::io, "cannot create " + path + ": " + std::strerror(errno));
    }
    for (const auto &file : files) {
        std::string path = dir + "/" + file.name;
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
        // fchmod does not work on O_PATH descriptors: go through /proc/self/fd, which names
        // this very file (no path lookup to race).
        std::string self = "/proc/self/fd/" + std::to_string(fd);
        if ((st.st_mode & 0777 & ~file.mode) != 0) {
            mode_t tight = st.st_mode & file.mode & 0777;
            if (::chmod(self.c_str(), tight) != 0) {
                int e = errno;
                close_fd();
                return make_error(Errc::io, path + " has mode " + octal(st.st_mode) +
                                                " and cannot be tightened to " + octal(tight) +
                                                ": " + std::strerror(e));
            }
            notes.push_back(path + " had mode " + octal(st.st_mode) + "; tightened to " +
                            octal(tight));
        }
        // The auditors read the journal through the dir's group: a file of another group (made
        // before the dir was given to them) is moved to it. Root, or a member, may.
        bool group_reads = (dir_st.st_mode & S_IRGRP) && (file.mode & S_IRGRP);
        if (group_reads && st.st_gid != dir_st.st_gid &&
            ::fchownat(fd, "", static_cast<uid_t>(-1), dir_st.st_gid, AT_EMPTY_PATH) != 0)
            notes.push_back(path + " belongs to group " + group_name(st.st_gid) +
                            ", not to the state dir's group " + group_name(dir_st.st_gid) + " (" +
                            std::strerror(errno) +
                            "), so that group cannot read it; fix: "
                            "chgrp " +
                            group_name(dir_st.st_gid) + " " + path);
        close_fd();
    }
    return notes;
}

Result<mode_t> prepare_snapshot_dir(const std::string &dir) {
    struct stat state {};
    if (::stat(dir.c_str(), &state) != 0)
        return make_error(Errc::io, "state dir " + dir + ": " + std::strerror(errno));
    bool group_reads = (state.st_mode & (S_IRGRP | S_IXGRP)) == (S_IRGRP | S_IXGRP);
    std::string snapshots = dir + "/snapshot";
    mode_t dir_mode = group_reads ? 0750 : 0700;
    if (::mkdir(snapshots.c_str(), dir_mode) != 0 && errno != EEXIST)
        return make_error(Errc::io, "cannot create the snapshot dir " + snapshots + ": " +
                                        std::strerror(errno));
    if (auto checked = prepare_state_dir(snapshots); !checked) return std::move(checked).error();
    // Its group is the state dir's (a setgid state dir gives it that, and its setgid bit, at
    // mkdir; a dir made before gets it here), so the auditors who may enter the state dir read
    // the snapshot and no one else does. chmod only when the bits differ: a daemon not in the
    // group would lose the setgid bit by it, and its files the group.
    struct stat st {};
    if (::stat(snapshots.c_str(), &st) != 0)
        return make_error(Errc::io, "stat " + snapshots + ": " + std::strerror(errno));
    // The group first: chmod by a user outside the dir's group drops a setgid bit it sets.
    if (group_reads && st.st_gid != state.st_gid) {
        if (::chown(snapshots.c_str(), static_cast<uid_t>(-1), state.st_gid) != 0)
            return make_error(Errc::io, "the snapshot dir " + snapshots + " belongs to group " +
                                            group_name(st.st_gid) + ", not the state dir's " +
                                            group_name(state.st_gid) + ": " + std::strerror(errno) +
                                            "; fix: chgrp " + group_name(state.st_gid) + " " +
                                            snapshots);
        if (::stat(snapshots.c_str(), &st) != 0)
            return make_error(Errc::io, "stat " + snapshots + ": " + std::strerror(errno));
    }
    // Setgid where the group reads: each new file (the copy, its anchor) takes the group.
    mode_t want = dir_mode | (group_reads ? S_ISGID : 0);
    if ((st.st_mode & 07777) != want) {
        if (::chmod(snapshots.c_str(), want) != 0 || ::stat(snapshots.c_str(), &st) != 0)
            return make_error(Errc::io, "chmod " + snapshots + ": " + std::strerror(errno));
        // A user outside the dir's group cannot set its setgid bit: chmod drops it in silence,
        // and the snapshot's files would then take the daemon's group, which auditors lack.
        if ((st.st_mode & 07777) != want)
            return make_error(Errc::denied, "the snapshot dir " + snapshots + " has mode " +
                                                octal(st.st_mode) + ", not " + octal(want) +
                                                " (the daemon's user may not set the setgid bit "
                                                "of a group it is not in); fix, as root: chmod " +
                                                octal(want) + " " + snapshots);
    }
    mode_t file_mode = group_reads ? 0640 : 0600;
    auto files = check_state_files(snapshots, {{"journal.db", file_mode},
                                               {"journal.db-journal", file_mode},
                                               {"journal.db.anchor", file_mode}});
    if (!files) return std::move(files).error();
    return file_mode;
}

} // namespace knod::daemon
