// The journald sink's fields, read back from a stand-in journald socket. The test runs in a
// child with a private mount namespace and a tmpfs over /run, so the host is untouched.
#include "daemon/sinks/sinks.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

using namespace knod;

namespace {

// In a child: fake journald, send one record through the sink, write the datagram to `out`.
void capture(int out, const sinks::SinkRecord &rec) {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") != 0)
        _exit(2);
    mkdir("/run/systemd", 0755);
    mkdir("/run/systemd/journal", 0755);
    int s = socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, "/run/systemd/journal/socket");
    if (bind(s, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) _exit(3);
    sinks::JournaldSink sink;
    if (!sink.write(rec)) _exit(5);
    char buf[8192];
    ssize_t n = recv(s, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) _exit(4);
    (void)!write(out, buf, static_cast<std::size_t>(n));
    _exit(0);
}

std::map<std::string, std::string> fields_of(const std::string &datagram) {
    std::map<std::string, std::string> out;
    std::istringstream in(datagram);
    std::string line;
    while (std::getline(in, line)) {
        auto eq = line.find('=');
        if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return out;
}

// `rec` as the journald sink sends it, captured in a child (capture()): the datagram's fields,
// and the child's wait status.
std::map<std::string, std::string> journald_fields(const sinks::SinkRecord &rec, int &status) {
    int p[2];
    if (pipe(p) != 0) return {};
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        capture(p[1], rec);
    }
    close(p[1]);
    std::string got;
    char buf[8192];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0)
        got.append(buf, static_cast<std::size_t>(n));
    close(p[0]);
    waitpid(pid, &status, 0);
    return fields_of(got);
}

} // namespace

TEST(Sinks, JournaldEntryCarriesTheFields) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for a private mount namespace";
    sinks::SinkRecord rec;
    rec.event.kind = journal::kind::denied;
    rec.event.uid = 1234;
    rec.event.session_id = "babc";
    rec.event.rule = "no-guests";
    rec.event.decision = "deny";
    rec.event.reason = "denied by rule 'no-guests'";
    rec.netdev = "eth2";
    rec.gpu = "0000:c1:00.0";
    int status = 0;
    auto f = journald_fields(rec, status);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    EXPECT_EQ(f["MESSAGE_ID"], sinks::JournaldSink::message_id(journal::kind::denied));
    EXPECT_NE(f["MESSAGE_ID"], sinks::JournaldSink::message_id(journal::kind::granted));
    EXPECT_EQ(f["KNOD_EVENT"], "request-denied");
    EXPECT_EQ(f["KNOD_UID"], "1234");
    EXPECT_EQ(f["KNOD_BINDING"], "babc");
    EXPECT_EQ(f["KNOD_NETDEV"], "eth2");
    EXPECT_EQ(f["KNOD_GPU"], "0000:c1:00.0");
    EXPECT_EQ(f["KNOD_RULE"], "no-guests");
    EXPECT_EQ(f["KNOD_DECISION"], "deny");
    EXPECT_EQ(f["SYSLOG_IDENTIFIER"], "knod-policyd");
    EXPECT_NE(f["MESSAGE"].find("request-denied"), std::string::npos);
}

// #16 item 2: an anchor record names its journal, so `audit verify` can match it to one.
TEST(Sinks, AnchorRecordsCarryTheJournalIdentity) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for a private mount namespace";
    sinks::SinkRecord rec;
    rec.event.kind = journal::kind::anchor;
    rec.event.detail = R"({"journal_id":"0123456789abcdef0123456789abcdef",)"
                       R"("path":"/var/lib/knod-policy/journal.db","seq":42,"hash":")" +
                       std::string(64, 'a') + "\"}";
    int status = 0;
    auto f = journald_fields(rec, status);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    EXPECT_EQ(f["KNOD_EVENT"], "journal-anchor");
    EXPECT_EQ(f["KNOD_JOURNAL_ID"], "0123456789abcdef0123456789abcdef");
    EXPECT_EQ(f["KNOD_JOURNAL_PATH"], "/var/lib/knod-policy/journal.db");
    EXPECT_EQ(f["KNOD_SEQ"], "42");
    EXPECT_EQ(f["KNOD_HASH"], std::string(64, 'a'));
}

namespace {
class SlowSink : public sinks::Sink {
  public:
    const char *name() const override { return "slow"; }
    Result<void> write(const sinks::SinkRecord &) override {
        usleep(20000);
        return {};
    }
};

// Fails while `broken` is set, with a fixed error.
class SwitchSink : public sinks::Sink {
  public:
    explicit SwitchSink(std::atomic<bool> &broken) : broken_(broken) {}
    const char *name() const override { return "switch"; }
    Result<void> write(const sinks::SinkRecord &) override {
        if (broken_) return make_error(Errc::io, "switched off");
        return {};
    }

  private:
    std::atomic<bool> &broken_;
};

struct Change {
    std::string sink;
    bool failing;
    std::string error;
};
} // namespace

// #16 item 8: with no journald the send fails; the sink says so instead of dropping it silently.
TEST(Sinks, JournaldWithoutJournaldIsAnError) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for a private mount namespace";
    pid_t pid = fork();
    if (pid == 0) { // an empty /run: no journald socket
        if (unshare(CLONE_NEWNS) != 0 ||
            mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") != 0)
            _exit(2);
        sinks::JournaldSink sink;
        sinks::SinkRecord rec;
        rec.event.kind = journal::kind::granted;
        auto r = sink.write(rec);
        _exit(!r && r.error().message.find("no journald") != std::string::npos ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Sinks, FailuresAreCountedAndEachChangeReportedOnce) {
    std::atomic<bool> broken{true};
    std::vector<std::unique_ptr<sinks::Sink>> list;
    list.push_back(std::make_unique<SwitchSink>(broken));
    sinks::SinkQueue q(std::move(list), 64, std::chrono::milliseconds(0));
    std::mutex mu;
    std::vector<Change> changes;
    q.on_transition([&](const std::string &sink, bool failing, const std::string &error) {
        std::lock_guard lock(mu);
        changes.push_back({sink, failing, error});
    });
    for (int i = 0; i < 5; ++i)
        q.offer({});
    q.drain();
    broken = false;
    for (int i = 0; i < 3; ++i)
        q.offer({});
    q.drain();
    auto st = q.stats();
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].name, "switch");
    EXPECT_EQ(st[0].failed, 5u);
    EXPECT_EQ(st[0].written, 3u);
    EXPECT_FALSE(st[0].failing);
    EXPECT_EQ(st[0].last_error, "switched off");
    std::lock_guard lock(mu);
    ASSERT_EQ(changes.size(), 2u); // failing once for five failures, recovered once
    EXPECT_TRUE(changes[0].failing);
    EXPECT_EQ(changes[0].sink, "switch");
    EXPECT_EQ(changes[0].error, "switched off");
    EXPECT_FALSE(changes[1].failing);
}

TEST(Sinks, ASinkThatWorksReportsNothing) {
    std::atomic<bool> broken{false};
    std::vector<std::unique_ptr<sinks::Sink>> list;
    list.push_back(std::make_unique<SwitchSink>(broken));
    sinks::SinkQueue q(std::move(list), 64, std::chrono::milliseconds(0));
    int changes = 0;
    q.on_transition([&](const std::string &, bool, const std::string &) { ++changes; });
    for (int i = 0; i < 4; ++i)
        q.offer({});
    q.drain();
    EXPECT_EQ(changes, 0);
    EXPECT_EQ(q.stats()[0].written, 4u);
    EXPECT_EQ(q.stats()[0].failed, 0u);
}

// A sink that flaps on every record reports one change per hold-off, not one per record.
TEST(Sinks, AFlappingSinkIsHeldOff) {
    std::atomic<bool> broken{false};
    std::vector<std::unique_ptr<sinks::Sink>> list;
    list.push_back(std::make_unique<SwitchSink>(broken));
    sinks::SinkQueue q(std::move(list), 64, std::chrono::hours(1));
    int changes = 0;
    q.on_transition([&](const std::string &, bool, const std::string &) { ++changes; });
    for (int i = 0; i < 20; ++i) {
        broken = i % 2 == 0;
        q.offer({});
        q.drain();
    }
    EXPECT_EQ(changes, 1);
    EXPECT_EQ(q.stats()[0].failed, 10u);
    EXPECT_EQ(q.stats()[0].written, 10u);
}

TEST(Sinks, AFullQueueDropsAndCountsInsteadOfBlocking) {
    std::vector<std::unique_ptr<sinks::Sink>> list;
    list.push_back(std::make_unique<SlowSink>());
    auto q = std::make_unique<sinks::SinkQueue>(std::move(list), 8);
    for (int i = 0; i < 100; ++i)
        q->offer({}); // returns at once every time
    EXPECT_GT(q->dropped(), 0u);
    std::uint64_t dropped = q->dropped();
    q.reset(); // drains what was queued
    EXPECT_LE(dropped, 100u);
    EXPECT_GE(dropped, 100u - 8u - 2u); // the queue held 8, the thread may have taken a batch
}

// #52 item 4: a head carries its run and number, and goes at LOG_WARNING (journald's rate limit
// keeps a pool per priority; notice and info share the event lines' one).
TEST(Sinks, HeadsAreNumberedAndSentAtWarning) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for a private mount namespace";
    sinks::SinkRecord rec;
    rec.event.kind = journal::kind::anchor;
    rec.event.detail = R"({"journal_id":"0123456789abcdef0123456789abcdef","path":"/j.db",)"
                       R"("seq":42,"run":"00112233445566778899aabbccddeeff","n":7,"hash":")" +
                       std::string(64, 'a') + "\"}";
    int status = 0;
    auto f = journald_fields(rec, status);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    EXPECT_EQ(f["KNOD_HEAD_RUN"], "00112233445566778899aabbccddeeff");
    EXPECT_EQ(f["KNOD_HEAD_N"], "7");
    EXPECT_EQ(f["PRIORITY"], "4");
    sinks::SinkRecord line;
    line.event.kind = journal::kind::granted;
    f = journald_fields(line, status);
    EXPECT_EQ(f["PRIORITY"], "6");
    EXPECT_EQ(f["KNOD_HEAD_N"], "");
}

namespace {
// Keeps heads; its first write waits until released, so the queue behind it fills.
class GateSink : public sinks::Sink {
  public:
    const char *name() const override { return "journald"; }
    bool keeps_heads() const override { return true; }
    Result<void> write(const sinks::SinkRecord &) override {
        std::unique_lock lock(mu_);
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [this] { return open_; });
        return {};
    }
    void wait_entered() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return entered_; });
    }
    void open() {
        std::lock_guard lock(mu_);
        open_ = true;
        cv_.notify_all();
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool entered_ = false, open_ = false;
};
} // namespace

// #52 item 4: a full queue drops an event line (the database has the event), never a head (a
// head lost is a gap an auditor cannot tell from a cut).
TEST(Sinks, AFullQueueNeverDropsAHead) {
    std::vector<std::unique_ptr<sinks::Sink>> list;
    list.push_back(std::make_unique<GateSink>());
    auto *gate = static_cast<GateSink *>(list.back().get());
    sinks::SinkQueue q(std::move(list), 4);
    sinks::SinkRecord line;
    line.event.kind = journal::kind::granted;
    q.offer(line);
    gate->wait_entered(); // the thread holds that one; the queue is empty
    for (int i = 0; i < 4; ++i)
        q.offer(line);
    sinks::SinkRecord head;
    head.event.kind = journal::kind::anchor;
    head.event.detail = R"({"seq":42,"run":"00112233445566778899aabbccddeeff","n":1})";
    q.offer(head); // the queue is full
    EXPECT_EQ(q.dropped(), 1u);
    gate->open();
    q.drain();
    auto st = q.stats();
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].heads_written, 1u);
    EXPECT_EQ(st[0].last_head_seq, 42);
    EXPECT_EQ(st[0].written, 5u); // the first line, three of the four, the head
}
