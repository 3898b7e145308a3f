#include "journal/journal.h"
#include "journal/reader.h"
#include "journal/system_journal.h"
#include "journal/verify.h"
#include "policy/policy.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

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

    // The first column of the first row, as text ("" when there is none).
    std::string read_value(const std::string &query) {
        auto db = Database::open(path_, SQLITE_OPEN_READONLY);
        if (!db) return {};
        auto st = db->prepare(query);
        if (!st) return {};
        auto row = st->step();
        return row && *row ? st->text(0) : std::string();
    }
    std::optional<std::string> read_detail(std::int64_t seq) {
        std::string d = read_value("SELECT detail FROM events WHERE seq = " + std::to_string(seq));
        return d.empty() ? std::nullopt : std::optional<std::string>(d);
    }
    std::string read_hash_hex(std::int64_t seq) {
        return read_value("SELECT lower(hex(hash)) FROM events WHERE seq = " + std::to_string(seq));
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

TEST_F(JournalTest, HandoffsAreTakenOnceAndKeptSessionsStayOpen) {
    {
        auto j = std::move(Journal::open(path_)).value();
        ASSERT_TRUE(j->open_session(session("a"), grant_event()).ok());
        ASSERT_TRUE(j->open_session(session("b"), grant_event()).ok());
        ASSERT_TRUE(j->open_session(session("c"), grant_event()).ok());
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("c", "release", {}, end).ok());
        // A stop that keeps bindings; an ended session takes no handoff.
        ASSERT_TRUE(j->hand_off({{"a", "{\"x\":1}"}, {"b", "{\"x\":2}"}, {"c", "{}"}}).ok());
    }
    auto j = std::move(Journal::open(path_)).value();
    auto taken = j->take_handoffs();
    ASSERT_TRUE(taken.ok());
    ASSERT_EQ(taken->size(), 2u);
    EXPECT_EQ(taken->at("a"), "{\"x\":1}");
    EXPECT_TRUE(j->take_handoffs()->empty()) << "cleared: a later crash takes nothing back";
    auto closed = j->close_open_sessions("daemon-restart", {"a"});
    ASSERT_TRUE(closed.ok());
    EXPECT_EQ(*closed, std::vector<std::string>{"b"});
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sessions WHERE id='a' AND ended_us IS NULL"), 1);
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

// append_soon (a record nobody waits for): it joins the commit of the call after it, in order,
// and a lone one is still written (the writer does not wait for company forever).
TEST_F(JournalTest, RecordsNobodyWaitsForJoinTheNextCommitInOrder) {
    auto j = std::move(Journal::open(path_)).value();
    constexpr int rounds = 50;
    std::vector<std::future<Result<std::int64_t>>> soon;
    std::vector<std::int64_t> waited;
    for (int i = 0; i < rounds; ++i) {
        auto done = std::make_shared<std::promise<Result<std::int64_t>>>();
        soon.push_back(done->get_future());
        Event a;
        a.kind = "activated";
        a.pid = i;
        j->append_soon(a, [done](Result<std::int64_t> r) { done->set_value(std::move(r)); });
        Event g;
        g.kind = kind::granted;
        g.pid = i;
        auto seq = j->append(g);
        ASSERT_TRUE(seq) << seq.error().message;
        waited.push_back(*seq);
    }
    for (int i = 0; i < rounds; ++i) {
        auto r = soon[static_cast<std::size_t>(i)].get();
        ASSERT_TRUE(r) << r.error().message;
        EXPECT_LT(*r, waited[static_cast<std::size_t>(i)]); // queued first, chained first
    }
    JournalStats s = j->stats();
    EXPECT_EQ(s.operations, static_cast<std::uint64_t>(2 * rounds));
    EXPECT_LT(s.transactions, s.operations); // they shared commits
    // Alone, it is written all the same.
    auto lone = std::make_shared<std::promise<Result<std::int64_t>>>();
    auto lone_done = lone->get_future();
    Event e;
    e.kind = "activated";
    j->append_soon(e, [lone](Result<std::int64_t> r) { lone->set_value(std::move(r)); });
    auto r = lone_done.get();
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(*r, 2 * rounds + 1);
    j.reset();
    VerifyReport v = verify(); // the anchor, written after the lone record's callback, agrees
    EXPECT_TRUE(v.ok) << v.problem;
    EXPECT_EQ(v.events_checked, 2 * rounds + 1);
}

// The anchor follows asynchronous commits at most once per interval (a rename per commit cost
// the writer more than the commit's own work, #54), at once for a synchronous call, and at
// close: never left behind for good.
TEST_F(JournalTest, TheAnchorFollowsAsyncCommitsAtMostOncePerIntervalAndAtClose) {
    auto async_append = [](Journal &j, int pid) {
        auto p = std::make_shared<std::promise<Result<std::int64_t>>>();
        auto f = p->get_future();
        Event e;
        e.kind = kind::granted;
        e.pid = pid;
        j.append_async(e, [p](Result<std::int64_t> r) { p->set_value(std::move(r)); });
        return f.get(); // each waited for in turn, as one client's grants are
    };
    {
        auto j = std::move(Journal::open(path_, std::chrono::hours(1))).value();
        for (int i = 0; i < 20; ++i)
            ASSERT_TRUE(async_append(*j, i));
        // The first commit's anchor only: the interval has not passed since.
        EXPECT_EQ(j->stats().anchor_writes, 1u);
        EXPECT_EQ(verify().anchor_seq, 1);
        // A synchronous call gets the anchor before it returns.
        Event e;
        e.kind = kind::denied;
        auto seq = j->append(e);
        ASSERT_TRUE(seq) << seq.error().message;
        EXPECT_EQ(j->stats().anchor_writes, 2u);
        EXPECT_EQ(verify().anchor_seq, *seq);
        for (int i = 0; i < 5; ++i)
            ASSERT_TRUE(async_append(*j, 100 + i));
        EXPECT_EQ(j->stats().anchor_writes, 2u);
    } // closing writes the anchor that was owed
    VerifyReport closed = verify();
    EXPECT_TRUE(closed.ok) << closed.problem;
    EXPECT_TRUE(closed.anchor_checked);
    EXPECT_EQ(closed.anchor_seq, closed.events_checked);

    // With a short interval the anchor catches up on its own once the commits stop.
    auto j = std::move(Journal::open(path_, std::chrono::milliseconds(20))).value();
    std::int64_t last = 0;
    for (int i = 0; i < 5; ++i) {
        auto r = async_append(*j, 200 + i);
        ASSERT_TRUE(r);
        last = *r;
    }
    // A condition, not a time: the writer's own wait ends the interval.
    for (int spins = 0; verify().anchor_seq != last && spins < 60000; ++spins)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(verify().anchor_seq, last);
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

// A journal at the current schema whose events table is gone (edited by hand): opening it is an
// error naming the table, not an exception out of the writer's constructor.
TEST_F(JournalTest, AJournalWithoutItsEventsTableIsAnErrorNotAThrow) {
    write_events(1);
    tamper("DROP TABLE events");
    auto j = Journal::open(path_);
    ASSERT_FALSE(j.ok());
    EXPECT_NE(j.error().message.find("events"), std::string::npos) << j.error().message;
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

TEST_F(JournalTest, TruncatedTailIsFoundThroughTheAnchor) {
    write_events(10);
    EXPECT_TRUE(fs::exists(anchor_path(path_)));
    EXPECT_TRUE(verify().anchor_checked);
    tamper("DELETE FROM events WHERE seq > 7"); // the chain itself still looks whole
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 8);
    EXPECT_NE(r.problem.find("truncated"), std::string::npos) << r.problem;
}

TEST_F(JournalTest, RewrittenHeadDiffersFromTheAnchor) {
    write_events(4);
    // Rewrite event 4 consistently (a forger can recompute a keyless hash), but the anchor
    // outside the database still holds the old head.
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READWRITE)).value();
    auto st = db.prepare("SELECT prev_hash FROM events WHERE seq = 4");
    ASSERT_TRUE(st.ok() && *st->step());
    Hash prev{};
    std::string blob = st->blob(0);
    std::copy(blob.begin(), blob.end(), prev.begin());
    Event e;
    e.at_us = 1;
    e.kind = kind::granted;
    Hash forged = chain_hash(prev, 4, e);
    std::string sql =
        "DROP TRIGGER events_no_update; UPDATE events SET at_us = 1, kind = 'request-granted', "
        "uid = NULL, reason = NULL, hash = x'" +
        to_hex(forged) + "' WHERE seq = 4";
    ASSERT_TRUE(db.exec(sql).ok());
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 4);
    EXPECT_NE(r.problem.find("anchor"), std::string::npos) << r.problem;
}

TEST_F(JournalTest, PruningKeepsTheRestVerifiable) {
    {
        auto j = std::move(Journal::open(path_)).value();
        ASSERT_TRUE(j->open_session(session("live"), grant_event()).ok()); // stays open
        for (int i = 0; i < 20; ++i) {
            Event e;
            e.kind = kind::denied;
            e.uid = i;
            ASSERT_TRUE(j->append(e).ok());
        }
        // Everything but the last 5 may go, except the open session's trail (event 1).
        auto pruned = j->prune(std::nullopt, 5);
        ASSERT_TRUE(pruned.ok()) << pruned.error().message;
        EXPECT_EQ(*pruned, 0) << "the open session's grant is event 1: nothing before it goes";
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("live", "release", {}, end).ok());
        pruned = j->prune(std::nullopt, 5);
        ASSERT_TRUE(pruned.ok());
        EXPECT_EQ(*pruned, 22 - 5);
    }
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.first_seq, 18);
    EXPECT_TRUE(r.anchor_checked);
    // Tampering after a prune is still found.
    tamper("UPDATE events SET uid = 99 WHERE seq = 20");
    EXPECT_EQ(verify().first_bad_seq, 20);
}

TEST_F(JournalTest, DeletedHeadWithoutACheckpointOrWithAForgedOneIsFound) {
    write_events(10);
    tamper("DELETE FROM events WHERE seq <= 3");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 4);
    EXPECT_NE(r.problem.find("no retention checkpoint"), std::string::npos) << r.problem;
    // A checkpoint row made by hand, with no retention-prune event in the chain, is forged.
    sql("INSERT INTO checkpoints (seq, hash, pruned_at_us, events) SELECT 3, prev_hash, 0, 3 "
        "FROM events WHERE seq = 4");
    r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.problem.find("forged"), std::string::npos) << r.problem;
}

TEST_F(JournalTest, ReaderFiltersAndReports) {
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 6; ++i) {
            Session s = session("s" + std::to_string(i));
            s.uid = 1000 + static_cast<std::uint32_t>(i % 2);
            s.netdev = i < 4 ? "eth2" : "eth3";
            s.started_us = 1'000'000 * (i + 1);
            Event g = grant_event();
            g.uid = s.uid;
            g.detail = R"({"netdev":")" + s.netdev + R"("})";
            ASSERT_TRUE(j->open_session(s, g).ok());
            Event end;
            end.kind = kind::ended;
            end.uid = s.uid;
            end.detail = R"({"rx_bytes":100})";
            ASSERT_TRUE(
                j->close_session(s.id, i == 5 ? "revoke" : "release", {100, 1, 0}, end).ok());
        }
        Event denied;
        denied.kind = kind::denied;
        denied.uid = 1001;
        denied.rule = "no-guests";
        denied.decision = "deny";
        denied.detail = R"({"netdev":"eth2"})";
        ASSERT_TRUE(j->append(denied).ok());
        ASSERT_TRUE(j->append(denied).ok());
        // 5 more denials of uid 1001, journaled as a count (the daemon's coalescing).
        Event coalesced;
        coalesced.kind = kind::coalesced;
        coalesced.uid = 1001;
        coalesced.decision = kind::denied;
        coalesced.detail = R"({"kind":"request-denied","count":5})";
        ASSERT_TRUE(j->append(coalesced).ok());
        coalesced.decision = kind::activate_refused; // not a request denial
        coalesced.detail = R"({"kind":"activate-refused","count":7})";
        ASSERT_TRUE(j->append(coalesced).ok());
    }
    auto r = std::move(JournalReader::open(path_)).value();
    std::vector<std::string> ids;
    Filter f;
    f.uid = 1000;
    f.netdev = "eth2";
    ASSERT_TRUE(r.sessions(f, [&](const Session &s) {
                     ids.push_back(s.id);
                     return true;
                 }).ok());
    EXPECT_EQ(ids, (std::vector<std::string>{"s0", "s2"}));
    ids.clear();
    Filter window;
    window.since_us = 2'000'000;
    window.until_us = 4'000'000;
    ASSERT_TRUE(r.sessions(window, [&](const Session &s) {
                     ids.push_back(s.id);
                     return true;
                 }).ok());
    EXPECT_EQ(ids, (std::vector<std::string>{"s1", "s2"}));
    int denials = 0;
    Filter d;
    d.decision = "deny";
    d.netdev = "eth2";
    ASSERT_TRUE(r.events(d, [&](const StoredEvent &) {
                     ++denials;
                     return true;
                 }).ok());
    EXPECT_EQ(denials, 2);
    auto ended = r.session("s5");
    ASSERT_TRUE(ended.ok() && ended->has_value());
    EXPECT_EQ((*ended)->end_reason, "revoke");
    auto rep = r.report({});
    ASSERT_TRUE(rep.ok());
    ASSERT_EQ(rep->by_user.size(), 2u);
    EXPECT_EQ(rep->by_user[1].key, "1001");
    EXPECT_EQ(rep->by_user[1].sessions, 3);
    EXPECT_EQ(rep->by_user[1].denials, 2);
    // Counted only (refusals-coalesced): no decision is recorded, so not called denials.
    EXPECT_EQ(rep->by_user[1].other_refusals,
              (std::map<std::string, std::int64_t>{{"coalesced", 5}}));
    EXPECT_EQ(rep->by_user[1].rx_bytes, 300);
    ASSERT_EQ(rep->by_netdev.size(), 2u);
    EXPECT_EQ(rep->by_netdev[0].key, "eth2");
    EXPECT_EQ(rep->by_netdev[0].sessions, 4);
    ASSERT_EQ(rep->denied_by_rule.size(), 1u);
    EXPECT_EQ(rep->denied_by_rule[0].rule, "no-guests");
    EXPECT_EQ(rep->denied_by_rule[0].count, 2);
    EXPECT_TRUE(rep->quota_by_rule.empty());
}

// #16, 7: each refusal counts as what it was, with its device and hour.
TEST_F(JournalTest, ReportTellsRefusalsApartPerGpuAndHour) {
    constexpr std::int64_t hour = 3600LL * 1000000;
    {
        auto j = std::move(Journal::open(path_)).value();
        Session s = session("s0");
        s.gpu = "gpu-a";
        s.started_us = 10 * hour + 5;
        ASSERT_TRUE(j->open_session(s, grant_event()).ok());
        Event end;
        end.kind = kind::ended;
        end.at_us = 12 * hour + 1;
        end.detail = R"({"rx_bytes":700})";
        ASSERT_TRUE(j->close_session("s0", "release", {700, 1, 0}, end).ok());
        auto refuse = [&](std::optional<std::string> rule, const char *decision, const char *gpu,
                          std::int64_t at) {
            Event e;
            e.kind = kind::denied;
            e.at_us = at;
            e.uid = 1000;
            e.rule = std::move(rule);
            e.decision = decision;
            e.detail = std::string(R"({"netdev":"knodsim0","gpu":")") + gpu + "\"}";
            ASSERT_TRUE(j->append(e).ok());
        };
        refuse(std::nullopt, "deny", "gpu-b", 10 * hour + 6); // no rule matched
        refuse(std::nullopt, "deny", "gpu-b", 10 * hour + 7);
        refuse("sim-local", "quota-exceeded", "gpu-a", 10 * hour + 8);
        refuse("sim-local", "isolation-violation", "gpu-b", 12 * hour + 2);
    }
    auto r = std::move(JournalReader::open(path_)).value();
    auto rep = r.report({});
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    EXPECT_EQ(rep->totals.denials, 2);
    EXPECT_EQ(rep->totals.quota_refusals, 1);
    EXPECT_EQ(rep->totals.other_refusals_total(), 1);
    ASSERT_EQ(rep->denied_by_rule.size(), 1u);
    EXPECT_EQ(rep->denied_by_rule[0].rule, std::nullopt); // the default deny, kept
    EXPECT_EQ(rep->denied_by_rule[0].count, 2);
    ASSERT_EQ(rep->quota_by_rule.size(), 1u);
    EXPECT_EQ(rep->quota_by_rule[0].rule, "sim-local");
    ASSERT_EQ(rep->by_gpu.size(), 2u);
    EXPECT_EQ(rep->by_gpu[0].key, "gpu-a");
    EXPECT_EQ(rep->by_gpu[0].sessions, 1);
    EXPECT_EQ(rep->by_gpu[0].rx_bytes, 700);
    EXPECT_EQ(rep->by_gpu[0].quota_refusals, 1);
    EXPECT_EQ(rep->by_gpu[1].denials, 2);
    ASSERT_EQ(rep->timeline.size(), 2u);
    EXPECT_EQ(rep->timeline[0].first, 10 * hour);
    EXPECT_EQ(rep->timeline[0].second.sessions, 1);
    EXPECT_EQ(rep->timeline[0].second.denials, 2);
    EXPECT_EQ(rep->timeline[1].first, 12 * hour);
    EXPECT_EQ(rep->timeline[1].second.rx_bytes, 700);
    Filter only;
    only.gpu = "gpu-b";
    auto b = r.report(only);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->totals.sessions, 0);
    EXPECT_EQ(b->totals.denials, 2);
    EXPECT_EQ(b->totals.quota_refusals, 0);
}

// A pod's namespace comes from each event's detail.pod; a revocation (an admin's event, naming
// no pod) counts under its session's grant; a crafted non-string namespace is none.
TEST_F(JournalTest, ReportCountsPerKubernetesNamespace) {
    {
        auto j = std::move(Journal::open(path_)).value();
        Event grant = grant_event();
        grant.detail =
            R"({"netdev":"knodsim0","gpu":"sim0","pod":{"namespace":"team-a","name":"p"}})";
        ASSERT_TRUE(j->open_session(session("s1"), grant).ok());
        Event revoke;
        revoke.kind = kind::revoked;
        revoke.uid = 0;
        revoke.session_id = "s1";
        ASSERT_TRUE(j->append(revoke).ok());
        Event claims; // an event of the session naming another pod counts under the grant's
        claims.kind = kind::revoked;
        claims.uid = 0;
        claims.session_id = "s1";
        claims.detail = R"({"pod":{"namespace":"team-z"}})";
        ASSERT_TRUE(j->append(claims).ok());
        Event end; // no pod (a session taken back across a restart): its bytes, the grant's pod
        end.kind = kind::ended;
        end.detail = R"({"rx_bytes":300})";
        ASSERT_TRUE(j->close_session("s1", "revoke", {300, 1, 0}, end).ok());
        ASSERT_TRUE(j->open_session(session("s2"), grant_event()).ok()); // a host process
        for (const char *detail :
             {R"({"pod":{"namespace":"team-b"}})", R"({"pod":{"namespace":7}})",
              R"({"pod":{"namespace":{"x":1}}})", R"({"pod":"team-c"})"}) {
            Event e;
            e.kind = kind::denied;
            e.uid = 0;
            e.decision = "deny";
            e.rule = "no-team-b";
            e.detail = detail;
            ASSERT_TRUE(j->append(e).ok());
        }
    }
    auto r = std::move(JournalReader::open(path_)).value();
    auto rep = r.report({});
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    EXPECT_EQ(rep->totals.sessions, 2);
    EXPECT_EQ(rep->totals.denials, 4);
    ASSERT_EQ(rep->by_k8s_namespace.size(), 2u);
    EXPECT_EQ(rep->by_k8s_namespace[0].key, "team-a");
    EXPECT_EQ(rep->by_k8s_namespace[0].sessions, 1);
    EXPECT_EQ(rep->by_k8s_namespace[0].rx_bytes, 300);
    EXPECT_EQ(rep->by_k8s_namespace[0].revocations, 2);
    EXPECT_EQ(rep->by_k8s_namespace[1].key, "team-b");
    EXPECT_EQ(rep->by_k8s_namespace[1].denials, 1);
}

TEST_F(JournalTest, ACopyIsReadWithoutWritingAnything) {
    write_events(5);
    fs::path copy_dir = dir_ / "copy";
    fs::create_directories(copy_dir);
    fs::copy_file(path_, copy_dir / "journal.db");
    auto before = std::distance(fs::directory_iterator(copy_dir), fs::directory_iterator{});
    ASSERT_EQ(before, 1);
    auto r = JournalReader::open((copy_dir / "journal.db").string());
    ASSERT_TRUE(r.ok()) << r.error().message;
    int n = 0;
    ASSERT_TRUE(r->events({}, [&](const StoredEvent &) {
                     ++n;
                     return true;
                 }).ok());
    EXPECT_EQ(n, 5);
    auto v = verify_chain((copy_dir / "journal.db").string(), {}, {}, AnchorUse::ignore);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok);
    EXPECT_EQ(std::distance(fs::directory_iterator(copy_dir), fs::directory_iterator{}), 1)
        << "no -wal, -shm or anything else appeared beside the copy";
}

TEST_F(JournalTest, AMissingAnchorFailsUnlessIgnored) {
    write_events(6);
    tamper("DELETE FROM events WHERE seq > 4");
    fs::remove(anchor_path(path_)); // hides the truncation from the chain alone
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.problem.find("no anchor file"), std::string::npos) << r.problem;
    auto alone = verify_chain(path_, {}, {}, AnchorUse::ignore);
    ASSERT_TRUE(alone.ok());
    EXPECT_TRUE(alone->ok) << alone->problem;
    EXPECT_FALSE(alone->anchor_checked);
}

// The limit docs/audit.md states: rolling back the database and its anchor together leaves a
// consistent older journal, which verifies; only a head kept out of reach (--anchor) finds it.
TEST_F(JournalTest, ARollbackOfDatabaseAndAnchorNeedsAnAnchorKeptElsewhere) {
    write_events(5);
    fs::copy_file(path_, dir_ / "old.db");
    fs::copy_file(anchor_path(path_), dir_ / "old.anchor");
    write_events(5); // appends: events 6-10
    std::string offhost = (dir_ / "offhost.anchor").string();
    fs::copy_file(anchor_path(path_), offhost);
    fs::copy_file(dir_ / "old.db", path_, fs::copy_options::overwrite_existing);
    fs::copy_file(dir_ / "old.anchor", anchor_path(path_), fs::copy_options::overwrite_existing);
    VerifyReport local = verify();
    EXPECT_TRUE(local.ok) << "the documented limit of a keyless chain: " << local.problem;
    EXPECT_EQ(local.events_checked, 5);
    auto kept = verify_chain(path_, {}, offhost);
    ASSERT_TRUE(kept.ok()) << kept.error().message;
    EXPECT_FALSE(kept->ok);
    EXPECT_NE(kept->problem.find("truncated"), std::string::npos) << kept->problem;
}

TEST_F(JournalTest, AMalformedAnchorIsAnErrorNotACrash) {
    write_events(3);
    for (const char *text : {"", "{", "[]", R"({"seq": "3", "hash": "00"})", R"({"seq": 3})",
                             R"({"seq": 3, "hash": 7})", R"({"seq": -1, "hash": "00"})",
                             R"({"seq": 3, "hash": "not hex"})"}) {
        std::ofstream(anchor_path(path_), std::ios::trunc) << text;
        auto r = verify_chain(path_);
        ASSERT_FALSE(r.ok()) << text;
        EXPECT_EQ(r.error().code, Errc::corrupt) << text;
        EXPECT_NE(r.error().message.find("malformed"), std::string::npos) << r.error().message;
    }
}

TEST_F(JournalTest, PathsAreFileNamesNotUris) {
    EXPECT_EQ(file_uri("/a b/c%41#?.db", "mode=ro"), "file:///a%20b/c%2541%23%3F.db?mode=ro");
    EXPECT_EQ(file_uri("//x"), "file:////x");
    EXPECT_EQ(file_uri("rel:x"), "file:rel%3Ax");
    // A journal whose name holds URI syntax is read, and its intact neighbour (the file the
    // URI reading names) is not.
    write_events(3);
    std::string odd = (dir_ / "j%41#x?y.db").string();
    fs::copy_file(path_, odd);
    fs::copy_file(anchor_path(path_), anchor_path(odd));
    auto db = Database::open(odd, SQLITE_OPEN_READWRITE);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(
        db->exec("DROP TRIGGER events_no_update; UPDATE events SET uid = 1 WHERE seq = 2").ok());
    auto r = verify_chain(odd);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->first_bad_seq, 2);
}

TEST_F(JournalTest, AnUnreadableJournalSaysWhy) {
    auto r = JournalReader::open((dir_ / "none.db").string());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::not_found);
    auto d = JournalReader::open(dir_.string());
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.error().message.find("not a regular file"), std::string::npos) << d.error().message;
}

TEST_F(JournalTest, AWalWithoutShmIsReadAndNothingIsCreatedBesideIt) {
    write_events(4);
    fs::path copy_dir = dir_ / "copy";
    fs::create_directories(copy_dir);
    std::string copy = (copy_dir / "journal.db").string();
    {
        // An edit that lives only in the -wal, copied as cp would copy a live journal.
        auto db = std::move(Database::open(path_, SQLITE_OPEN_READWRITE)).value();
        ASSERT_TRUE(db.exec("PRAGMA wal_autocheckpoint=0; DROP TRIGGER events_no_update; "
                            "UPDATE events SET uid = 5 WHERE seq = 3")
                        .ok());
        fs::copy_file(path_, copy);
        fs::copy_file(path_ + "-wal", copy + "-wal");
        fs::copy_file(anchor_path(path_), anchor_path(copy));
    }
    auto r = verify_chain(copy);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->first_bad_seq, 3) << "the -wal was read";
    EXPECT_EQ(std::distance(fs::directory_iterator(copy_dir), fs::directory_iterator{}), 3)
        << "no -shm appeared beside the copy";
}

// Issue #16, 1: the tables beside the chain are covered by it. A journal with sessions closed
// (with counters), one still open, a policy load and a daemon start; then each edit an attacker
// with write access could make, on a fresh copy, must fail verify naming what was changed.
class CoveredTablesTest : public JournalTest {
  protected:
    void SetUp() override {
        JournalTest::SetUp();
        auto j = std::move(Journal::open(path_)).value();
        Event start;
        start.kind = kind::daemon_start;
        start.uid = 0;
        start.pid = 1;
        start.detail = nlohmann::json{{"journal_id", j->identity().journal_id},
                                      {"machine_id", j->identity().machine_id},
                                      {"hostname", j->identity().hostname}}
                           .dump();
        ASSERT_TRUE(j->append_policy_load(start, {policy_digest_, policy_text_}).ok());
        for (int i = 0; i < 4; ++i) {
            Session s = session("b" + std::to_string(i));
            s.uid = 1000 + static_cast<std::uint32_t>(i);
            s.exe = "/usr/bin/app" + std::to_string(i);
            s.unit = "app.service";
            s.flows = {"udp * -> *:500" + std::to_string(i), "udp * -> *:600" + std::to_string(i)};
            Event g = grant_event();
            g.detail = R"({"netdev":"knodsim0","policy":")" + policy_digest_ + R"("})";
            auto seq = j->open_session(s, g);
            ASSERT_TRUE(seq.ok()) << seq.error().message;
            grant_seq_[s.id] = *seq;
        }
        Event end;
        end.kind = kind::ended;
        for (int i = 0; i < 3; ++i) {
            std::string id = "b" + std::to_string(i);
            auto seq = j->close_session(id, i == 2 ? "revoke" : "release",
                                        {1234u + static_cast<unsigned>(i), 7, 1}, end);
            ASSERT_TRUE(seq.ok()) << seq.error().message;
            close_seq_[id] = *seq;
        }
        ASSERT_TRUE(j->prune(std::nullopt, 1000).ok()); // nothing goes: no checkpoint yet
    }

    // Verifies a copy of the journal after `statement`.
    VerifyReport tampered(const std::string &statement) {
        std::string copy = (dir_ / ("t" + std::to_string(++copies_) + ".db")).string();
        fs::copy_file(path_, copy);
        fs::copy_file(anchor_path(path_), anchor_path(copy));
        {
            auto db = Database::open(copy, SQLITE_OPEN_READWRITE);
            EXPECT_TRUE(db.ok());
            auto r = db->exec(statement);
            EXPECT_TRUE(r.ok()) << statement << ": " << r.error().message;
        }
        auto r = verify_chain(copy);
        EXPECT_TRUE(r.ok()) << r.error().message;
        return r ? *r : VerifyReport{};
    }
    void expect_found(const std::string &statement, const std::string &says,
                      std::int64_t seq = -1) {
        VerifyReport r = tampered(statement);
        EXPECT_FALSE(r.ok) << statement;
        EXPECT_NE(r.problem.find(says), std::string::npos) << statement << "\n" << r.problem;
        if (seq >= 0) {
            EXPECT_EQ(r.first_bad_seq, seq) << statement;
        }
    }

    std::string policy_text_ = "# file: /etc/knod/policy.toml\n[[rule]]\nname = \"x\"\n";
    std::string policy_digest_ = policy::policy_digest(policy_text_);
    std::map<std::string, std::int64_t> grant_seq_, close_seq_;
    int copies_ = 0;
};

TEST_F(CoveredTablesTest, AnIntactJournalVerifiesWithEveryRowChecked) {
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.sessions_checked, 4);
    EXPECT_EQ(r.sessions_not_covered, 0);
    EXPECT_EQ(r.policies_checked, 1);
    // The detail shapes exports flatten: "session", "end", "policy" (and the caller's own keys).
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    auto st = db.prepare("SELECT detail FROM events WHERE session_id = 'b2' ORDER BY seq");
    ASSERT_TRUE(st.ok() && *st->step());
    auto grant = nlohmann::json::parse(st->text(0));
    EXPECT_EQ(grant["netdev"], "knodsim0");
    EXPECT_EQ(grant["policy"], policy_digest_);
    EXPECT_EQ(grant["session"]["uid"], 1002);
    EXPECT_EQ(grant["session"]["flows"], (nlohmann::json{"udp * -> *:5002", "udp * -> *:6002"}));
    EXPECT_EQ(grant["session"].size(), 13u);
    ASSERT_TRUE(*st->step());
    auto end = nlohmann::json::parse(st->text(0));
    EXPECT_EQ(end["end"]["end_reason"], "revoke");
    EXPECT_EQ(end["end"]["rx_bytes"], 1236);
    EXPECT_EQ(end["end"].size(), 5u);
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM policies"), 1);
}

TEST_F(CoveredTablesTest, AnEditOfAnySessionColumnNamesTheSessionAndTheField) {
    std::int64_t grant = grant_seq_["b1"];
    // Each column audit shows, on a closed session (b1: grant, then its closing event).
    for (auto [column, value] : std::vector<std::pair<std::string, std::string>>{
             {"uid", "0"},
             {"uid", "CAST('1001' AS BLOB)"}, // 1001 to the eye, not to verify
             {"pid", "1"},
             {"exe", "'/usr/bin/other'"},
             {"unit", "'x.service'"},
             {"netdev", "'eth9'"},
             {"gpu", "'sim1'"},
             {"mode", "'rx-tx'"},
             {"region_bytes", "1"},
             {"flows", "'[\"udp * -> *:1\"]'"},
             {"flows", "'[ \"udp * -> *:5001\", \"udp * -> *:6001\"]'"}, // same value, new text
             {"key_id", "'k-2'"},
             {"rule", "'admin'"},
             {"started_us", "started_us + 1"}}) {
        expect_found("UPDATE sessions SET " + column + " = " + value + " WHERE id = 'b1'",
                     "session b1: " + column + " is ", grant);
    }
    for (auto [column, value] :
         std::vector<std::pair<std::string, std::string>>{{"ended_us", "ended_us - 1"},
                                                          {"end_reason", "'release'"},
                                                          {"rx_bytes", "999999"},
                                                          {"rx_packets", "0"},
                                                          {"dropped_packets", "0"}}) {
        expect_found("UPDATE sessions SET " + column + " = " + value + " WHERE id = 'b2'",
                     "session b2: " + column + " is ", close_seq_["b2"]);
    }
    // The issue's example, word for word in shape.
    VerifyReport r = tampered("UPDATE sessions SET rx_bytes = 999999 WHERE id = 'b0'");
    EXPECT_NE(r.problem.find("session b0: rx_bytes is 999999 in the sessions table but 1234 in "
                             "event "),
              std::string::npos)
        << r.problem;
    EXPECT_NE(r.problem.find("(edited)"), std::string::npos) << r.problem;
}

TEST_F(CoveredTablesTest, OpenAndEndedRowsMustAgreeWithTheChain) {
    // b3 is open: ending it by hand, or giving it counters, is found; so is reopening b0.
    expect_found("UPDATE sessions SET ended_us = started_us + 5, end_reason = 'release' WHERE id "
                 "= 'b3'",
                 "session b3: ended in the sessions table", grant_seq_["b3"]);
    expect_found("UPDATE sessions SET rx_bytes = 5 WHERE id = 'b3'",
                 "session b3: rx_bytes is 5 in the sessions table but 0 for a session the chain "
                 "has not closed");
    expect_found("UPDATE sessions SET ended_us = NULL WHERE id = 'b0'",
                 "session b0: closed by event");
}

TEST_F(CoveredTablesTest, DeletedAndInsertedRowsAreFound) {
    expect_found("DELETE FROM sessions WHERE id = 'b2'",
                 "session b2: its grant (event " + std::to_string(grant_seq_["b2"]) +
                     ") is in the chain but its row is missing from the sessions table (deleted)",
                 grant_seq_["b2"]);
    expect_found("INSERT INTO sessions (id, uid, pid, netdev, gpu, mode, region_bytes, flows, "
                 "key_id, rule, started_us) SELECT 'b9', uid, pid, netdev, gpu, mode, "
                 "region_bytes, flows, key_id, rule, started_us FROM sessions WHERE id = 'b1'",
                 "session b9: a row in the sessions table with no grant event in the chain "
                 "(inserted)",
                 0);
    expect_found("UPDATE sessions SET id = 'b7' WHERE id = 'b1'", "session b1: its grant");
    // Deleted and put back unchanged (another rowid, out of order): the same values, so intact.
    VerifyReport back = tampered("CREATE TEMP TABLE k AS SELECT * FROM sessions WHERE id = 'b0'; "
                                 "DELETE FROM sessions WHERE id = 'b0'; INSERT INTO sessions "
                                 "SELECT * FROM k");
    EXPECT_TRUE(back.ok) << back.problem;
    EXPECT_EQ(back.sessions_checked, 4);
}

TEST_F(CoveredTablesTest, PolicyMetaAndCheckpointEditsAreFound) {
    expect_found("UPDATE policies SET text = text || 'allow_all = true'",
                 "policy '" + policy_digest_ + "': its stored text does not match its digest");
    expect_found("DELETE FROM policies",
                 "policy '" + policy_digest_ + "': named by event 1 but its text is missing", 1);
    expect_found("UPDATE meta SET value = '00000000000000000000000000000000' WHERE key = "
                 "'journal_id'",
                 "meta.journal_id is '00000000000000000000000000000000' in the meta table", 1);
    // Schema 4 always makes the id: none left is tampering, whether or not an event names it.
    expect_found("DELETE FROM meta WHERE key = 'journal_id'", "meta.journal_id is missing", 0);
    // A checkpoint: prune, then edit each field of its row, or delete it.
    {
        auto j = std::move(Journal::open(path_)).value();
        Event e;
        e.kind = kind::denied;
        for (int i = 0; i < 5; ++i)
            ASSERT_TRUE(j->append(e).ok());
        auto pruned = j->prune(std::nullopt, 3);
        ASSERT_TRUE(pruned.ok()) << pruned.error().message;
        ASSERT_GT(*pruned, 0) << "b3 is open: everything before its grant may go";
    }
    VerifyReport r = verify();
    ASSERT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.policies_checked, 1) << "the text stays when its load event is pruned";
    expect_found("UPDATE checkpoints SET events = events + 1", "checkpoint at event ");
    expect_found("UPDATE checkpoints SET pruned_at_us = 1", "pruned_at_us is 1 in the checkpoints");
    expect_found("UPDATE checkpoints SET hash = zeroblob(32)", "does not chain");
    expect_found("DELETE FROM checkpoints", "no retention checkpoint");
}

TEST_F(CoveredTablesTest, PruneTakesExactlyTheSessionsWhoseGrantItTakes) {
    {
        auto j = std::move(Journal::open(path_)).value();
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("b3", "release", {}, end).ok());
        // Through b1's grant: b0 and b1 go (b1's closing event stays in the chain).
        auto head = std::move(Database::open(path_, SQLITE_OPEN_READONLY))
                        .value()
                        .scalar("SELECT max(seq) FROM events");
        ASSERT_TRUE(head.ok());
        ASSERT_TRUE(j->prune(std::nullopt, *head - grant_seq_["b1"]).ok());
    }
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    auto st = db.prepare("SELECT group_concat(id) FROM (SELECT id FROM sessions ORDER BY id)");
    ASSERT_TRUE(st.ok() && *st->step());
    EXPECT_EQ(st->text(0), "b2,b3");
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.sessions_checked, 2);
}

// Issue #16 (red team): SQLite keeps the storage type an UPDATE gives a value, and reading it as
// text or integer coerces, so a BLOB kind hashes like the text but is not what `audit` filters
// on. Every hashed or compared value must have the type the journal writes.
TEST_F(CoveredTablesTest, AValueOfAnotherStorageTypeIsFound) {
    std::int64_t g = grant_seq_["b1"], c = close_seq_["b2"];
    for (auto [set, says, seq] : std::vector<std::tuple<std::string, std::string, std::int64_t>>{
             {"kind = CAST(kind AS BLOB) WHERE seq = " + std::to_string(g),
              "kind is stored as blob", g},
             {"session_id = CAST(session_id AS BLOB) WHERE seq = " + std::to_string(c),
              "session_id is stored as blob", c},
             {"at_us = at_us || ' UTC' WHERE seq = 4", "at_us is stored as text", 4},
             {"uid = CAST(uid AS BLOB) WHERE seq = " + std::to_string(g), "uid is stored as blob",
              g},
             {"detail = CAST(detail AS BLOB) WHERE seq = 1", "detail is stored as blob", 1},
             {"hash = CAST(hash AS TEXT) WHERE seq = 2", "hash is stored as text", 2}}) {
        expect_found("DROP TRIGGER events_no_update; UPDATE events SET " + set,
                     "event " + std::to_string(seq) + ": " + says, seq);
    }
    expect_found("UPDATE meta SET value = CAST(value AS BLOB) WHERE key = 'journal_id'",
                 "meta.journal_id is x'");
    expect_found("UPDATE policies SET text = CAST(text AS BLOB)",
                 "its stored text does not match its digest");
    expect_found("UPDATE policies SET first_loaded_us = first_loaded_us || ' UTC'",
                 "first_loaded_us is '");
}

// A table rebuilt another way reads differently from what the chain vouches for: sessions
// without its primary key holds a forged second row for b1 that `WHERE id = ?` finds first.
TEST_F(CoveredTablesTest, ARebuiltOrAlteredTableIsFound) {
    expect_found("CREATE TABLE s2 AS SELECT * FROM sessions; DROP TABLE sessions; "
                 "ALTER TABLE s2 RENAME TO sessions; INSERT INTO sessions SELECT * FROM "
                 "sessions WHERE id = 'b1'; UPDATE sessions SET uid = 0 WHERE rowid = "
                 "(SELECT max(rowid) FROM sessions); CREATE INDEX forged ON sessions (id, uid)",
                 "the sessions table is not defined as schema version 4 defines it", 0);
    expect_found("ALTER TABLE events ADD COLUMN note TEXT",
                 "the events table is not defined as schema version", 0);
    expect_found("DROP TABLE policies", "the policies table is missing", 0);
    expect_found("DROP TABLE meta", "the meta table is missing", 0);
    expect_found("CREATE TABLE p2 (digest TEXT, text TEXT, first_loaded_us INTEGER); INSERT INTO "
                 "p2 SELECT * FROM policies; INSERT INTO p2 SELECT * FROM policies; DROP TABLE "
                 "policies; ALTER TABLE p2 RENAME TO policies",
                 "the policies table is not defined");
    // A comment inside a CREATE TABLE (SQLite keeps it) is not the definition: one edited in
    // schema/ since a journal was made must not fail it.
    VerifyReport same = tampered(
        "PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = replace(sql, '-- binding "
        "id', '/* another */ -- the binding id') WHERE name = 'sessions'; PRAGMA "
        "writable_schema = OFF");
    EXPECT_TRUE(same.ok) << same.problem;
}

// Rows no event in the chain made: a policy text (with its correct digest) no load names, a
// junk checkpoint in a journal never pruned; and a policy's first load time edited.
TEST_F(CoveredTablesTest, PolicyAndCheckpointRowsNoEventMadeAreFound) {
    std::string other = policy::policy_digest("[[rule]]\nname = \"all\"\n");
    expect_found("INSERT INTO policies VALUES ('" + other + "', '[[rule]]\nname = \"all\"\n', 5)",
                 "policy '" + other + "': named by no policy load in the chain (inserted)", 0);
    expect_found("UPDATE policies SET first_loaded_us = first_loaded_us - 1", "first_loaded_us is ",
                 1);
    expect_found("INSERT INTO checkpoints VALUES (-5, x'00', 0, 0)", "checkpoint at event -5", 0);
    expect_found("INSERT INTO checkpoints VALUES (3, zeroblob(32), 1, 3)",
                 "checkpoint at event 3: no retention-prune event in the chain made it", 0);
}

// A pruned journal may keep no daemon-start: its prune events carry the journal id, and the
// meta host is the newest daemon-start's.
TEST_F(CoveredTablesTest, JournalIdAndHostInMetaAreCheckedAfterRetentionToo) {
    expect_found("UPDATE meta SET value = 'elsewhere' WHERE key = 'hostname'",
                 "meta.hostname is 'elsewhere' in the meta table", 1);
    expect_found("UPDATE meta SET value = '0123' WHERE key = 'machine_id'",
                 "meta.machine_id is '0123'", 1);
    std::int64_t prune_seq = 0;
    {
        auto j = std::move(Journal::open(path_)).value();
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("b3", "release", {}, end).ok());
        auto pruned = j->prune(std::nullopt, 1);
        ASSERT_TRUE(pruned.ok()) << pruned.error().message;
        Event e;
        e.kind = kind::denied;
        ASSERT_TRUE(j->append(e).ok()); // an older checkpoint, made by a prune pruned since
        ASSERT_TRUE(j->append(e).ok());
        ASSERT_TRUE(j->prune(std::nullopt, 1).ok());
        prune_seq = *Database::open(path_, SQLITE_OPEN_READONLY)
                         .value()
                         .scalar("SELECT max(seq) FROM events WHERE kind = 'retention-prune'");
    }
    VerifyReport r = verify();
    ASSERT_TRUE(r.ok) << r.problem;
    EXPECT_GT(r.first_seq, 1);
    expect_found("UPDATE meta SET value = '00000000000000000000000000000000' WHERE key = "
                 "'journal_id'",
                 "meta.journal_id is '00000000000000000000000000000000' in the meta table but",
                 prune_seq);
    expect_found("DELETE FROM meta WHERE key = 'journal_id'", "meta.journal_id is missing");
    // The older checkpoint is reached back from the newer; a junk one below it is not.
    expect_found("INSERT INTO checkpoints VALUES (1, zeroblob(32), 1, 1)",
                 "checkpoint at event 1: no retention-prune event in the chain made it", 0);
    expect_found("UPDATE checkpoints SET hash = CAST(hash AS TEXT)",
                 "no retention checkpoint anchors the rest");
    expect_found("UPDATE checkpoints SET hash = CAST(hash AS TEXT) WHERE seq = (SELECT min(seq) "
                 "FROM checkpoints)",
                 "not a row retention writes");
}

// A retention-prune event whose detail is not what retention writes (a rewritten chain) is a
// failure naming it, not a crash.
TEST_F(JournalTest, AMalformedPruneDetailIsAFailureNotACrash) {
    for (std::string detail :
         {R"({"pruned_through":"5"})", R"({"pruned_through":1.5})", "[]", "not json"}) {
        fs::remove(path_);
        fs::remove(anchor_path(path_));
        std::int64_t seq = 0;
        {
            auto j = std::move(Journal::open(path_)).value();
            Event e;
            e.kind = kind::prune;
            e.detail = detail;
            seq = j->append(e).value();
        }
        auto r = verify_chain(path_);
        ASSERT_TRUE(r.ok()) << r.error().message;
        EXPECT_FALSE(r->ok) << detail;
        EXPECT_EQ(r->first_bad_seq, seq) << detail;
        EXPECT_NE(r->problem.find("retention-prune"), std::string::npos) << r->problem;
    }
}

// Details and anchors nested 100,000 deep (a chain rewritten by someone who can): nlohmann
// parses them, but would destroy them recursively and overflow the stack. Verify answers.
TEST_F(JournalTest, DeeplyNestedDetailsAndAnchorsAreAnswersNotCrashes) {
    std::string deep = "{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
    for (const char *k : {kind::prune, kind::daemon_start, kind::granted}) {
        fs::remove(path_);
        fs::remove(anchor_path(path_));
        {
            auto j = std::move(Journal::open(path_)).value();
            Event e;
            e.kind = k;
            e.detail = deep;
            ASSERT_TRUE(j->append(e).ok());
        }
        auto r = verify_chain(path_);
        ASSERT_TRUE(r.ok()) << r.error().message;
        if (std::string(k) == kind::prune) {
            EXPECT_FALSE(r->ok);
        }
    }
    {
        std::ofstream out(anchor_path(path_), std::ios::trunc);
        out << deep;
    }
    auto r = verify_chain(path_);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("malformed"), std::string::npos) << r.error().message;
}

// Many sessions, some left open by a crash and closed at the next start, a prune: intact.
TEST_F(JournalTest, ManySessionsARestartAndAPruneStillVerify) {
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 400; ++i) {
            Session s = session("s" + std::to_string(i));
            s.pid = i;
            ASSERT_TRUE(j->open_session(s, grant_event()).ok());
            Event end;
            end.kind = kind::ended;
            if (i % 5) {
                ASSERT_TRUE(j->close_session(s.id, "release",
                                             {static_cast<std::uint64_t>(i) * 100, 1, 0}, end)
                                .ok());
            }
        }
    } // a crash: 80 sessions left open
    auto j = std::move(Journal::open(path_)).value();
    auto closed = j->close_open_sessions("daemon-restart");
    ASSERT_TRUE(closed.ok());
    EXPECT_EQ(closed->size(), 80u);
    EXPECT_TRUE(verify().ok);
    auto pruned = j->prune(std::nullopt, 300);
    ASSERT_TRUE(pruned.ok() && *pruned > 0);
    j.reset();
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(r.sessions_checked, *db.scalar("SELECT count(*) FROM sessions"));
    EXPECT_EQ(r.sessions_not_covered, 0);
}

// A session whose grant this build pruned has no row (the prune removes it with its grant),
// so a row put back for it, its closing event still in the chain, is inserted: #31 found one
// counted "not covered" while `audit sessions` and the report took its forged uid, exe and
// netdev. A row an older build's prune left is removed by this build's next prune.
TEST_F(JournalTest, ARowPutBackForASessionWhoseGrantWasPrunedIsInserted) {
    {
        auto j = std::move(Journal::open(path_)).value();
        ASSERT_TRUE(j->open_session(session("b7"), grant_event()).ok());
        for (int i = 0; i < 6; ++i) {
            Event e;
            e.kind = kind::denied;
            ASSERT_TRUE(j->append(e).ok());
        }
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("b7", "release", {100, 1, 0}, end).ok());
        Event e;
        e.kind = kind::denied;
        ASSERT_TRUE(j->append(e).ok());
        ASSERT_EQ(j->prune(std::nullopt, 2, std::nullopt).value(),
                  7); // the grant goes, the end stays
    }
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sessions"), 0) << "the prune removes the row";
    VerifyReport clean = verify();
    EXPECT_TRUE(clean.ok) << clean.problem;
    sql("INSERT INTO sessions (id, uid, pid, exe, netdev, gpu, mode, region_bytes, flows, "
        "key_id, rule, started_us, ended_us, end_reason) VALUES ('b7', 0, 1, '/usr/sbin/forged', "
        "'eth-forged', 'gpu-forged', 'rx-tx', 1, '[\"udp * -> *:22\"]', 'k', 'root-rule', "
        "1000000, 2000000, 'release')");
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(r.chain_intact);
    EXPECT_NE(r.problem.find("whose grant event was pruned"), std::string::npos) << r.problem;
    EXPECT_NE(r.problem.find("(inserted)"), std::string::npos) << r.problem;
}

// A session an older build granted (no "session" values in its grant) is not failed: verify
// counts it as not covered.
TEST_F(JournalTest, SessionsFromAnOlderBuildAreCountedAsNotCovered) {
    {
        auto j = std::move(Journal::open(path_)).value();
        Event g = grant_event();
        g.session_id = "old";
        ASSERT_TRUE(j->append(g).ok());
        ASSERT_TRUE(j->open_session(session("new"), grant_event()).ok());
    }
    sql("INSERT INTO sessions (id, uid, pid, netdev, gpu, mode, region_bytes, flows, key_id, "
        "rule, started_us) VALUES ('old', 1000, 1, 'knodsim0', 'sim0', 'rx-only', 4096, '[]', "
        "'k', 'r', 1)");
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.sessions_not_covered, 1);
    EXPECT_EQ(r.sessions_checked, 1);
}

// Strings verify takes the slow path for (non-ASCII, escapes, bytes that are not UTF-8 and are
// stored as U+FFFD in both the row and the event) still match, and an edit is still found.
TEST_F(JournalTest, UnusualStringsInSessionRowsAreCoveredToo) {
    {
        auto j = std::move(Journal::open(path_)).value();
        Session s = session("u1");
        s.exe = "/opt/caf\xc3\xa9/\\x1b\"q\"";
        s.unit = std::string("bad\xff\x01", 5);
        ASSERT_TRUE(j->open_session(s, grant_event()).ok());
    }
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.sessions_checked, 1);
    sql("UPDATE sessions SET exe = '/opt/cafe' WHERE id = 'u1'");
    r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.problem.find("session u1: exe is '/opt/cafe' in the sessions table"),
              std::string::npos)
        << r.problem;
}

// #54: values that are all UTF-8 skip the JSON round trip (as_written); they must still reach the
// row exactly as given (control characters, quotes, backslashes, non-ASCII) and agree with the
// event's detail, at the grant and at the end.
TEST_F(JournalTest, Utf8SessionValuesReachTheRowAsGivenAndMatchTheEvent) {
    const std::string exe = "/opt/caf\xc3\xa9/\\x1b\"q\"\x01\x7f\xf0\x9f\x90\xa7";
    {
        auto j = std::move(Journal::open(path_)).value();
        Session s = session("u2");
        s.exe = exe;
        ASSERT_TRUE(j->open_session(s, grant_event()).ok());
        Event end;
        end.kind = kind::ended;
        ASSERT_TRUE(j->close_session("u2", "release \xc3\xa9", {7, 1, 0}, end).ok());
    }
    std::string hex;
    for (unsigned char c : exe) {
        static const char digits[] = "0123456789abcdef";
        hex += digits[c >> 4];
        hex += digits[c & 15];
    }
    auto db = std::move(Database::open(path_, SQLITE_OPEN_READONLY)).value();
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sessions WHERE id='u2' AND exe = CAST(x'" + hex +
                         "' AS TEXT) AND end_reason = CAST(x'72656c6561736520c3a9' AS TEXT)"),
              1);
    VerifyReport r = verify();
    EXPECT_TRUE(r.ok) << r.problem;
    EXPECT_EQ(r.sessions_checked, 1);
}

// #16 item 2: the commit listener (the daemon's copy of the head to the system journal) hears
// every commit that adds events, with the head it made. It was never called: the head before
// the batch was taken after the batch's appends.
TEST_F(JournalTest, TheCommitListenerHearsEachNewHead) {
    auto j = Journal::open(path_);
    ASSERT_TRUE(j.ok()) << j.error().message;
    std::mutex mu;
    std::vector<std::pair<std::int64_t, std::string>> heads;
    (*j)->set_commit_listener([&](std::int64_t seq, const Hash &head) {
        std::lock_guard lock(mu);
        heads.emplace_back(seq, to_hex(head));
    });
    for (int i = 0; i < 3; ++i) {
        Event e;
        e.kind = kind::reload;
        e.reason = "event " + std::to_string(i);
        ASSERT_TRUE((*j)->append(e).ok());
    }
    j->reset();
    std::lock_guard lock(mu);
    ASSERT_EQ(heads.size(), 3u);
    EXPECT_EQ(heads.back().first, 3);
    VerifyReport r = verify_chain(path_, {}, {}, AnchorUse::ignore).value();
    EXPECT_EQ(heads.back().second, r.head_hash);
}

// Retention records its settings and the newest pruned event's time in the prune event (#31):
// an honest prune by age passes verify, and the auditor's --retention up to its real age; an
// anchor naming a pruned event is accepted under --retention when that prune is in the chain.
TEST_F(JournalTest, AnHonestPruneByAgePassesItsOwnRetentionAndTheAuditors) {
    constexpr std::int64_t day = 86400LL * 1000000;
    std::string hash3;
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 15; ++i) {
            Event e;
            e.kind = kind::denied;
            e.uid = 1000;
            if (i < 10) e.at_us = now_us() - 10 * day; // ten days old
            ASSERT_TRUE(j->append(e).ok());
        }
        auto pruned = j->prune(std::nullopt, std::nullopt, day);
        ASSERT_TRUE(pruned.ok()) << pruned.error().message;
        EXPECT_EQ(*pruned, 10);
    }
    auto d = nlohmann::json::parse(*read_detail(16));
    EXPECT_EQ(d["retention"], (nlohmann::json{{"age_us", day}, {"events", nullptr}}));
    EXPECT_LT(d["through_at_us"].get<std::int64_t>() + day, d["pruned_at_us"].get<std::int64_t>());
    EXPECT_TRUE(verify().ok) << verify().problem;
    auto as_auditor = [&](std::int64_t retention, const std::string &anchor = {}) {
        auto r = verify_chain(path_, {}, anchor, AnchorUse::require, retention);
        EXPECT_TRUE(r.ok()) << r.error().message;
        return r ? *r : VerifyReport{};
    };
    EXPECT_TRUE(as_auditor(7 * day).ok) << as_auditor(7 * day).problem;
    auto strict = as_auditor(30 * day);
    EXPECT_FALSE(strict.ok);
    EXPECT_EQ(strict.first_bad_seq, 16);
    EXPECT_NE(strict.problem.find("younger than --retention 30d"), std::string::npos)
        << strict.problem;
    // An anchor kept off the host at event 3, pruned since with no checkpoint there.
    std::string off_host = (dir_ / "off-host.anchor").string();
    std::ofstream(off_host) << R"({"seq": 3, "hash": ")" << std::string(64, 'a') << "\"}";
    auto refused = verify_chain(path_, {}, off_host);
    ASSERT_TRUE(refused.ok());
    EXPECT_FALSE(refused->ok) << "without --allow-pruned-anchor or --retention";
    // Copied off the host just now: younger than 7 days, so no such retention pruned it.
    auto fresh = as_auditor(7 * day, off_host);
    EXPECT_FALSE(fresh.ok);
    EXPECT_NE(fresh.problem.find("younger than --retention 7d"), std::string::npos)
        << fresh.problem;
    // Copied (with its time kept) when event 3 was written, 10 days ago: accepted.
    std::filesystem::last_write_time(off_host, std::filesystem::file_time_type::clock::now() -
                                                   std::chrono::hours(24 * 10));
    auto accepted = as_auditor(7 * day, off_host);
    EXPECT_TRUE(accepted.ok) << accepted.problem;
    EXPECT_TRUE(accepted.anchor_pruned_by_retention);
}

// A prune the retention it records would not make: events a second old, under an age setting
// of a day and no event count, written as a forger writes it (a consistent chain, a
// checkpoint, the events gone). Verify reports it (not ok), naming the prune event.
TEST_F(JournalTest, APruneYoungerThanItsRecordedRetentionIsReported) {
    constexpr std::int64_t day = 86400LL * 1000000;
    for (auto [age, events, ok] : {std::tuple{day, nlohmann::json(), false},
                                   std::tuple{day, nlohmann::json(3), true}, // kept by count
                                   std::tuple{std::int64_t{0}, nlohmann::json(), false}}) {
        fs::remove(path_);
        fs::remove(anchor_path(path_));
        write_events(0);
        {
            auto j = std::move(Journal::open(path_)).value();
            for (int i = 0; i < 10; ++i) {
                Event e;
                e.kind = kind::denied;
                e.uid = 1000;
                ASSERT_TRUE(j->append(e).ok());
            }
        }
        std::string hash5 = read_hash_hex(5);
        std::int64_t at5 = std::stoll(read_value("SELECT at_us FROM events WHERE seq = 5"));
        std::int64_t now = now_us();
        nlohmann::json retention{{"age_us", age ? nlohmann::json(age) : nlohmann::json()},
                                 {"events", events}};
        {
            auto j = std::move(Journal::open(path_)).value();
            Event p;
            p.kind = kind::prune;
            p.at_us = now;
            p.detail = nlohmann::json{{"pruned_through", 5},
                                      {"hash", hash5},
                                      {"events", 5},
                                      {"pruned_at_us", now},
                                      {"through_at_us", at5},
                                      {"retention", retention},
                                      {"journal_id", j->identity().journal_id}}
                           .dump();
            ASSERT_EQ(j->append(p).value(), 11);
        }
        sql("INSERT INTO checkpoints (seq, hash, pruned_at_us, events) VALUES (5, x'" + hash5 +
            "', " + std::to_string(now) +
            ", 5); DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq <= 5; CREATE "
            "TRIGGER events_no_delete BEFORE DELETE ON events BEGIN SELECT RAISE(ABORT, 'events "
            "are append-only'); END;");
        VerifyReport r = verify();
        EXPECT_EQ(r.ok, ok) << r.problem;
        if (!ok) {
            EXPECT_EQ(r.first_bad_seq, 11);
            EXPECT_NE(r.problem.find("younger than the retention it records"), std::string::npos)
                << r.problem;
        }
    }
}

// A prune that records no retention after a daemon-start that records the daemon's: posing as
// an older build's prune to escape the check is malformed.
TEST_F(JournalTest, APruneWithoutItsRetentionAfterAStartThatRecordsItIsMalformed) {
    {
        auto j = std::move(Journal::open(path_)).value();
        Event start;
        start.kind = kind::daemon_start;
        start.detail = nlohmann::json{{"retention", {{"age_us", nullptr}, {"events", nullptr}}},
                                      {"journal_id", j->identity().journal_id}}
                           .dump();
        ASSERT_TRUE(j->append(start).ok());
        Event e;
        e.kind = kind::denied;
        ASSERT_TRUE(j->append(e).ok());
        Event p;
        p.kind = kind::prune;
        p.detail = R"({"pruned_through": 1, "events": 1})";
        ASSERT_TRUE(j->append(p).ok());
    }
    VerifyReport r = verify();
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.first_bad_seq, 3);
    EXPECT_NE(r.problem.find("records no retention setting"), std::string::npos) << r.problem;
}

// A system-journal record of an event pruned since: under --retention AGE it is accepted only
// when journald received it at least AGE ago by the auditor's clock (the event was written no
// later than that, so a retention that keeps AGE may have pruned it by now), never on the
// prune's own times: the prune event lies past what it removed, and whoever rewrites the chain
// writes its times and can send a head to vouch for them (#31's red team: a wipe with a prune
// dated 2199, then with forged times and a fresh head, passed).
TEST_F(JournalTest, ASystemJournalRecordOfAPrunedEventIsHeldToTheRetention) {
    constexpr std::int64_t day = 86400LL * 1000000;
    std::int64_t written = now_us() - 10 * day;
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 15; ++i) {
            Event e;
            e.kind = kind::denied;
            if (i < 10) e.at_us = written;
            ASSERT_TRUE(j->append(e).ok());
        }
        ASSERT_EQ(j->prune(std::nullopt, std::nullopt, day).value(), 10);
    }
    auto report = verify_chain(path_, {}, {}, AnchorUse::ignore);
    ASSERT_TRUE(report.ok()) << report.error().message;
    auto check = [&](std::vector<std::int64_t> recorded_at, std::optional<std::int64_t> retention,
                     std::vector<PruneRecord> prunes) {
        auto db = Database::open(path_, SQLITE_OPEN_READONLY);
        EXPECT_TRUE(db.ok());
        std::vector<AnchorCopy> copies;
        for (auto at : recorded_at)
            copies.push_back({3, std::string(64, 'a'), at, path_, "", "", 0});
        auto c = check_anchor_copies(*db, path_, copies, false, retention, std::nullopt, prunes);
        EXPECT_TRUE(c.ok()) << c.error().message;
        return c ? *c : SystemJournalCheck{};
    };
    EXPECT_FALSE(check({written}, std::nullopt, report->prunes).ok) << "pruned: not compared";
    auto old_enough = check({written}, 7 * day, report->prunes);
    EXPECT_TRUE(old_enough.ok) << old_enough.problem;
    EXPECT_EQ(old_enough.pruned_by_retention, 1);
    // Recorded an hour ago, pruned since: younger than a day now, so no retention of a day did it.
    auto wiped = check({now_us() - 3600LL * 1000000}, day, report->prunes);
    EXPECT_FALSE(wiped.ok);
    EXPECT_EQ(wiped.bad_seq, 3);
    EXPECT_NE(wiped.problem.find("younger than --retention 1d"), std::string::npos)
        << wiped.problem;
    // A second, backdated copy of the same head (sent after the node was taken) does not make
    // the event look older: the latest copy counts.
    auto backdated = check({written, now_us() - 3600LL * 1000000}, 7 * day, report->prunes);
    EXPECT_FALSE(backdated.ok) << "the latest copy counts";
    // No prune in the chain removed it.
    auto unpruned = check({written}, 7 * day, {});
    EXPECT_FALSE(unpruned.ok);
    EXPECT_NE(unpruned.problem.find("no retention-prune in the chain removed it"),
              std::string::npos)
        << unpruned.problem;
    // A head journald received two hours from now: the node's clock was set forward.
    auto ahead = check({written, now_us() + 2 * 3600LL * 1000000}, 7 * day, report->prunes);
    EXPECT_FALSE(ahead.ok);
    EXPECT_NE(ahead.problem.find("the node's clock was set forward"), std::string::npos)
        << ahead.problem;
}

// A record (or anchor) of a pruned event that the checkpoint at its seq holds is still a pruned
// one: heads are public, so a wipe of all history chained on a checkpoint holding a copied head
// looks like a prune (#31). Without --allow-pruned-anchor or --retention the verdict is not-ok.
TEST_F(JournalTest, ACheckpointHoldingARecordedHeadDoesNotVouchForThePrune) {
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 12; ++i) {
            Event e;
            e.kind = kind::denied;
            ASSERT_TRUE(j->append(e).ok());
        }
        ASSERT_EQ(j->prune(std::nullopt, 4, std::nullopt).value(), 8);
    }
    auto db = Database::open(path_, SQLITE_OPEN_READONLY);
    ASSERT_TRUE(db.ok());
    auto cp = db->prepare("SELECT seq, lower(hex(hash)) FROM checkpoints");
    ASSERT_TRUE(cp.ok());
    ASSERT_TRUE(cp->step().value());
    AnchorCopy at_checkpoint{cp->int64(0), cp->text(1), now_us(), path_, "", "", 0};
    auto c = check_anchor_copies(*db, path_, {at_checkpoint});
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_FALSE(c->ok);
    EXPECT_EQ(c->bad_seq, at_checkpoint.seq);
    EXPECT_NE(c->problem.find("heads are public"), std::string::npos) << c->problem;
    c = check_anchor_copies(*db, path_, {at_checkpoint}, true);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->ok) << c->problem;
    // Another hash at the checkpoint's seq is a rewrite, whatever the auditor allows.
    at_checkpoint.hash = std::string(64, 'b');
    c = check_anchor_copies(*db, path_, {at_checkpoint}, true);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->ok);
    EXPECT_NE(c->problem.find("(rewritten)"), std::string::npos) << c->problem;
}

// Numbered chain heads (#52 item 4): journald's rate limit drops heads silently, and a cut of
// the events after the newest head it kept would pass. Heads 1..5 of one run, with 3 and 4
// missing, fail naming the gap and the events around it; the same heads without the gap pass and
// say which event of how many the newest is; heads without numbers (older daemons) and a gap
// before the lowest number journald holds (its vacuum) are not gaps.
TEST_F(JournalTest, MissingNumberedHeadsFailNamingTheGap) {
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 10; ++i) {
            Event e;
            e.kind = kind::denied;
            ASSERT_TRUE(j->append(e).ok());
        }
    }
    auto db = Database::open(path_, SQLITE_OPEN_READONLY);
    ASSERT_TRUE(db.ok());
    std::map<std::int64_t, std::string> hash;
    auto q = db->prepare("SELECT seq, lower(hex(hash)) FROM events");
    ASSERT_TRUE(q.ok());
    while (q->step().value())
        hash[q->int64(0)] = q->text(1);
    const std::string run(32, 'c');
    auto head = [&](std::int64_t seq, std::int64_t n) {
        return AnchorCopy{seq, hash.at(seq), now_us(), path_, "", run, n};
    };
    std::vector<AnchorCopy> whole{head(2, 1), head(4, 2), head(5, 3), head(7, 4), head(8, 5)};
    auto c = check_anchor_copies(*db, path_, whole);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_TRUE(c->ok) << c->problem;
    EXPECT_EQ(c->newest->seq, 8);
    EXPECT_EQ(c->last_event, hash.rbegin()->first);
    EXPECT_EQ(c->runs, 1);
    EXPECT_TRUE(c->missing.empty());

    std::vector<AnchorCopy> cut{head(2, 1), head(4, 2), head(8, 5)};
    c = check_anchor_copies(*db, path_, cut);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_FALSE(c->ok);
    ASSERT_EQ(c->missing.size(), 1u);
    EXPECT_EQ(c->missing[0].first, 3);
    EXPECT_EQ(c->missing[0].last, 4);
    EXPECT_EQ(c->missing[0].after_seq, 4);
    EXPECT_EQ(c->missing[0].before_seq, 8);
    EXPECT_EQ(c->missing_heads, 2);
    EXPECT_NE(c->problem.find("newest head is event 8 of " + std::to_string(c->last_event) +
                              ", but heads 3..4 of daemon run " + run),
              std::string::npos)
        << c->problem;

    // Journald's vacuum removed heads 1..3: no gap. Unnumbered heads beside them count for
    // nothing here.
    std::vector<AnchorCopy> vacuumed{
        head(7, 4), head(8, 5), {9, hash.at(9), now_us(), path_, "", "", 0}};
    c = check_anchor_copies(*db, path_, vacuumed);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->ok) << c->problem;
    // Two runs: a gap in either is one.
    std::vector<AnchorCopy> two = whole;
    two.push_back({9, hash.at(9), now_us(), path_, "", std::string(32, 'd'), 1});
    two.push_back({10, hash.at(10), now_us(), path_, "", std::string(32, 'd'), 3});
    c = check_anchor_copies(*db, path_, two);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->ok);
    EXPECT_EQ(c->runs, 2);
    ASSERT_EQ(c->missing.size(), 1u);
    EXPECT_EQ(c->missing[0].run, std::string(32, 'd'));
    EXPECT_EQ(c->missing[0].first, 2);
}

// #52 item 4: heads journald lost after the newest one it holds of a run leave no gap in the
// numbers; the run's daemon-stop says how many it sent, and verify names the rest.
TEST_F(JournalTest, HeadsLostAfterTheNewestKeptAreNamedThroughTheDaemonStop) {
    const std::string run(32, 'e');
    {
        auto j = std::move(Journal::open(path_)).value();
        for (int i = 0; i < 6; ++i) {
            Event e;
            e.kind = kind::denied;
            ASSERT_TRUE(j->append(e).ok());
        }
        Event stop;
        stop.kind = kind::daemon_stop;
        stop.detail = R"({"handed_over":0,"heads":{"run":")" + run + R"(","sent":5}})";
        ASSERT_TRUE(j->append(stop).ok());
    }
    auto db = Database::open(path_, SQLITE_OPEN_READONLY);
    ASSERT_TRUE(db.ok());
    std::map<std::int64_t, std::string> hash;
    auto q = db->prepare("SELECT seq, lower(hex(hash)) FROM events");
    ASSERT_TRUE(q.ok());
    while (q->step().value())
        hash[q->int64(0)] = q->text(1);
    std::int64_t stop_seq = hash.rbegin()->first;
    auto head = [&](std::int64_t seq, std::int64_t n) {
        return AnchorCopy{seq, hash.at(seq), now_us(), path_, "", run, n};
    };
    auto c = check_anchor_copies(*db, path_, {head(1, 1), head(2, 2), head(3, 3)});
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_FALSE(c->ok);
    ASSERT_EQ(c->missing.size(), 1u);
    EXPECT_TRUE(c->missing[0].tail);
    EXPECT_EQ(c->missing[0].first, 4);
    EXPECT_EQ(c->missing[0].last, 5);
    EXPECT_EQ(c->missing[0].after_seq, 3);
    EXPECT_EQ(c->missing[0].before_seq, stop_seq);
    EXPECT_NE(c->problem.find("heads 4..5 of daemon run " + run +
                              " (sent after the head of event 3; its daemon-stop, event " +
                              std::to_string(stop_seq) + ", says it sent 5)"),
              std::string::npos)
        << c->problem;
    // All five kept: nothing missing. A run journald holds nothing of is not judged.
    c = check_anchor_copies(*db, path_,
                            {head(1, 1), head(2, 2), head(3, 3), head(4, 4), head(5, 5)});
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->ok) << c->problem;
    c = check_anchor_copies(*db, path_, {{1, hash.at(1), now_us(), path_, "", "", 0}});
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->ok) << c->problem;
}
