// The auditors' snapshot before and at its first publication (#52, minor): the published path
// never holds a copy being filled (the first copy, or one over a file an unfinished publication
// left, appears whole by rename), a file there that is not a whole copy is never read as a
// journal, and an auditor who finds no snapshot is told that, not "Permission denied".
#include "journal/journal.h"
#include "journal/reader.h"
#include "journal/snapshot.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace knod;
using namespace knod::journal;
namespace fs = std::filesystem;

namespace {

class SnapshotFirstTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("knod-snapshot-first-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_ / "snapshot");
        fs::permissions(dir_ / "snapshot", fs::perms(0755));
        live_ = (dir_ / "journal.db").string();
        auto j = Journal::open(live_);
        ASSERT_TRUE(j.ok()) << j.error().message;
        journal_ = std::move(*j);
        Event e;
        e.kind = kind::denied;
        e.uid = 1000;
        ASSERT_TRUE(journal_->append(e).ok());
    }
    void TearDown() override {
        journal_.reset();
        fs::remove_all(dir_);
    }
    SnapshotPublisher publisher() {
        auto p = SnapshotPublisher::open(live_, 0640);
        EXPECT_TRUE(p.ok()) << p.error().message;
        return std::move(p).value();
    }
    // What happened in the snapshot dir to entries named `name` during `f`: "create", "write",
    // "moved-in" (inotify, read once `f` returned).
    template <typename F> std::vector<std::string> watched(const std::string &name, F f) {
        int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        EXPECT_GE(fd, 0);
        EXPECT_GE(::inotify_add_watch(fd, (dir_ / "snapshot").c_str(),
                                      IN_CREATE | IN_MODIFY | IN_MOVED_TO),
                  0);
        f();
        std::vector<std::string> seen;
        alignas(inotify_event) char buf[65536];
        ssize_t n;
        while ((n = ::read(fd, buf, sizeof buf)) > 0) {
            for (char *p = buf; p < buf + n;) {
                auto *ev = reinterpret_cast<inotify_event *>(p);
                if (ev->len && name == ev->name)
                    seen.push_back((ev->mask & IN_CREATE)   ? "create"
                                   : (ev->mask & IN_MODIFY) ? "write"
                                                            : "moved-in");
                p += sizeof(inotify_event) + ev->len;
            }
        }
        EXPECT_TRUE(n < 0 && errno == EAGAIN) << "reading inotify: " << std::strerror(errno);
        ::close(fd);
        return seen;
    }
    std::vector<std::string> snapshot_dir_entries() {
        std::vector<std::string> names;
        for (auto &e : fs::directory_iterator(dir_ / "snapshot"))
            names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    }

    fs::path dir_;
    std::string live_;
    std::unique_ptr<Journal> journal_;
};

// Before #52 the first publication created the published file empty and filled it page by
// page: a reader who opened it meanwhile found no rollback-journal header, read it unlocked,
// and got "file is not a database" or "not a knod journal".
TEST_F(SnapshotFirstTest, TheFirstCopyAppearsWholeByRename) {
    auto pub = publisher();
    auto events = watched("journal.db", [&] {
        auto r = pub.publish();
        ASSERT_TRUE(r.ok()) << r.error().message;
    });
    EXPECT_EQ(events, std::vector<std::string>{"moved-in"});
    struct stat st {};
    ASSERT_EQ(::stat(pub.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
    EXPECT_EQ(snapshot_dir_entries(), (std::vector<std::string>{"journal.db", "journal.db.anchor"}))
        << "no temporary file is left";
    auto r = JournalReader::open(pub.path());
    ASSERT_TRUE(r.ok()) << r.error().message;
    // Later publications replace pages in place under SQLite's lock (never renamed over: a
    // reader's old copy would pin its disk space).
    Event e;
    e.kind = kind::denied;
    ASSERT_TRUE(journal_->append(e).ok());
    events = watched("journal.db", [&] { ASSERT_TRUE(pub.publish().ok()); });
    EXPECT_TRUE(std::find(events.begin(), events.end(), "moved-in") == events.end());
    EXPECT_FALSE(events.empty());
}

// A file at the published path that is not a whole copy (an unfinished first publication of an
// older daemon: empty, or pages without SQLite's header) is replaced whole, and until then is
// never read as a journal.
TEST_F(SnapshotFirstTest, AFileThatIsNotAWholeCopyIsNeverReadAndIsReplacedWhole) {
    auto pub = publisher();
    for (std::string torn : {std::string(), std::string(4096, '\0'), std::string("SQLite f")}) {
        {
            std::ofstream out(pub.path(), std::ios::binary | std::ios::trunc);
            out << torn;
        }
        fs::permissions(pub.path(), fs::perms(0640));
        std::ofstream(pub.path() + "-journal", std::ios::binary) << std::string(512, 'x');
        auto r = JournalReader::open(pub.path());
        ASSERT_FALSE(r.ok()) << torn.size() << " bytes read as a journal";
        EXPECT_NE(r.error().message.find("not a whole auditors' snapshot"), std::string::npos)
            << r.error().message;
        EXPECT_NE(r.error().message.find("has not finished publishing"), std::string::npos)
            << r.error().message;
        auto events = watched("journal.db", [&] { ASSERT_TRUE(pub.publish().ok()); });
        EXPECT_EQ(events, std::vector<std::string>{"moved-in"}) << torn.size() << " bytes";
        EXPECT_FALSE(fs::exists(pub.path() + "-journal"))
            << "an old rollback journal would be played into the new copy";
        auto read = JournalReader::open(pub.path());
        ASSERT_TRUE(read.ok()) << read.error().message;
    }
}

// An auditor (a user other than the daemon's, who may enter the state dir but not read the
// live journal) with no snapshot to read is told that none is published yet, or that there is
// no snapshot dir; one who may not look (an outsider) still gets "Permission denied" alone.
TEST_F(SnapshotFirstTest, AnAuditorWithNoSnapshotIsToldItIsNotPublishedYet) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to read as another user";
    fs::permissions(dir_, fs::perms(0755));
    fs::permissions(live_, fs::perms(0600));
    auto as_nobody = [&](const std::string &path) {
        int pipefd[2];
        EXPECT_EQ(::pipe(pipefd), 0);
        pid_t child = ::fork();
        if (child == 0) {
            ::close(pipefd[0]);
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
            auto r = ReadOnlyJournal::open(path);
            std::string m = r ? "opened" : r.error().message;
            (void)!::write(pipefd[1], m.data(), m.size());
            ::_exit(0);
        }
        ::close(pipefd[1]);
        std::string out;
        char buf[4096];
        ssize_t n;
        while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0)
            out.append(buf, static_cast<size_t>(n));
        ::close(pipefd[0]);
        int status = 0;
        ::waitpid(child, &status, 0);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return out;
    };
    std::string m = as_nobody(live_);
    EXPECT_NE(m.find("Permission denied"), std::string::npos) << m;
    EXPECT_NE(m.find("the daemon has not published an auditors' snapshot yet"), std::string::npos)
        << m;
    EXPECT_NE(m.find(snapshot_path(live_)), std::string::npos) << m;
    fs::remove(dir_ / "snapshot");
    m = as_nobody(live_);
    EXPECT_NE(m.find("no auditors' snapshot dir"), std::string::npos) << m;
    EXPECT_NE(m.find("--snapshot-interval 0"), std::string::npos) << m;
    fs::create_directories(dir_ / "snapshot");
    fs::permissions(dir_ / "snapshot", fs::perms(0700)); // an outsider may not look inside
    m = as_nobody(live_);
    EXPECT_NE(m.find("Permission denied"), std::string::npos) << m;
    EXPECT_EQ(m.find("auditors' snapshot"), std::string::npos)
        << "an outsider is told nothing more: " << m;
    // Published: the auditor reads it (the CLI swaps it in: read_snapshot_if_live_unreadable).
    fs::permissions(dir_ / "snapshot", fs::perms(0755));
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    fs::permissions(pub.path(), fs::perms(0644));
    EXPECT_EQ(as_nobody(pub.path()), "opened");
}

} // namespace
