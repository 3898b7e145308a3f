// The auditors' snapshot of the journal (journal/snapshot.h, #33 item 4): a consistent copy
// readable without the live journal's -shm, published without ever waiting on its readers for
// longer than the busy wait, and verified as a snapshot (its anchor says when it was taken).
#include "journal/journal.h"
#include "journal/reader.h"
#include "journal/snapshot.h"
#include "journal/system_journal.h"
#include "journal/verify.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>

using namespace knod;
using namespace knod::journal;
namespace fs = std::filesystem;

namespace {

class JournalSnapshotTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("knod-snapshot-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_ / "snapshot");
        live_ = (dir_ / "journal.db").string();
        auto j = Journal::open(live_);
        ASSERT_TRUE(j.ok()) << j.error().message;
        journal_ = std::move(*j);
    }
    void TearDown() override {
        journal_.reset();
        fs::remove_all(dir_);
    }
    std::int64_t append(int n) {
        std::int64_t seq = 0;
        for (int i = 0; i < n; ++i) {
            Event e;
            e.kind = kind::denied;
            e.uid = 1000 + i;
            auto r = journal_->append(e);
            EXPECT_TRUE(r.ok()) << r.error().message;
            seq = r ? *r : 0;
        }
        return seq;
    }
    SnapshotPublisher publisher(std::chrono::milliseconds busy = std::chrono::milliseconds(50)) {
        auto p = SnapshotPublisher::open(live_, 0640, busy);
        EXPECT_TRUE(p.ok()) << p.error().message;
        return std::move(p).value();
    }
    nlohmann::json anchor() {
        std::ifstream in(anchor_path(snapshot_path(live_)));
        return nlohmann::json::parse(in, nullptr, false);
    }

    fs::path dir_;
    std::string live_;
    std::unique_ptr<Journal> journal_;
};

} // namespace

TEST_F(JournalSnapshotTest, APublishedCopyVerifiesAndNeedsNoShm) {
    std::int64_t head = append(5);
    auto pub = publisher();
    auto published = pub.publish();
    ASSERT_TRUE(published.ok()) << published.error().message;
    EXPECT_EQ(published->seq, head);
    EXPECT_EQ(pub.path(), (dir_ / "snapshot" / "journal.db").string());
    // A rollback-journal database (header bytes 18 and 19 are 1; 2 is WAL), so a reader with
    // read access alone opens it: no -wal, no -shm to create or lock.
    std::ifstream in(pub.path(), std::ios::binary);
    char header[100] = {};
    in.read(header, sizeof header);
    EXPECT_EQ(header[18], 1);
    EXPECT_EQ(header[19], 1);
    EXPECT_FALSE(fs::exists(pub.path() + "-wal"));
    EXPECT_FALSE(fs::exists(pub.path() + "-shm"));
    struct stat st {};
    ASSERT_EQ(::stat(pub.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    ASSERT_EQ(::stat(anchor_path(pub.path()).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_FALSE(fs::exists(live_ + ".snapshot-work")) << "the work file is removed";

    auto a = anchor();
    EXPECT_EQ(a["seq"], head);
    EXPECT_EQ(a["snapshot"]["live"], live_);
    EXPECT_EQ(a["snapshot"]["at_us"], published->at_us);
    auto r = verify_chain(pub.path());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->ok) << r->problem;
    EXPECT_TRUE(r->anchor_checked);
    ASSERT_TRUE(r->snapshot_mark.has_value());
    EXPECT_EQ(r->snapshot_mark->at_us, published->at_us);
    EXPECT_TRUE(at_snapshot_path(pub.path(), *r->snapshot_mark));
    EXPECT_EQ(r->events_checked, head);

    // The live journal goes on; the next publication catches up in place.
    head = append(3);
    published = pub.publish();
    ASSERT_TRUE(published.ok()) << published.error().message;
    EXPECT_EQ(published->seq, head);
    r = verify_chain(pub.path());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->ok) << r->problem;
    EXPECT_EQ(r->events_checked, head);
    // The rollback journal of a copy replaced in place is kept, cut to nothing (TRUNCATE): a
    // reader holding a deleted one open would keep a copy's size of disk per publication. (The
    // first copy is renamed into place whole: it has none. #52)
    ASSERT_EQ(::stat((pub.path() + "-journal").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 0);
}

// A reader holding the published copy (a read transaction, as a slow auditor would) makes a
// publication fail after the busy wait and leaves the last copy whole; the live journal never
// waits for it; once the reader is gone the next publication goes through.
TEST_F(JournalSnapshotTest, AReaderOfTheCopyDelaysOnlyTheCopy) {
    append(2);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    auto reader =
        Database::open(file_uri(pub.path(), "mode=ro"), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    ASSERT_TRUE(reader->exec("BEGIN").ok());
    ASSERT_EQ(reader->scalar("SELECT count(*) FROM events").value(), 2);

    std::int64_t head = append(4); // the live journal commits while the copy is held
    EXPECT_EQ(head, 6);
    auto blocked = pub.publish();
    ASSERT_FALSE(blocked.ok());
    EXPECT_EQ(blocked.error().code, Errc::unavailable);
    EXPECT_NE(blocked.error().message.find("a reader holds its lock"), std::string::npos)
        << blocked.error().message;
    EXPECT_EQ(reader->scalar("SELECT count(*) FROM events").value(), 2) << "its snapshot stands";
    EXPECT_EQ(anchor()["seq"], 2) << "the anchor stays with the copy it describes";

    ASSERT_TRUE(reader->exec("COMMIT").ok());
    auto published = pub.publish();
    ASSERT_TRUE(published.ok()) << published.error().message;
    EXPECT_EQ(published->seq, head);
    auto r = verify_chain(pub.path());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->ok) << r->problem;
}

// The auditor's own reader (ReadOnlyJournal, as every `audit` command opens a file) holds the
// copy's shared lock while it reads, so a publication waits for it instead of rewriting pages
// under it (a reader without locks saw half a copy: "tampered").
TEST_F(JournalSnapshotTest, TheAuditorsReaderLocksTheCopyItReads) {
    append(2);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    auto reader = ReadOnlyJournal::open(pub.path());
    ASSERT_TRUE(reader.ok()) << reader.error().message;
    ASSERT_TRUE(reader->db().exec("BEGIN").ok());
    ASSERT_EQ(reader->db().scalar("SELECT count(*) FROM events").value(), 2);
    append(3);
    auto blocked = pub.publish();
    ASSERT_FALSE(blocked.ok()) << "published under a reader's open transaction";
    EXPECT_EQ(blocked.error().code, Errc::unavailable);
    ASSERT_TRUE(reader->db().exec("COMMIT").ok());
    EXPECT_TRUE(pub.publish().ok());
}

// A snapshot mark is the daemon's word only where the daemon publishes (the named journal's
// snapshot/): one added to the live journal's anchor, or to a file anywhere else, is a claim
// (a rolled-back journal marked as a snapshot would pass its lost tail off as "newer").
TEST_F(JournalSnapshotTest, ASnapshotMarkCountsOnlyWhereTheDaemonPublishes) {
    append(1);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    EXPECT_TRUE(at_snapshot_path(pub.path(), {1, live_}));
    EXPECT_FALSE(at_snapshot_path(live_, {1, live_})) << "the live journal itself";
    EXPECT_FALSE(at_snapshot_path(live_, {1, "/elsewhere/journal.db"}));
    EXPECT_FALSE(at_snapshot_path(live_, {1, ""}));
    fs::copy_file(pub.path(), dir_ / "copied.db");
    EXPECT_FALSE(at_snapshot_path((dir_ / "copied.db").string(), {1, live_}));
    // Judged by where the file lies, never by the mark: a link (to the copy, or a "snapshot"
    // link to the live journal's own dir) could stand anywhere.
    fs::create_symlink(pub.path(), dir_ / "link.db");
    EXPECT_FALSE(at_snapshot_path((dir_ / "link.db").string(), {1, live_}));
    fs::create_directories(dir_ / "x");
    fs::create_symlink("..", dir_ / "x" / "snapshot");
    EXPECT_FALSE(at_snapshot_path((dir_ / "x" / "snapshot" / "journal.db").string(),
                                  {1, (dir_ / "x" / "journal.db").string()}))
        << "the live journal, reached through a snapshot link";
    // A journal that itself lies in a dir named snapshot, with a mark naming a journal that
    // does not exist beside the dir.
    fs::create_directories(dir_ / "y" / "snapshot");
    fs::copy_file(live_, dir_ / "y" / "snapshot" / "journal.db");
    EXPECT_FALSE(at_snapshot_path((dir_ / "y" / "snapshot" / "journal.db").string(),
                                  {1, (dir_ / "y" / "journal.db").string()}));
    // The mark must name the very journal beside the snapshot dir.
    EXPECT_FALSE(at_snapshot_path(pub.path(), {1, (dir_ / "other.db").string()}));
    EXPECT_EQ(published_snapshot_of(pub.path()), live_);
}

// Where the auditor reads under locks (the published copy), a -journal beside it that is not a
// regular file is refused at once: SQLite would open a FIFO there and wait for ever, or a link
// to a device. Anywhere else the file is read immutable and nothing beside it is opened.
TEST_F(JournalSnapshotTest, AJournalBesideTheCopyThatIsNotAFileIsRefused) {
    append(1);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    std::string side = pub.path() + "-journal";
    fs::remove(side);
    ASSERT_EQ(::mkfifo(side.c_str(), 0600), 0);
    auto r = ReadOnlyJournal::open(pub.path());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("-journal is a FIFO, not a rollback journal"),
              std::string::npos)
        << r.error().message;
    // The same bytes elsewhere: a copy, read immutable, never touching what lies beside it.
    fs::create_directories(dir_ / "copy");
    fs::copy_file(pub.path(), dir_ / "copy" / "journal.db");
    std::string copied_side = (dir_ / "copy" / "journal.db-journal").string();
    ASSERT_EQ(::mkfifo(copied_side.c_str(), 0600), 0);
    auto c = ReadOnlyJournal::open((dir_ / "copy" / "journal.db").string());
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->db().scalar("SELECT count(*) FROM events").value(), 1);
}

// The system journal keeps heads the daemon sent after the snapshot was taken: those are
// expected past its end. One journald received before the snapshot was taken is not: the
// snapshot's read began later, so it must hold that event, and a copy without it lost its tail.
TEST_F(JournalSnapshotTest, SystemJournalHeadsAfterTheSnapshotAreExpectedOnlyAfterIt) {
    append(3);
    auto pub = publisher();
    auto published = pub.publish();
    ASSERT_TRUE(published.ok()) << published.error().message;
    auto db = Database::open(pub.path(), SQLITE_OPEN_READONLY);
    ASSERT_TRUE(db.ok());
    std::string h(64, 'a');
    std::int64_t at = published->at_us;
    std::vector<AnchorCopy> later{{7, h, at + 1000000, live_, "", "", 0},
                                  {9, h, at + 2000000, live_, "", "", 0}};
    auto c = check_anchor_copies(*db, pub.path(), later, false, std::nullopt, at);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_TRUE(c->ok) << c->problem;
    EXPECT_EQ(c->newer_than_snapshot, 2);
    EXPECT_EQ(c->newest->seq, 9);
    // Without the snapshot's time the same copies are a truncated tail.
    c = check_anchor_copies(*db, pub.path(), later);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->ok);
    // A head received before the snapshot was taken, past its end: its tail was removed.
    std::vector<AnchorCopy> earlier{{7, h, at - 1, live_, "", "", 0}};
    c = check_anchor_copies(*db, pub.path(), earlier, false, std::nullopt, at);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->ok);
    EXPECT_EQ(c->bad_seq, 7);
    EXPECT_NE(c->problem.find("before this snapshot was taken"), std::string::npos) << c->problem;
}

// The snapshot mark is read like the rest of the anchor: hostile shapes are errors, not
// crashes or a mark taken from half a field.
TEST_F(JournalSnapshotTest, AMalformedSnapshotMarkIsAnError) {
    append(2);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    auto good = anchor();
    for (nlohmann::json mark :
         {nlohmann::json(7), nlohmann::json::object(), nlohmann::json{{"at_us", "1"}},
          nlohmann::json{{"at_us", -5}, {"live", "/x"}}, nlohmann::json{{"at_us", 5}},
          nlohmann::json{{"at_us", 5}, {"live", 3}},
          nlohmann::json{{"at_us", 18446744073709551615ull}, {"live", "/x"}}}) {
        auto a = good;
        a["snapshot"] = mark;
        std::ofstream(anchor_path(pub.path()), std::ios::trunc) << a.dump();
        auto r = verify_chain(pub.path());
        ASSERT_FALSE(r.ok()) << mark.dump();
        EXPECT_NE(r.error().message.find("malformed"), std::string::npos) << r.error().message;
    }
}

// A reader given the live journal's path reads the snapshot only when the live file is closed
// to it (EACCES, tested as another uid in tests/integration/identity_test.cc): a readable or
// missing one is read (or its error said) as given.
TEST_F(JournalSnapshotTest, TheSnapshotIsNotReadInsteadOfAReadableJournal) {
    append(1);
    auto pub = publisher();
    ASSERT_TRUE(pub.publish().ok());
    EXPECT_EQ(snapshot_instead(live_), std::nullopt) << "readable: the live journal itself";
    EXPECT_EQ(snapshot_instead((dir_ / "absent.db").string()), std::nullopt);
}
