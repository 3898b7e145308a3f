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

#include <cstring>
#include <map>
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
    sink.write(rec);
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
    int p[2];
    ASSERT_EQ(pipe(p), 0);
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
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    auto f = fields_of(got);
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

namespace {
class SlowSink : public sinks::Sink {
  public:
    const char *name() const override { return "slow"; }
    void write(const sinks::SinkRecord &) override { usleep(20000); }
};
} // namespace

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
