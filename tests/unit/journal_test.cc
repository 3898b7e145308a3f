#include "daemon/journal/journal.h"
#include "daemon/journal/verify.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

using namespace knod;
using namespace knod::journal;
namespace fs = std::filesystem;

namespace {

class JournalTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("knod-journal-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        path_ = (dir_ / "journal.db").string();
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Plain SQL, as an attacker with write access to the file would use it.
    void sql(const std::string &statement) {
        auto db = Database::open(path_, SQLITE_OPEN_READWRITE);
        ASSERT_TRUE(db.ok());
        auto r = db->exec(statement);
        ASSERT_TRUE(r.ok()) << r.error().message;
    }
    void tamper(const std::string &statement) {
        sql("DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete; " + statement);
    }

    void write_events(int n) {
        auto j = Journal::open(path_);
        ASSERT_TRUE(j.ok()) << j.error().message;
        for (int i = 0; i < n; ++i) {
            Event e;
            e.kind = i % 2 ? kind::denied : kind::granted;
            e.uid = 1000 + i;
            e.reason = "event " + std::to_string(i);
            ASSERT_TRUE((*j)->append(e).ok());
        }
    }

    VerifyReport verify() {
        auto r = verify_chain(path_);
        EXPECT_TRUE(r.ok()) << r.error().message;
        return r ? *r : VerifyReport{};
    }

    fs::path dir_;
    std::string path_;
};

Session session(const std::string &id) {
    Session s;
    s.id = id;
    s.uid = 1000;
    s.pid = 77;
    s.netdev = "knodsim0";
    s.gpu = "sim0";
    s.mode = "rx-only";
    s.region_bytes = 4096;
    s.flows = {"udp * -> *:5000"};
    s.key_id = "k-1";
    s.rule = "sim-local";
    return s;
}

Event grant_event() {
    Event e;
    e.kind = kind::granted;
    e.uid = 1000;
    e.rule = "sim-local";
    e.decision = "allow";
    return e;
}

} // namespace

TEST_F(JournalTest, IntactChainVerifies) {
    write_events(10);
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.events_checked, 10);
}

TEST_F(JournalTest, ReopeningContinuesTheChain) {
    write_events(3);
    write_events(4);
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.events_checked, 7);
}

TEST_F(JournalTest, TriggersRefusePlainUpdates) {
    write_events(2);
    auto db = Database::open(path_, SQLITE_OPEN_READWRITE);
    ASSERT_TRUE(db.ok());
    auto r = db->exec("UPDATE events SET reason = 'x' WHERE seq = 1");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("append-only"), std::string::npos);
}

TEST_F(JournalTest, EditedEventIsFound) {
    write_events(10);
    tamper("UPDATE events SET uid = 0 WHERE seq = 4");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 4);
    EXPECT_NE(r.problem.find("edited"), std::string::npos);
    EXPECT_EQ(r.events_checked, 3);
}

TEST_F(JournalTest, EditedNullFieldIsFound) {
    write_events(5);
    tamper("UPDATE events SET rule = '' WHERE seq = 2"); // NULL -> empty string
    EXPECT_EQ(verify().first_bad_seq, 2);
}

TEST_F(JournalTest, DeletedEventIsFound) {
    write_events(10);
    tamper("DELETE FROM events WHERE seq = 6");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 7);
    EXPECT_NE(r.problem.find("missing"), std::string::npos);
}

TEST_F(JournalTest, DeletedAndRenumberedIsFound) {
    write_events(10);
    tamper("DELETE FROM events WHERE seq = 6; UPDATE events SET seq = seq - 1 WHERE seq > 6");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 6);
}

TEST_F(JournalTest, InsertedEventIsFound) {
    write_events(5);
    tamper("INSERT INTO events (seq, at_us, kind, prev_hash, hash) "
           "SELECT 6, at_us, 'request-granted', hash, hash FROM events WHERE seq = 5");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 6);
}

TEST_F(JournalTest, InsertedInTheMiddleIsFound) {
    write_events(5);
    tamper("UPDATE events SET seq = -(seq + 1) WHERE seq >= 3; UPDATE events SET seq = -seq "
           "WHERE seq < 0; "
           "INSERT INTO events (seq, at_us, kind, prev_hash, hash) "
           "SELECT 3, at_us, 'request-granted', hash, hash FROM events WHERE seq = 2");
    EXPECT_EQ(verify().first_bad_seq, 3);
}

TEST_F(JournalTest, ReorderedEventsAreFound) {
    write_events(6);
    // Swap the contents of events 2 and 3, hashes and all.
    tamper("UPDATE events SET seq = -2 WHERE seq = 2; UPDATE events SET seq = 2 WHERE seq = 3; "
           "UPDATE events SET seq = 3 WHERE seq = -2");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 2);
}

TEST_F(JournalTest, SessionsOpenAndCloseWithTheirEvents) {
    {
        auto j = std::move(Journal::open(path_)).value();
        ASSERT_TRUE(j->open_session(session("b1"), grant_event()).ok());
        // The same id twice is refused and leaves nothing behind.
        EXPECT_FALSE(j->open_session(session("b1"), grant_event()).ok());
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("b1", "release", {100, 2, 1}, end).ok());
        EXPECT_FALSE(j->close_session("b1", "release", {}, end).ok()); // already ended
    }
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("SELECT rx_bytes FROM sessions WHERE id='b1' AND end_reason='release'"),
              100);
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM events"), 2);
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM events WHERE session_id='b1'"), 2);
    EXPECT_TRUE(verify().ok);
}

TEST_F(JournalTest, OpenSessionsAreClosedAfterACrash) {
    {
        auto j = std::move(Journal::open(path_)).value();
        ASSERT_TRUE(j->open_session(session("a"), grant_event()).ok());
        ASSERT_TRUE(j->open_session(session("b"), grant_event()).ok());
    } // the daemon "crashed" without closing them
    auto j = std::move(Journal::open(path_)).value();
    auto closed = j->close_open_sessions("daemon-restart");
    ASSERT_TRUE(closed.ok());
    EXPECT_EQ(closed->size(), 2u);
    EXPECT_TRUE(j->close_open_sessions("daemon-restart")->empty());
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sessions WHERE end_reason='daemon-restart'"), 2);
    EXPECT_TRUE(verify().ok);
}

TEST_F(JournalTest, ConcurrentAppendsShareCommits) {
    auto j = std::move(Journal::open(path_)).value();
    constexpr int threads = 8, per_thread = 150;
    std::vector<std::thread> workers;
    std::atomic<int> failures{0};
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            for (int i = 0; i < per_thread; ++i) {
                Event e;
                e.kind = kind::granted;
                e.uid = t;
                e.pid = i;
                if (!j->append(e)) ++failures;
            }
        });
    for (auto &w : workers)
        w.join();
    EXPECT_EQ(failures.load(), 0);
    JournalStats s = j->stats();
    EXPECT_EQ(s.operations, static_cast<std::uint64_t>(threads * per_thread));
    // Group commit: with several writers waiting, batches form, so fewer commits than appends.
    EXPECT_LT(s.transactions, s.operations);
    j.reset();
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.events_checked, threads * per_thread);
}

TEST_F(JournalTest, MigrationsSetTheSchemaVersion) {
    write_events(1);
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("PRAGMA user_version"), latest_schema_version());
    EXPECT_GE(latest_schema_version(), 1);
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sqlite_master WHERE name IN ('sessions','events')"),
              2);
}

TEST_F(JournalTest, NewerSchemaIsAClearError) {
    write_events(1);
    sql("PRAGMA user_version = 999");
    auto j = Journal::open(path_);
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.error().code, Errc::too_new);
    EXPECT_NE(j.error().message.find("newer than this build"), std::string::npos);
}

TEST_F(JournalTest, UnwritableJournalFailsAndLosesNothingAfter) {
    write_events(2);
    auto j = std::move(Journal::open(path_)).value();
    // Another connection holds the write lock: appends fail (busy) instead of hanging forever.
    auto other = std::move(Database::open(path_, SQLITE_OPEN_READWRITE)).value();
    sqlite3_busy_timeout(other.get(), 0);
    ASSERT_TRUE(other.exec("BEGIN IMMEDIATE").ok());
    Event e;
    e.kind = kind::granted;
    auto failed = j->append(e);
    EXPECT_FALSE(failed.ok());
    ASSERT_TRUE(other.exec("COMMIT").ok());
    auto ok = j->append(e);
    ASSERT_TRUE(ok.ok()) << ok.error().message;
    EXPECT_EQ(*ok, 3); // the failed append left no hole in the chain
    j.reset();
    EXPECT_TRUE(verify().ok);
}
