#include "journal/snapshot.h"

#include "journal/journal.h"
#include "journal/records.h"
#include "journal/sqlite.h"
#include "knod/json.h"
#include "knod/system_error.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace knod::journal {
namespace {

// Copies every page of `from` into `to` in one step: one read transaction on `from` (its
// snapshot stays consistent while the daemon commits meanwhile, WAL), one write transaction
// on `to` (its readers wait for it, or it waits for them at most `to`'s busy timeout).
Result<void> copy_pages(Database &from, Database &to, const std::string &what) {
    sqlite3_backup *b = sqlite3_backup_init(to.get(), "main", from.get(), "main");
    if (!b) return to.error("copy " + what);
    int rc = sqlite3_backup_step(b, -1);
    int finished = sqlite3_backup_finish(b);
    if (rc == SQLITE_DONE) rc = finished;
    if (rc == SQLITE_DONE || rc == SQLITE_OK) return {};
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
        return make_error(Errc::unavailable,
                          "copy " + what + ": a reader holds its lock (SQLITE_BUSY); the last " +
                              "published copy stays as it was");
    return to.error("copy " + what);
}

// A file of ours, created when absent (O_EXCL, never through a link) with `mode`, and given
// `mode` when it has another.
Result<void> own_file(const std::string &path, mode_t mode) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return system_error(Errc::io, errno, "open " + path);
    struct stat st {};
    Result<void> out;
    if (::fstat(fd, &st) != 0)
        out = system_error(Errc::io, errno, "stat " + path);
    else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
        out = make_error(Errc::denied, path + " is not a regular file of the daemon's user");
    else if ((st.st_mode & 07777) != mode && ::fchmod(fd, mode) != 0)
        out = system_error(Errc::io, errno, "chmod " + path);
    ::close(fd);
    return out;
}

// Whether `path` starts as a whole SQLite database in rollback-journal mode does: its header
// (16 bytes of magic) and read/write versions 1 (bytes 18, 19). A copy being filled page by
// page has no header yet; a reader would open it unlocked (journal/reader.cc) and see it torn.
bool whole_copy_at(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    unsigned char header[20] = {};
    struct stat st {};
    bool whole = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                 ::pread(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header) &&
                 std::memcmp(header, "SQLite format 3", 16) == 0 && header[18] == 1 &&
                 header[19] == 1;
    ::close(fd);
    return whole;
}

Result<void> sync_path(const std::string &path, int flags) {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) return system_error(Errc::io, errno, "open " + path);
    int r = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (r != 0) return system_error(Errc::io, err, "fsync " + path);
    return {};
}

} // namespace

std::optional<std::string> snapshot_not_published(const std::string &live_path) {
    std::string snapshot = snapshot_path(live_path);
    struct stat st {};
    if (::lstat(snapshot.c_str(), &st) == 0 || errno != ENOENT) return std::nullopt;
    std::string dir = snapshot_dir(live_path);
    if (::lstat(dir.c_str(), &st) == 0)
        return S_ISDIR(st.st_mode)
                   ? std::optional<std::string>(
                         "the daemon has not published an auditors' snapshot yet (" + snapshot +
                         " is absent: it publishes one moments after it starts, after its first "
                         "event, then at most every --snapshot-interval seconds after the "
                         "journal changes); retry then (docs/audit.md, \"Reading as an "
                         "auditor\")")
                   : std::nullopt;
    if (errno != ENOENT) return std::nullopt;
    return "there is no auditors' snapshot dir " + dir +
           " beside it: the daemon has not started with this state dir, or runs with "
           "--snapshot-interval 0 (docs/audit.md, \"Reading as an auditor\")";
}

std::string snapshot_dir(const std::string &live_path) {
    auto parent = std::filesystem::path(live_path).parent_path();
    return (parent.empty() ? std::filesystem::path(".") : parent).string() + "/snapshot";
}

std::string snapshot_path(const std::string &live_path) {
    return snapshot_dir(live_path) + "/" + std::filesystem::path(live_path).filename().string();
}

std::optional<std::string> snapshot_instead(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        ::close(fd);
        return std::nullopt;
    }
    if (errno != EACCES) return std::nullopt;
    std::string snapshot = snapshot_path(path);
    if (::access(snapshot.c_str(), R_OK) != 0) return std::nullopt;
    return snapshot;
}

std::optional<std::string> published_snapshot_of(const std::string &path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path named = fs::absolute(path, ec).lexically_normal();
    if (ec || fs::canonical(named, ec) != named || ec) return std::nullopt; // a link on the way
    fs::path dir = named.parent_path();
    if (dir.filename() != "snapshot") return std::nullopt;
    fs::path live = dir.parent_path() / named.filename();
    struct stat d {
    }, f{}, l{};
    if (::lstat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode) || (d.st_mode & (S_IWGRP | S_IWOTH)))
        return std::nullopt;
    if (::lstat(named.c_str(), &f) != 0 || !S_ISREG(f.st_mode) || f.st_uid != d.st_uid)
        return std::nullopt;
    if (::lstat(live.c_str(), &l) != 0 || !S_ISREG(l.st_mode) || l.st_uid != d.st_uid ||
        (l.st_dev == f.st_dev && l.st_ino == f.st_ino))
        return std::nullopt;
    return live.string();
}

bool at_snapshot_path(const std::string &path, const SnapshotMark &mark) {
    auto live = published_snapshot_of(path);
    return live && *live == mark.live;
}

SnapshotPublisher::SnapshotPublisher(std::string live, std::string dir, mode_t mode,
                                     std::chrono::milliseconds busy_wait)
    : live_(std::move(live)), dir_(std::move(dir)), mode_(mode), busy_wait_(busy_wait) {
    published_ = dir_ + "/" + std::filesystem::path(live_).filename().string();
    // Beside the live journal, where only the daemon may create files; never in the snapshot
    // dir, whose readers could lock it while it is written.
    work_ = live_ + ".snapshot-work";
}

Result<SnapshotPublisher> SnapshotPublisher::open(std::string live_path, mode_t mode,
                                                  std::chrono::milliseconds busy_wait) {
    // The mark names the live journal by its absolute path: verify compares it with where the
    // snapshot lies (published_snapshot_of), from any working directory.
    std::error_code ec;
    auto absolute = std::filesystem::absolute(live_path, ec).lexically_normal();
    if (!ec) live_path = absolute.string();
    std::string dir = snapshot_dir(live_path);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
        return make_error(Errc::denied, "the snapshot dir " + dir +
                                            " is missing or not a directory of the daemon's "
                                            "user");
    return SnapshotPublisher(std::move(live_path), std::move(dir), mode & 0640, busy_wait);
}

Result<Published> SnapshotPublisher::publish() {
    Published out;
    // A fresh work file each time, 0600, made before SQLite (which would create it 0644 less
    // the umask) opens it; whatever an interrupted publication left goes first.
    for (const char *suffix : {"", "-journal"}) {
        std::string stale = work_ + suffix;
        if (::unlink(stale.c_str()) != 0 && errno != ENOENT)
            return system_error(Errc::io, errno, "remove " + stale);
    }
    int fd = ::open(work_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return system_error(Errc::io, errno, "create " + work_);
    ::close(fd);
    Hash head{};
    {
        auto work = Database::open(work_, SQLITE_OPEN_READWRITE);
        if (!work) return std::move(work).error().context("snapshot");
        {
            auto live =
                Database::open(file_uri(live_, "mode=ro"), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
            if (!live) return std::move(live).error().context("snapshot");
            out.at_us = now_us();
            if (auto r = copy_pages(*live, *work, live_); !r) return r.error();
        }
        // The copy says "WAL" as its source did; a rollback journal needs no -shm, so a reader
        // with read access alone opens it.
        if (auto r = work->exec("PRAGMA journal_mode=DELETE"); !r)
            return std::move(r).error().context("snapshot " + work_);
        auto last = read_head(*work);
        if (!last) return std::move(last).error().context("snapshot " + work_);
        if (*last) {
            out.seq = (*last)->seq;
            head = (*last)->hash;
        }
    }
    if (!whole_copy_at(published_)) {
        if (auto r = publish_whole(); !r) return r.error();
    } else if (auto r = publish_in_place(); !r) {
        return r.error();
    }
    ::unlink(work_.c_str());
    if (out.seq > 0) {
        auto anchor = nlohmann::json{{"seq", out.seq},
                                     {"hash", to_hex(head)},
                                     {"snapshot", {{"at_us", out.at_us}, {"live", live_}}}};
        if (auto r =
                write_anchor_file(anchor_path(published_), knod::dump_json(anchor) + "\n", mode_);
            !r)
            return r.error();
    }
    return out;
}

// The first copy (or one over a file that is not a whole copy: a publication an older daemon did
// not finish) appears whole: filled in a private file in the snapshot dir, synced, given its
// mode and renamed into place. Readers never see it being filled.
Result<void> SnapshotPublisher::publish_whole() {
    std::string prefix = "." + std::filesystem::path(published_).filename().string() + ".first-";
    // What a publication cut short (a crash) left; no one else writes here.
    std::error_code ec;
    for (auto &entry : std::filesystem::directory_iterator(dir_, ec))
        if (entry.path().filename().string().starts_with(prefix))
            std::filesystem::remove(entry.path(), ec);
    std::string temp = dir_ + "/" + prefix + "XXXXXX";
    int fd = ::mkostemp(temp.data(), O_CLOEXEC); // 0600 until it is whole
    if (fd < 0) return system_error(Errc::io, errno, "create " + temp);
    ::close(fd);
    auto fail = [&](Error e) -> Result<void> {
        ::unlink(temp.c_str());
        ::unlink((temp + "-journal").c_str());
        return e;
    };
    {
        auto work =
            Database::open(file_uri(work_, "mode=ro"), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
        if (!work) return fail(std::move(work).error().context("snapshot"));
        auto copy = Database::open(temp, SQLITE_OPEN_READWRITE);
        if (!copy) return fail(std::move(copy).error().context("snapshot"));
        if (auto r = copy_pages(*work, *copy, temp); !r) return fail(r.error());
    }
    if (::chmod(temp.c_str(), mode_) != 0)
        return fail(system_error(Errc::io, errno, "chmod " + temp));
    if (auto r = sync_path(temp, O_RDONLY); !r) return fail(r.error());
    // A rollback journal left beside a file that was never whole would be played into the new
    // copy by its first reader or writer.
    std::string stale = published_ + "-journal";
    if (::unlink(stale.c_str()) != 0 && errno != ENOENT)
        return fail(system_error(Errc::io, errno, "remove " + stale));
    if (::rename(temp.c_str(), published_.c_str()) != 0)
        return fail(system_error(Errc::io, errno, "rename " + temp + " to " + published_));
    return sync_path(dir_, O_RDONLY | O_DIRECTORY);
}

// Every later copy replaces the pages of the published one in place, under SQLite's locking
// (never renamed over: an old copy a reader keeps open would pin its disk space).
Result<void> SnapshotPublisher::publish_in_place() {
    if (auto r = own_file(published_, mode_); !r) return r.error();
    {
        auto work =
            Database::open(file_uri(work_, "mode=ro"), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
        if (!work) return std::move(work).error().context("snapshot");
        auto published = Database::open(published_, SQLITE_OPEN_READWRITE);
        if (!published) return std::move(published).error().context("snapshot");
        sqlite3_busy_timeout(published->get(), static_cast<int>(busy_wait_.count()));
        // TRUNCATE, not DELETE: the rollback journal stays one file, cut to nothing after each
        // commit. A deleted one that a reader of the dir's group had opened would keep its
        // blocks (a copy's size per publication) until that reader let go.
        if (auto r = published->exec("PRAGMA journal_mode=TRUNCATE"); !r)
            return std::move(r).error().context("snapshot " + published_);
        if (auto r = copy_pages(*work, *published, published_); !r) return r.error();
    }
    return {};
}

} // namespace knod::journal
