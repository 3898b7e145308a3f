// The core alone: BindingManager over a fake Driver (it records what it was asked), a real
// SQLite journal in a temporary folder, and the test thread as the event loop (journal
// completions run when the test drains them). No D-Bus, no network: quotas with grants in
// flight, the fail-closed journal, retries of records the disk refused, revocation by a
// reload, process exit through HolderWatch, and shutdown.
#include "daemon/binding_manager.h"
#include "daemon/driver/sim_driver.h"
#include "journal/sqlite.h"
#include "journal/verify.h"
#include "tests/unit/manager_rig.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>
#include <thread>

using namespace knod;
using knod::testing::parse_or_fail;
using knod::testing::Rig;
using knod::testing::sealed_region;

namespace {

// A driver with one netdev and one GPU and no data path: it records attach, activate, detach.
class FakeDriver : public driver::Driver {
  public:
    std::string name() const override { return "fake"; }
    driver::RegionKind region_kind() const override { return driver::RegionKind::memfd; }
    Result<driver::GpuInfo> gpu(const std::string &n) const override {
        if (n != "gpu0") return make_error(Errc::not_found, "no GPU " + n);
        return driver::GpuInfo{"gpu0", {"gpu0"}, 1 << 30, ""};
    }
    Result<driver::NetdevInfo> netdev(const std::string &n) const override {
        if (n != "nic0") return make_error(Errc::not_found, "no netdev " + n);
        return driver::NetdevInfo{"nic0", 4, ""};
    }
    std::vector<driver::GpuInfo> gpus() const override { return {*gpu("gpu0")}; }
    std::vector<driver::NetdevInfo> netdevs() const override { return {*netdev("nic0")}; }
    Result<std::vector<std::uint32_t>> attach(const driver::BindingPlan &plan) override {
        attached.insert(plan.id);
        return std::vector<std::uint32_t>{1};
    }
    Result<void> activate(const std::string &id) override {
        active.insert(id);
        dmabuf_ids[id] = next_dmabuf_id++; // as bind-rx answers: a new id per bind
        return {};
    }
    void detach(const std::string &id) override {
        dmabuf_ids.erase(id);
        notifiers.erase(id);
        attached.erase(id);
        active.erase(id);
        ++detaches;
    }
    driver::Counters counters(const std::string &) const override { return rx; }
    std::optional<std::uint32_t> dmabuf_id(const std::string &id) const override {
        auto it = dmabuf_ids.find(id);
        if (it == dmabuf_ids.end()) return std::nullopt;
        return it->second;
    }
    // A restart that keeps bindings: nothing of its own to hand over but a marker.
    std::optional<std::string> handoff(const std::string &) const override { return "fake"; }
    Result<std::vector<std::uint32_t>> readopt(const driver::BindingPlan &plan, bool now_active,
                                               const std::string &,
                                               std::map<std::string, UniqueFd>) override {
        attached.insert(plan.id);
        if (now_active) active.insert(plan.id);
        return std::vector<std::uint32_t>{1};
    }
    void abandon(const std::string &, const std::string &state) override {
        abandoned.push_back(state);
    }
    // The read end of a pipe per binding, as the sim's; a new one replaces the old.
    Result<UniqueFd> rx_notifier(const std::string &id) override {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) return make_error(Errc::io, "pipe");
        notifiers[id] = UniqueFd(p[1]);
        return UniqueFd(p[0]);
    }

    std::map<std::string, UniqueFd> notifiers;
    std::set<std::string> attached, active;
    std::map<std::string, std::uint32_t> dmabuf_ids; // per active binding, as bind-rx gave it
    std::uint32_t next_dmabuf_id = 41;
    std::vector<std::string> abandoned;
    driver::Counters rx; // what every binding has received
    int detaches = 0;
};

// systemd's file-descriptor store, in memory: a copy of each fd by name.
struct MemoryStore : daemon::HandleStore {
    bool store(const std::string &name, int fd) override {
        kept[name] = UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0));
        return kept[name].get() >= 0;
    }
    void remove(const std::string &name) override { kept.erase(name); }
    std::optional<UniqueFd> take(const std::string &name) override {
        auto it = kept.find(name);
        if (it == kept.end()) return std::nullopt;
        UniqueFd fd = std::move(it->second);
        kept.erase(it);
        return fd;
    }
    std::map<std::string, UniqueFd> kept;
};

// What the manager told the outside world.
struct Recorder : daemon::BindingEvents {
    void binding_created(const daemon::Binding &b) override { created.push_back(b.id); }
    void binding_ended(const daemon::Binding &b, daemon::EndReason why,
                       const std::string &) override {
        ended.emplace_back(b.id, why);
    }
    void policy_reloaded(std::size_t, std::size_t revoked) override { reload_revoked = revoked; }
    std::vector<std::string> created;
    std::vector<std::pair<std::string, daemon::EndReason>> ended;
    std::size_t reload_revoked = 0;
};

// An event loop the test fires by hand: which fds are watched, and their callbacks.
struct HandLoop : driver::EventLoop {
    Result<void> watch(int fd, std::function<void()> fn) override {
        watched[fd] = std::move(fn);
        return {};
    }
    void unwatch(int fd) override { watched.erase(fd); }
    std::map<int, std::function<void()>> watched;
};

// The fake driver's one rule, for any caller, with `per_uid` bindings each.
std::string fake_rule(int per_uid) {
    return "[[rule]]\nname = \"fake\"\nany_caller = true\nnetdevs = [\"nic0\"]\n"
           "max_region = \"1MiB\"\nflows = [\"udp * -> *:*\"]\niommu = \"any\"\n"
           "max_bindings_per_uid = " +
           std::to_string(per_uid) + "\n";
}
const std::string two_per_user = fake_rule(2);

daemon::Peer user(uid_t uid) {
    daemon::Peer p;
    p.uid = uid;
    p.pid = getpid();
    return p;
}

const std::string many_per_user = fake_rule(16);

// This test process as a holder: pid, start time and a pidfd, as the bus side identifies one.
daemon::Peer this_process(uid_t uid) {
    daemon::Peer p = user(uid);
    p.start_time = daemon::process_start_time(p.pid).value();
    p.pidfd = daemon::pin_process(p.pid, p.start_time).value();
    p.gids = {static_cast<gid_t>(uid)};
    return p;
}

// The session rows and events of the journal at `path`, as SQL answers.
std::int64_t count(const std::string &path, const std::string &sql) {
    auto db = journal::Database::open(path, SQLITE_OPEN_READONLY);
    if (!db) return -1;
    auto n = db->scalar(sql);
    return n ? *n : -1;
}

class BindingManagerTest : public ::testing::Test {
  protected:
    BindingManagerTest()
        : rig(std::string("core-") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()) {}

    std::unique_ptr<daemon::BindingManager> make(const std::string &policy = two_per_user) {
        auto m = rig.manager(driver, parse_or_fail(policy), &events);
        m->start();
        return m;
    }
    // Starts one request for a UDP port; the answer lands in `out` when the loop runs.
    void ask(daemon::BindingManager &m, const daemon::Peer &who, int port,
             std::optional<Result<daemon::Granted>> &out) {
        int fd = sealed_region();
        ASSERT_GE(fd, 0);
        daemon::RequestArgs args{"nic0",
                                 "gpu0",
                                 "rx-only",
                                 fd,
                                 0,
                                 4096,
                                 {"udp 10.0.0.1:* -> 10.0.0.2:" + std::to_string(port)}};
        m.request(who, args, [&out](Result<daemon::Granted> g) { out = std::move(g); });
        close(fd);
    }
    Result<daemon::Granted> grant(daemon::BindingManager &m, const daemon::Peer &who, int port) {
        std::optional<Result<daemon::Granted>> out;
        ask(m, who, port, out);
        EXPECT_TRUE(rig.loop.run_until([&] { return out.has_value(); }));
        if (!out) return make_error(Errc::unavailable, "no answer");
        return std::move(*out);
    }
    bool drain(const std::function<bool()> &until) { return rig.loop.run_until(until); }

    Rig rig;
    FakeDriver driver;
    Recorder events;
};

} // namespace

// A completion (in the daemon it holds the caller's bus message, and with it a reference to
// the bus) is dropped on the loop thread, never on the journal's writer thread: sd-bus counts
// its references without atomics, and one dropped on the writer once left the bus's count short
// (bus_free() aborted: "Assertion 's->floating' failed"). Posting here waits until the test
// thread has run the work, so whatever the writer thread still holds afterwards, it drops last.
TEST_F(BindingManagerTest, CompletionsAreDroppedOnTheLoopThread) {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    std::uint64_t posted = 0, ran = 0;
    bool blocking = true;
    auto post = [&](std::function<void()> f) {
        std::unique_lock lock(mu);
        std::uint64_t ticket = ++posted;
        queue.push_back(std::move(f));
        cv.notify_all();
        cv.wait(lock, [&] { return !blocking || ran >= ticket; });
    };
    auto run_until = [&](const std::function<bool()> &done) {
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!done()) {
            std::unique_lock lock(mu);
            if (!cv.wait_until(lock, end, [&] { return !queue.empty(); })) return false;
            {
                auto f = std::move(queue.front());
                queue.pop_front();
                lock.unlock();
                f();
            } // the work, and what it holds, goes here, on the test thread
            lock.lock();
            ++ran;
            cv.notify_all();
        }
        return true;
    };
    // Records the thread that drops the last reference to it.
    struct Sentinel {
        std::mutex *mu;
        std::thread::id *where;
        ~Sentinel() {
            std::lock_guard lock(*mu);
            *where = std::this_thread::get_id();
        }
    };
    std::array<std::uint8_t, 32> secret{};
    auto m = std::make_unique<daemon::BindingManager>(
        rig.config, driver, std::move(keys::KeyAuthority::with_secret(secret)).value(),
        parse_or_fail(two_per_user), events, post);
    m->start();
    std::thread::id granted_on, released_on;
    std::optional<Result<daemon::Granted>> g;
    {
        int fd = sealed_region();
        ASSERT_GE(fd, 0);
        daemon::RequestArgs args{
            "nic0", "gpu0", "rx-only", fd, 0, 4096, {"udp 10.0.0.1:* -> 10.0.0.2:5000"}};
        auto sentinel = std::make_shared<Sentinel>(Sentinel{&mu, &granted_on});
        m->request(user(1000), args,
                   [&g, sentinel](Result<daemon::Granted> r) { g = std::move(r); });
        close(fd);
    }
    ASSERT_TRUE(run_until([&] { return g.has_value(); }));
    ASSERT_TRUE(g->ok()) << g->error().message;
    std::optional<Result<void>> released;
    {
        auto sentinel = std::make_shared<Sentinel>(Sentinel{&mu, &released_on});
        m->release((*g)->id, user(1000), false,
                   [&released, sentinel](Result<void> r) { released = r; });
    }
    ASSERT_TRUE(run_until([&] { return released.has_value(); }));
    // The writer thread has finished with both batches once it posts again: one more write.
    std::optional<Result<daemon::Granted>> more;
    {
        int fd = sealed_region();
        ASSERT_GE(fd, 0);
        daemon::RequestArgs args{
            "nic0", "gpu0", "rx-only", fd, 0, 4096, {"udp 10.0.0.1:* -> 10.0.0.2:5001"}};
        m->request(user(1000), args, [&more](Result<daemon::Granted> r) { more = std::move(r); });
        close(fd);
    }
    ASSERT_TRUE(run_until([&] { return more.has_value(); }));
    {
        std::lock_guard lock(mu);
        blocking = false;
        cv.notify_all();
    }
    m->shutdown();
    m.reset();
    std::lock_guard lock(mu);
    EXPECT_EQ(granted_on, std::this_thread::get_id()) << "a grant's completion";
    EXPECT_EQ(released_on, std::this_thread::get_id()) << "a release's completion";
}

// Grants still waiting for the journal count against the quota: a third request made while two
// are in flight is refused at once, before the first two are durable.
TEST_F(BindingManagerTest, GrantsInFlightCountAgainstTheQuota) {
    auto m = make();
    std::optional<Result<daemon::Granted>> a, b, c;
    ask(*m, user(1000), 5000, a);
    ask(*m, user(1000), 5001, b);
    ask(*m, user(1000), 5002, c);
    ASSERT_TRUE(c.has_value()) << "the third is refused before the loop runs";
    ASSERT_FALSE(c->ok());
    EXPECT_EQ(c->error().code, Errc::quota_exceeded) << c->error().message;
    EXPECT_FALSE(a.has_value()) << "the first two wait for the journal";
    ASSERT_TRUE(drain([&] { return a && b; }));
    EXPECT_TRUE(a->ok() && b->ok());
    EXPECT_EQ(driver.attached.size(), 2u);
    EXPECT_EQ(events.created.size(), 2u);
    // Another user has a quota of its own.
    EXPECT_TRUE(grant(*m, user(1001), 5003).ok());
    // A release gives the slot back.
    std::optional<Result<void>> released;
    m->release((*a)->id, user(1000), false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    EXPECT_TRUE(grant(*m, user(1000), 5004).ok());
    m->shutdown();
}

const std::string hundred_per_user = fake_rule(100);

// The bindings' bound in all (live and in flight, every uid): the caller that reaches it gets
// LimitsExceeded, journaled and coalesced, before anything is taken; nobody's binding is touched,
// and a release makes room again.
TEST_F(BindingManagerTest, PastTheBindingsInAllTheCallerIsRefusedByName) {
    rig.config.max_bindings = 3;
    auto m = make(hundred_per_user);
    auto a = grant(*m, user(1000), 5000);
    auto b = grant(*m, user(1000), 5001);
    auto c = grant(*m, user(1001), 5002);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    for (int port : {5003, 5004}) {
        auto refused = grant(*m, user(1002), port);
        ASSERT_FALSE(refused.ok());
        EXPECT_EQ(refused.error().code, Errc::limits_exceeded) << refused.error().message;
        EXPECT_NE(refused.error().message.find("at most 3 bindings"), std::string::npos)
            << refused.error().message;
    }
    EXPECT_EQ(driver.attached.size(), 3u) << "a refused request takes nothing";
    EXPECT_TRUE(events.ended.empty()) << "nobody's binding is touched";
    std::optional<Result<void>> released;
    m->release(a->id, user(1000), false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    EXPECT_TRUE(grant(*m, user(1002), 5005).ok()) << "a release makes room";
    m->shutdown();
    m.reset();
    // Two refusals of uid 1002: the first in full, the second only counted (the window is open).
    EXPECT_EQ(count(rig.config.journal_path,
                    "SELECT count(*) FROM events WHERE kind = 'rate-limited' AND uid = 1002 AND "
                    "json_extract(detail, '$.limit') LIKE 'at most 3 bindings%'"),
              1);
}

// The attack review of #51: a pod's root (or any caller outside the host's network namespace)
// can take any number of uids, each a principal with a bucket of its own; the domain as a whole
// has one too (four times a uid's), so that cycling uids buys no more. The host's users are
// not pooled.
TEST_F(BindingManagerTest, ADomainOfManyUidsSharesOneBucketTooButTheHostDoesNot) {
    rig.config.requests_per_second = 0.001;
    rig.config.request_burst = 2;
    auto m = make(hundred_per_user);
    int whole = 0, asked = 0;
    for (uid_t uid = 2000; uid < 2020; ++uid) {
        daemon::Peer p = user(uid);
        p.host_netns = false; // unplaced: no pod, not the host's netns
        for (int i = 0; i < 2; ++i, ++asked) {
            auto r = grant(*m, p, 6000 + asked);
            ASSERT_FALSE(r.ok()) << "an unplaced caller is never granted";
            if (r.error().code == Errc::quota_exceeded &&
                r.error().message.find("unplaced as a whole") != std::string::npos)
                ++whole;
        }
    }
    EXPECT_EQ(whole, asked - 8) << "the domain's burst is four times a uid's (2)";
    for (uid_t uid = 1000; uid < 1010; ++uid)
        EXPECT_TRUE(grant(*m, user(uid), 5000 + static_cast<int>(uid - 1000)).ok())
            << "host users keep their own buckets: uid " << uid;
    m->shutdown();
}

// Grants waiting for the journal are bounded in all: past the bound a request is refused at
// once (LimitsExceeded) while the earlier ones complete; once they are durable there is room.
TEST_F(BindingManagerTest, PastTheGrantsInFlightTheCallerIsRefusedByName) {
    rig.config.max_grants_in_flight = 2;
    auto m = make(hundred_per_user);
    std::optional<Result<daemon::Granted>> a, b, c;
    ask(*m, user(1000), 5000, a);
    ask(*m, user(1001), 5001, b);
    ask(*m, user(1002), 5002, c);
    ASSERT_TRUE(c.has_value()) << "the third is refused before the loop runs";
    ASSERT_FALSE(c->ok());
    EXPECT_EQ(c->error().code, Errc::limits_exceeded) << c->error().message;
    EXPECT_FALSE(a.has_value()) << "the first two wait for the journal";
    ASSERT_TRUE(drain([&] { return a && b; }));
    EXPECT_TRUE(a->ok() && b->ok());
    EXPECT_TRUE(grant(*m, user(1002), 5002).ok()) << "room once the grants are durable";
    EXPECT_EQ(driver.attached.size(), 3u);
    m->shutdown();
}

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] auto &e : std::filesystem::directory_iterator("/proc/self/fd"))
        ++n;
    return n;
}

// A grant whose caller left before its commit gives its fds back at once, but it still waits
// for the journal (its reply with it), so it counts against the grants in flight until then: a
// caller that asks and leaves in a loop cannot get past the bound while the journal is slow.
TEST_F(BindingManagerTest, AbandonedGrantsCountAsInFlightAndHoldNoFds) {
    rig.config.max_grants_in_flight = 2;
    auto m = make(hundred_per_user);
    daemon::Peer leaving = user(1000);
    leaving.bus_name = ":1.7";
    std::size_t before = open_fds();
    std::optional<Result<daemon::Granted>> a, b, c;
    ask(*m, leaving, 5000, a);
    EXPECT_EQ(open_fds(), before + 1) << "the daemon's own reference to the region";
    m->connection_gone(":1.7");
    EXPECT_EQ(open_fds(), before) << "abandoned: the region is let go at once";
    ask(*m, user(1001), 5001, b);
    ask(*m, user(1002), 5002, c);
    ASSERT_TRUE(c.has_value()) << "refused before the loop runs: the abandoned one still counts";
    ASSERT_FALSE(c->ok());
    EXPECT_EQ(c->error().code, Errc::limits_exceeded) << c->error().message;
    ASSERT_TRUE(drain([&] { return a && b; }));
    EXPECT_FALSE(a->ok()) << "nothing handed out to a caller that left";
    EXPECT_TRUE(b->ok());
    EXPECT_TRUE(grant(*m, user(1002), 5002).ok()) << "room once the commits are done";
    m->shutdown();
}

// Notifier pipes are bounded in all: a second one for the same binding replaces the first and
// counts once; past the bound the holder gets LimitsExceeded (and can still poll RxBytes); the
// end of a binding gives its pipe back.
TEST_F(BindingManagerTest, PastTheNotifierPipesInAllTheHolderIsRefusedByName) {
    rig.config.max_notifiers = 1;
    auto m = make(hundred_per_user);
    auto a = grant(*m, user(1000), 5000);
    auto b = grant(*m, user(1001), 5001);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(m->rx_notifier(a->id, user(1000), a->key).ok());
    EXPECT_TRUE(m->rx_notifier(a->id, user(1000), a->key).ok()) << "a second replaces the first";
    auto refused = m->rx_notifier(b->id, user(1001), b->key);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::limits_exceeded) << refused.error().message;
    EXPECT_EQ(driver.notifiers.size(), 1u);
    std::optional<Result<void>> released;
    m->release(a->id, user(1000), false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    EXPECT_TRUE(m->rx_notifier(b->id, user(1001), b->key).ok()) << "the end gave the pipe back";
    m->shutdown();
}

// The fds callers make the daemon hold stay within the budget the fd limit leaves: a region per
// binding, two per grant in flight (region, pidfd), a notifier pipe per binding that asked.
TEST_F(BindingManagerTest, PastTheFdBudgetTheCallerIsRefusedByName) {
    rig.config.max_caller_fds = 4;
    auto m = make(hundred_per_user);
    auto a = grant(*m, user(1000), 5000); // 0 + 2 <= 4: granted, holds 1
    auto b = grant(*m, user(1001), 5001); // 1 + 2 <= 4: granted, holds 2
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(m->rx_notifier(a->id, user(1000), a->key).ok()); // 2 + 1 <= 4: holds 3
    auto refused = grant(*m, user(1002), 5002);                  // 3 + 2 > 4
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::limits_exceeded) << refused.error().message;
    EXPECT_NE(refused.error().message.find("fd limit"), std::string::npos);
    EXPECT_TRUE(m->rx_notifier(b->id, user(1001), b->key).ok()); // 3 + 1 <= 4: holds 4
    auto more = m->rx_notifier(b->id, user(1001), b->key);       // replaces: no new fd counted
    EXPECT_TRUE(more.ok());
    EXPECT_EQ(driver.attached.size(), 2u) << "a refused request takes nothing";
    m->shutdown();
}

// No journal, no grant: a journal that cannot be opened refuses every request before the
// driver or the key authority is asked anything.
TEST_F(BindingManagerTest, AJournalThatCannotBeOpenedRefusesEveryRequest) {
    rig.config.journal_path = (rig.dir / "missing" / "journal.db").string();
    auto m = make();
    auto g = grant(*m, user(1000), 5000);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, Errc::journal_unavailable) << g.error().message;
    EXPECT_TRUE(driver.attached.empty()) << "nothing attached without a journal";
    EXPECT_TRUE(events.created.empty());
    EXPECT_FALSE(m->status().journal_available);
    m->shutdown();
}

// Records the disk refuses are kept and retried in order at the next tick; meanwhile requests
// are refused at once (fail closed), and afterwards everything is on disk, the chain intact.
TEST_F(BindingManagerTest, RecordsTheDiskRefusedAreRetriedAndRequestsWaitForThem) {
    auto m = make();
    auto g = grant(*m, user(1000), 5000);
    ASSERT_TRUE(g.ok()) << g.error().message;
    // Another connection holds the write lock: the release's end cannot be written.
    auto other =
        std::move(journal::Database::open(rig.config.journal_path, SQLITE_OPEN_READWRITE)).value();
    ASSERT_TRUE(other.exec("BEGIN IMMEDIATE").ok());
    std::optional<Result<void>> released;
    m->release(g->id, user(1000), false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    EXPECT_TRUE(driver.attached.empty()) << "the data path stops before the disk answers";
    ASSERT_TRUE(drain([&] { return m->status().pending_records > 0; }));
    EXPECT_FALSE(m->status().journal_available);
    auto refused = grant(*m, user(1000), 5001);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::journal_unavailable);
    EXPECT_NE(refused.error().message.find("waiting for the disk"), std::string::npos)
        << refused.error().message;
    ASSERT_TRUE(other.exec("COMMIT").ok());
    m->tick(journal::now_us());
    ASSERT_TRUE(drain([&] { return m->status().pending_records == 0; }));
    EXPECT_EQ(count(rig.config.journal_path, "SELECT count(*) FROM sessions WHERE id = '" + g->id +
                                                 "' AND end_reason = 'release'"),
              1);
    EXPECT_TRUE(grant(*m, user(1000), 5001).ok()) << "granted again once the disk is back";
    m->shutdown();
    auto v = journal::verify_chain(rig.config.journal_path);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->ok) << v->problem;
}

// A reload whose policy no longer grants a binding revokes it (policy-reload), journaled with
// the new policy; a reload whose policy does not load changes nothing.
TEST_F(BindingManagerTest, AReloadRevokesWhatTheNewPolicyNoLongerGrants) {
    auto m = make();
    auto kept = grant(*m, user(1000), 5000);
    auto lost = grant(*m, user(2000), 5001);
    ASSERT_TRUE(kept.ok() && lost.ok());
    std::string only_1000 = std::string(two_per_user);
    only_1000.replace(only_1000.find("any_caller = true"), 17, "users = [1000]");
    m->set_policy_loader([&] { return Result<policy::Policy>(parse_or_fail(only_1000)); });
    auto revoked = m->reload(user(0), "test");
    ASSERT_TRUE(revoked.ok()) << revoked.error().message;
    EXPECT_EQ(*revoked, 1u);
    EXPECT_EQ(events.reload_revoked, 1u);
    ASSERT_EQ(events.ended.size(), 1u);
    EXPECT_EQ(events.ended[0].first, lost->id);
    EXPECT_EQ(events.ended[0].second, daemon::EndReason::policy_reload);
    EXPECT_EQ(driver.attached, std::set<std::string>{kept->id});
    m->set_policy_loader(
        [] { return Result<policy::Policy>(make_error(Errc::invalid_policy, "line 1: broken")); });
    EXPECT_FALSE(m->reload(user(0), "test").ok());
    EXPECT_EQ(m->bindings().size(), 1u) << "a policy that does not load changes nothing";
    m->shutdown();
    EXPECT_EQ(count(rig.config.journal_path, "SELECT count(*) FROM sessions WHERE id = '" +
                                                 lost->id + "' AND end_reason = 'policy-reload'"),
              1);
    EXPECT_EQ(
        count(rig.config.journal_path, "SELECT count(*) FROM events WHERE kind = 'reload-refused'"),
        1);
}

// A holder's exit ends its bindings, through the pidfd HolderWatch keeps on the loop; one
// watch per process however many bindings it holds.
TEST_F(BindingManagerTest, AHolderThatExitsLosesItsBindings) {
    HandLoop loop;
    auto m = rig.manager(driver, parse_or_fail(two_per_user), &events);
    m->set_event_loop(&loop);
    m->start();
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        pause();
        _exit(0);
    }
    auto started = daemon::process_start_time(child);
    ASSERT_TRUE(started.ok()) << started.error().message;
    daemon::Peer who = user(1000);
    who.pid = child;
    who.start_time = *started;
    auto pinned = daemon::pin_process(child, who.start_time);
    ASSERT_TRUE(pinned.ok()) << pinned.error().message;
    who.pidfd = *pinned;
    auto a = grant(*m, who, 5000);
    auto b = grant(*m, who, 5001);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(loop.watched.size(), 1u) << "one watch for the holder's two bindings";
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    auto fire = loop.watched.begin()->second;
    fire();
    EXPECT_TRUE(m->bindings().empty());
    EXPECT_TRUE(loop.watched.empty()) << "the watch ends with the holder's last binding";
    ASSERT_EQ(events.ended.size(), 2u);
    EXPECT_EQ(events.ended[0].second, daemon::EndReason::process_exit);
    m->shutdown();
}

// Shutdown ends every binding as daemon-stop and waits until the journal has it all.
TEST_F(BindingManagerTest, ShutdownEndsEveryBindingAndLeavesNothingUnwritten) {
    auto m = make();
    ASSERT_TRUE(grant(*m, user(1000), 5000).ok());
    ASSERT_TRUE(grant(*m, user(1001), 5001).ok());
    m->shutdown();
    EXPECT_TRUE(m->bindings().empty());
    EXPECT_TRUE(driver.attached.empty());
    EXPECT_EQ(driver.detaches, 2);
    EXPECT_EQ(m->status().pending_records, 0u);
    m.reset();
    EXPECT_EQ(count(rig.config.journal_path,
                    "SELECT count(*) FROM sessions WHERE end_reason = 'daemon-stop'"),
              2);
    EXPECT_EQ(
        count(rig.config.journal_path, "SELECT count(*) FROM events WHERE kind = 'daemon-stop'"),
        1);
}

// The restart handoff is authenticated whole (#31): a record edited in any field adoption reads
// (holder pid, uid, groups, region, expiry, flows, state), written in an old format, or moved
// to another binding's row is refused by its MAC, named in a not-adopted event, and nothing in
// it is acted on; the intact records beside them are still taken back.
TEST_F(BindingManagerTest, AHandoffEditedInAnyFieldIsRefusedAndTheIntactOnesAreTakenBack) {
    MemoryStore store;
    auto first = rig.manager(driver, parse_or_fail(many_per_user), &events);
    first->set_handle_store(&store);
    first->start();
    daemon::Peer me = this_process(1000);
    std::vector<std::string> ids;
    for (int port = 5000; port < 5011; ++port) {
        auto g = grant(*first, me, port);
        ASSERT_TRUE(g.ok()) << g.error().message;
        ids.push_back(g->id);
    }
    ASSERT_EQ(first->hand_off(), ids.size());
    first.reset();
    const std::string &db = rig.config.journal_path;
    auto edit = [&](const std::string &id, const std::string &to) {
        auto w = journal::Database::open(db, SQLITE_OPEN_READWRITE);
        ASSERT_TRUE(w.ok()) << w.error().message;
        ASSERT_TRUE(w->exec("UPDATE sessions SET handoff = " + to + " WHERE id = '" + id + "'"));
    };
    // Each edit is one a journal writer might make to keep, move or widen a binding; without
    // the MAC over the record, those after the first would be taken back as edited.
    std::map<std::string, std::string> edited = {
        {ids[0], "json_set(handoff, '$.owner.pid', 1)"},
        {ids[1], "json_set(handoff, '$.owner.uid', 0)"},
        {ids[2], "json_set(handoff, '$.owner.gids', json('[0, 27]'))"},
        {ids[3], "json_set(handoff, '$.region.length', 2048)"},
        {ids[4], "json_set(handoff, '$.expires_us', 4102444800000000)"},
        {ids[5], "json_set(handoff, '$.flows', json('[\"udp * -> *:*\"]'))"},
        {ids[6], "json_set(handoff, '$.state', 'active')"},
        {ids[7], "json_set(handoff, '$.created_us', json_extract(handoff, '$.created_us') + 0.0)"},
    };
    std::string moved = ids[8], from = ids[9], intact = ids[10];
    edited[moved] = "(SELECT handoff FROM sessions WHERE id = '" + from + "')";
    for (auto &[id, to] : edited)
        edit(id, to);
    driver.attached.clear();
    driver.active.clear();

    auto second = rig.manager(driver, parse_or_fail(many_per_user), &events);
    second->set_handle_store(&store);
    second->start();
    std::set<std::string> kept;
    for (auto *b : second->bindings())
        kept.insert(b->id);
    EXPECT_EQ(kept, (std::set<std::string>{from, intact}));
    EXPECT_TRUE(driver.active.empty()) << "the edited state was not believed";
    EXPECT_TRUE(driver.abandoned.empty()) << "nothing in a refused record is acted on";
    second->shutdown(); // waits until the journal has every record (the kept end as daemon-stop)
    for (auto &[id, to] : edited) {
        std::string reason =
            id == moved ? "%written for another binding (moved)%" : "%does not match its MAC%";
        EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'not-adopted' AND "
                            "session_id = '" +
                                id + "' AND reason LIKE '" + reason + "'"),
                  1)
            << "binding " << id << " edited with " << to;
    }
    EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'adopted'"), 2);
    EXPECT_EQ(count(db, "SELECT count(*) FROM sessions WHERE end_reason = 'daemon-restart'"),
              static_cast<std::int64_t>(edited.size()));
}

// A record of the format before #31 (its MAC covered the key only) is refused by name, not
// parsed into a binding.
TEST_F(BindingManagerTest, AHandoffOfTheOldFormatIsRefusedByName) {
    MemoryStore store;
    auto first = rig.manager(driver, parse_or_fail(many_per_user), &events);
    first->set_handle_store(&store);
    first->start();
    auto g = grant(*first, this_process(1000), 5000);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_EQ(first->hand_off(), 1u);
    first.reset();
    {
        auto w = journal::Database::open(rig.config.journal_path, SQLITE_OPEN_READWRITE);
        ASSERT_TRUE(w.ok());
        ASSERT_TRUE(w->exec("UPDATE sessions SET handoff = json_remove(json_set(handoff, "
                            "'$.version', 1), '$.mac', '$.binding', '$.journal_id')"));
    }
    auto second = rig.manager(driver, parse_or_fail(many_per_user), &events);
    second->set_handle_store(&store);
    second->start();
    EXPECT_TRUE(second->bindings().empty());
    second->shutdown();
    EXPECT_EQ(count(rig.config.journal_path,
                    "SELECT count(*) FROM events WHERE kind = 'not-adopted' AND session_id = '" +
                        g->id + "' AND reason LIKE '%format 1%'"),
              1);
}

// GetMetrics' figures: each request counted once under its outcome, refusals by kind, ends by
// reason; a binding's RX moves to its device's total when it ends, so the counter never drops;
// the grants' and the end's commits are timed. No binding id in the answer.
TEST_F(BindingManagerTest, MetricsCountEachOutcomeOnceAndRxNeverGoesDown) {
    driver.rx = {100, 2, 1};
    auto m = make();
    auto a = grant(*m, user(1000), 5000);
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_TRUE(grant(*m, user(1000), 5001).ok());
    auto over = grant(*m, user(1000), 5002);
    ASSERT_FALSE(over.ok());
    std::optional<Result<daemon::Granted>> bad;
    int fd = sealed_region();
    ASSERT_GE(fd, 0);
    m->request(user(1000), {"nope0", "gpu0", "rx-only", fd, 0, 4096, {"udp * -> *:1"}},
               [&](Result<daemon::Granted> g) { bad = std::move(g); });
    close(fd);
    ASSERT_TRUE(bad && !bad->ok());
    const daemon::Metrics &mx = m->metrics();
    EXPECT_EQ(mx.requests().at("allow"), 2u);
    EXPECT_EQ(mx.requests().at("quota-exceeded"), 1u);
    EXPECT_EQ(mx.requests().at("invalid-request"), 1u);
    EXPECT_EQ(mx.requests().at("deny"), 0u) << "present from the start";
    EXPECT_EQ(mx.refusals().at("request-denied"), 2u);
    EXPECT_EQ(mx.ends().at("release"), 0u);

    auto rx_bytes = [&] {
        auto j = nlohmann::json::parse(daemon::metrics_json(*m, "test"));
        EXPECT_EQ(j["traffic"].size(), 1u) << j.dump();
        return j["traffic"][0]["rx_bytes"].get<std::uint64_t>();
    };
    EXPECT_EQ(rx_bytes(), 200u);
    std::optional<Result<void>> released;
    m->release(a->id, user(1000), false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    EXPECT_EQ(mx.ends().at("release"), 1u);
    EXPECT_EQ(rx_bytes(), 200u) << "the ended binding's bytes stay in the total";
    EXPECT_EQ(mx.commit_latency().snapshot().count, 3u) << "two grants and one end";

    std::string text = daemon::metrics_json(*m, "test");
    auto j = nlohmann::json::parse(text);
    ASSERT_EQ(j["bindings"].size(), 1u);
    EXPECT_EQ(j["bindings"][0]["count"], 1);
    EXPECT_EQ(j["bindings"][0]["rule"], "fake");
    EXPECT_EQ(text.find(a->id), std::string::npos);
    for (const char *key : {"\"id\"", "\"uid\"", "\"pid\"", "\"key_id\""})
        EXPECT_EQ(text.find(key), std::string::npos) << key << " in " << text;
    m->shutdown();
}

// Issue #51, failure 5: what ends bindings ends the grants still waiting for their journal
// commit too, and says so in its count: a reload that withdraws their rule, a pod's DEL, a
// revoke, their netdev going. The caller is refused with the reason, nothing is attached, and
// the session (it reached the disk) ends with that reason.
TEST_F(BindingManagerTest, GrantsInFlightAreWithdrawnByWhatEndsBindings) {
    std::string policy = fake_rule(16) + "\n[[rule]]\nname = \"ml-pods\"\nk8s_namespaces = "
                                         "[\"ml\"]\nnetdevs = [\"nic0\"]\nmax_region = \"1MiB\"\n"
                                         "flows = [\"udp * -> *:*\"]\niommu = \"any\"\n";
    auto m = make(policy);
    daemon::PodSandbox sandbox;
    sandbox.container_id = "sandbox-a";
    sandbox.ifname = "eth0";
    sandbox.netns = {1, 4242};
    sandbox.pod = {"ml", "infer-0", "u-1", {}};
    ASSERT_TRUE(m->pods().add(sandbox).ok());
    daemon::Peer in_pod = user(1000);
    in_pod.pod = sandbox.pod;
    in_pod.pod_sandbox = sandbox.container_id;
    in_pod.process_proof = daemon::ProcessProof::attested;
    in_pod.host_netns = false;

    // A reload that no longer grants it.
    std::optional<Result<daemon::Granted>> reloaded, deleted, netdev;
    ask(*m, user(2000), 5001, reloaded);
    ASSERT_FALSE(reloaded.has_value()) << "waits for the journal";
    std::string only_1000 = policy;
    only_1000.replace(only_1000.find("any_caller = true"), 17, "users = [1000]");
    m->set_policy_loader([&] { return Result<policy::Policy>(parse_or_fail(only_1000)); });
    auto revoked = m->reload(user(0), "test");
    ASSERT_TRUE(revoked.ok()) << revoked.error().message;
    EXPECT_EQ(*revoked, 1u) << "the grant in flight is counted";
    // A pod's DEL.
    ask(*m, in_pod, 5002, deleted);
    ASSERT_FALSE(deleted.has_value());
    EXPECT_EQ(m->pod_deleted("sandbox-a", "eth0"), 1u) << "the grant in flight is counted";
    // Its netdev going.
    ask(*m, user(1000), 5003, netdev);
    ASSERT_FALSE(netdev.has_value());
    m->netdev_gone("nic0", daemon::EndReason::link_removed);

    ASSERT_TRUE(drain([&] { return reloaded && deleted && netdev; }));
    for (auto [answer, reason] :
         std::initializer_list<std::pair<std::optional<Result<daemon::Granted>> *, const char *>>{
             {&reloaded, "policy-reload"}, {&deleted, "pod-deleted"}, {&netdev, "link-removed"}}) {
        ASSERT_FALSE((*answer)->ok()) << reason << ": granted anyway";
        EXPECT_EQ((*answer)->error().code, Errc::denied) << reason;
        EXPECT_NE((*answer)->error().message.find(reason), std::string::npos)
            << (*answer)->error().message;
    }
    EXPECT_TRUE(driver.attached.empty()) << "nothing withdrawn stays on the data path";
    EXPECT_TRUE(m->bindings().empty());
    m->shutdown();
    for (const char *reason : {"policy-reload", "pod-deleted", "link-removed"})
        EXPECT_EQ(
            count(rig.config.journal_path,
                  std::string("SELECT count(*) FROM sessions WHERE end_reason = '") + reason + "'"),
            1)
            << reason;
}

// Decided again at commit: a grant whose pod went away without the manager ending it (its
// registration replaced while in flight) is not handed out.
TEST_F(BindingManagerTest, AGrantInFlightIsDecidedAgainAtCommit) {
    std::string policy = "[[rule]]\nname = \"ml-pods\"\nk8s_namespaces = [\"ml\"]\nnetdevs = "
                         "[\"nic0\"]\nmax_region = \"1MiB\"\nflows = [\"udp * -> *:*\"]\niommu = "
                         "\"any\"\n";
    auto m = make(policy);
    daemon::PodSandbox sandbox;
    sandbox.container_id = "sandbox-b";
    sandbox.ifname = "eth0";
    sandbox.netns = {1, 4343};
    sandbox.pod = {"ml", "infer-1", "u-2", {}};
    ASSERT_TRUE(m->pods().add(sandbox).ok());
    daemon::Peer in_pod = user(1000);
    in_pod.pod = sandbox.pod;
    in_pod.pod_sandbox = sandbox.container_id;
    in_pod.process_proof = daemon::ProcessProof::attested;
    in_pod.host_netns = false;
    std::optional<Result<daemon::Granted>> answer;
    ask(*m, in_pod, 5004, answer);
    ASSERT_FALSE(answer.has_value());
    (void)m->pods().remove("sandbox-b", ""); // not through pod_deleted: only the commit sees it
    ASSERT_TRUE(drain([&] { return answer.has_value(); }));
    ASSERT_FALSE(answer->ok());
    EXPECT_NE(answer->error().message.find("pod-deleted"), std::string::npos)
        << answer->error().message;
    EXPECT_TRUE(driver.attached.empty());
    m->shutdown();
}

// Issue #53: the holder (its key) tags its binding with a job, once; a wrong key, a bad string
// or a second call changes nothing. The tag is journaled (job-tagged, detail {job, group,
// rank}) and the chain still verifies.
TEST_F(BindingManagerTest, OnlyTheHolderTagsItsBindingWithAJobOnceAndItIsJournaled) {
    auto m = make();
    daemon::Peer me = this_process(1000);
    auto g = grant(*m, me, 5000);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const daemon::Binding *b = m->find(g->id);
    ASSERT_NE(b, nullptr);
    EXPECT_FALSE(b->job) << "untagged until SetJob";

    std::vector<std::uint8_t> wrong(g->key.begin(), g->key.end());
    wrong[0] ^= 1;
    auto refused = m->set_job(g->id, me, wrong, {"job-123", "0", 1});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::denied);
    auto other = m->set_job(g->id, user(1001), g->key, {"job-123", "0", 1});
    ASSERT_FALSE(other.ok()) << "another process, even with the key's bytes";
    EXPECT_EQ(other.error().code, Errc::denied);
    auto missing = m->set_job("nope", me, g->key, {"job-123", "0", 1});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().code, Errc::not_found);
    for (daemon::JobTag bad : std::vector<daemon::JobTag>{{"", "", 0},
                                                          {std::string(65, 'j'), "", 0},
                                                          {"job 1", "", 0},
                                                          {"job\n1", "", 0},
                                                          {"(other)", "", 0},
                                                          {"job", "g\"}", 0},
                                                          {"job", std::string(65, 'g'), 0},
                                                          {"job", "", 65536}}) {
        auto r = m->set_job(g->id, me, g->key, bad);
        ASSERT_FALSE(r.ok()) << "job '" << bad.job << "' group '" << bad.group << "'";
        EXPECT_EQ(r.error().code, Errc::invalid_argument);
        EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
        EXPECT_FALSE(m->find(g->id)->job) << "nothing changed";
    }

    ASSERT_TRUE(m->set_job(g->id, me, g->key, {"10.0.0.1:29500", "0", 3}).ok());
    ASSERT_TRUE(m->find(g->id)->job);
    EXPECT_EQ(m->find(g->id)->job->job, "10.0.0.1:29500");
    EXPECT_EQ(m->find(g->id)->job->group, "0");
    EXPECT_EQ(m->find(g->id)->job->rank, 3u);
    auto again = m->set_job(g->id, me, g->key, {"job-2", "", 0});
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error().code, Errc::invalid_argument);
    EXPECT_NE(again.error().message.find("already tagged"), std::string::npos)
        << again.error().message;
    EXPECT_EQ(m->find(g->id)->job->job, "10.0.0.1:29500") << "the first tag stays";
    m->shutdown();

    const std::string &db = rig.config.journal_path;
    EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'job-tagged'"), 1);
    EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'job-tagged' AND session_id = '" +
                            g->id +
                            "' AND uid = 1000 AND json_extract(detail, '$.job') = "
                            "'10.0.0.1:29500' AND json_extract(detail, '$.group') = '0' AND "
                            "json_extract(detail, '$.rank') = 3"),
              1);
    // Every refusal above (a wrong key, another process, 8 bad tags, a second tag) is in the
    // journal, one by one or in a coalesced window's count; the unknown id names no binding.
    EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'job-tag-refused'") +
                  count(db, "SELECT coalesce(sum(json_extract(detail, '$.count')), 0) FROM events "
                            "WHERE kind = 'refusals-coalesced' AND decision = 'job-tag-refused'"),
              11);
    EXPECT_EQ(count(db, "SELECT count(*) FROM events WHERE kind = 'job-tag-refused' AND "
                        "decision = 'key-refused' AND uid = 1000"),
              1);
    auto v = journal::verify_chain(db);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->ok) << v->problem;
}

// What a tag may be: a store's address or a job name, in a bounded alphabet and length.
TEST(JobTag, AcceptsAddressesAndNamesAndNothingElse) {
    for (const char *ok : {"10.0.0.1:29500", "job-123", "team/run@3_v1.2", "j"})
        EXPECT_TRUE(daemon::check_job_tag({ok, "", 0}).ok()) << ok;
    EXPECT_TRUE(daemon::check_job_tag({std::string(64, 'j'), std::string(64, 'g'), 65535}).ok());
    for (const char *bad :
         {"", "a b", "a,b", "[::1]:1", "é", "a=b", "x\"y", "a\\b", "a#1", "-x", "--json"})
        EXPECT_FALSE(daemon::check_job_tag({bad, "", 0}).ok()) << bad;
    EXPECT_FALSE(daemon::check_job_tag({"job", "-g", 0}).ok()) << "nor a group";
    EXPECT_FALSE(daemon::check_job_tag({std::string("a\0b", 3), "", 0}).ok());
    auto r = daemon::check_job_tag({"job\x1b[2J", "", 0});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message.find('\x1b'), std::string::npos) << "escaped in the message";
}

// GetMetrics counts live bindings per job, untagged ones not at all; past 64 jobs the rest
// are summed as "(other)", so callers' tags cannot grow the series without bound.
TEST_F(BindingManagerTest, MetricsCountLiveBindingsPerJobWithinABound) {
    auto m = make(many_per_user);
    daemon::Peer me = this_process(1000);
    std::vector<daemon::Granted> gs;
    for (int port = 5000; port < 5003; ++port) {
        auto g = grant(*m, me, port);
        ASSERT_TRUE(g.ok()) << g.error().message;
        gs.push_back(std::move(*g));
    }
    ASSERT_TRUE(m->set_job(gs[0].id, me, gs[0].key, {"job-a", "0", 0}).ok());
    ASSERT_TRUE(m->set_job(gs[1].id, me, gs[1].key, {"job-a", "0", 1}).ok());
    auto j = nlohmann::json::parse(daemon::metrics_json(*m, "test"));
    EXPECT_EQ(j["jobs"], nlohmann::json::parse(R"([{"job": "job-a", "count": 2}])")) << j.dump();
    std::optional<Result<void>> released;
    m->release(gs[0].id, me, false, [&](Result<void> r) { released = r; });
    ASSERT_TRUE(drain([&] { return released.has_value(); }));
    j = nlohmann::json::parse(daemon::metrics_json(*m, "test"));
    EXPECT_EQ(j["jobs"], nlohmann::json::parse(R"([{"job": "job-a", "count": 1}])")) << j.dump();
    m->shutdown();

    std::map<std::string, std::uint64_t> per_job;
    for (int i = 0; i < 70; ++i)
        per_job["job-" + std::to_string(100 + i)] = i == 69 ? 5 : 1;
    per_job["empty"] = 0;
    auto series = daemon::job_series(per_job);
    ASSERT_EQ(series.size(), daemon::max_job_series + 1);
    EXPECT_EQ(series.front(), (std::pair<std::string, std::uint64_t>{"job-169", 5}))
        << "the job with the most bindings first";
    EXPECT_EQ(series[1].first, "job-100") << "then by name";
    EXPECT_EQ(series.back(), (std::pair<std::string, std::uint64_t>{"(other)", 6}))
        << "70 jobs: 64 series and the other 6 bindings summed";
    std::uint64_t total = 0;
    for (auto &[job, n] : series)
        total += n;
    EXPECT_EQ(total, 74u) << "nothing lost";
    EXPECT_EQ(daemon::job_series({{"a", 1}, {"b", 2}}).size(), 2u) << "no (other) under the bound";
}

// A binding kept across a restart (the handoff) keeps its job tag, under the record's MAC.
TEST_F(BindingManagerTest, AHandedOverBindingKeepsItsJobTag) {
    MemoryStore store;
    auto first = rig.manager(driver, parse_or_fail(many_per_user), &events);
    first->set_handle_store(&store);
    first->start();
    daemon::Peer me = this_process(1000);
    auto tagged = grant(*first, me, 5000);
    auto untagged = grant(*first, me, 5001);
    ASSERT_TRUE(tagged.ok() && untagged.ok());
    ASSERT_TRUE(first->set_job(tagged->id, me, tagged->key, {"job-7", "1", 2}).ok());
    ASSERT_EQ(first->hand_off(), 2u);
    first.reset();
    auto second = rig.manager(driver, parse_or_fail(many_per_user), &events);
    second->set_handle_store(&store);
    second->start();
    const daemon::Binding *b = second->find(tagged->id);
    ASSERT_NE(b, nullptr);
    ASSERT_TRUE(b->job);
    EXPECT_EQ(b->job->job, "job-7");
    EXPECT_EQ(b->job->group, "1");
    EXPECT_EQ(b->job->rank, 2u);
    ASSERT_NE(second->find(untagged->id), nullptr);
    EXPECT_FALSE(second->find(untagged->id)->job);
    auto again = second->set_job(tagged->id, me, tagged->key, {"job-8", "", 0});
    EXPECT_FALSE(again.ok()) << "still tagged once";
    second->shutdown();
}

// Binding.DmabufId reads the driver's id of the binding's dma-buf through the manager: none
// before activation (nothing is bound), bind-rx's answer once active, none again once detached.
TEST_F(BindingManagerTest, TheDriverSaysEachBindingsDmabufIdOnceActive) {
    auto m = make();
    daemon::Peer me = this_process(1000);
    auto a = grant(*m, me, 5000);
    auto b = grant(*m, me, 5001);
    ASSERT_TRUE(a.ok() && b.ok());
    const driver::Driver &d = m->driver();
    EXPECT_EQ(d.dmabuf_id(a->id), std::nullopt) << "granted, not active: nothing bound yet";
    ASSERT_TRUE(m->activate(a->id, me, a->key).ok());
    ASSERT_TRUE(m->activate(b->id, me, b->key).ok());
    EXPECT_EQ(d.dmabuf_id(a->id), std::optional<std::uint32_t>(41));
    EXPECT_EQ(d.dmabuf_id(b->id), std::optional<std::uint32_t>(42)) << "each binding its own";
    bool released = false;
    m->release(a->id, me, false, [&](Result<void> r) {
        EXPECT_TRUE(r.ok());
        released = true;
    });
    ASSERT_TRUE(drain([&] { return released; }));
    EXPECT_EQ(d.dmabuf_id(a->id), std::nullopt) << "released: unbound";
    EXPECT_EQ(d.dmabuf_id(b->id), std::optional<std::uint32_t>(42));
    EXPECT_EQ(d.dmabuf_id("b-none"), std::nullopt);
    m->shutdown();
}

// The sim binds no dma-buf of the kernel's: it has none for any binding (the interface's
// default, which Binding.DmabufId shows as 0).
TEST(DriverDmabufId, TheSimHasNone) {
    driver::SimConfig c;
    c.datapath = false;
    driver::SimDriver sim(c, nullptr);
    EXPECT_EQ(sim.dmabuf_id("b1"), std::nullopt);
}
