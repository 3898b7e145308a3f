// Availability (#30): callers who open many bus connections, as real unprivileged uids, on a
// private dbus-daemon with the system bus's limits (dbus-daemon's built-in defaults, which
// Debian's system.conf ships commented out: max_connections_per_user 256,
// max_match_rules_per_connection 512, max_replies_per_connection 128, ...). Before, each caller
// connection cost the daemon one match rule on the bus; the 513th made sd-bus close the
// daemon's connection, and every binding ended as daemon-stop.
#include "protocol/names.h"
#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

using namespace knod::test;

namespace {

// Users the bus knows (dbus-daemon refuses uids without a passwd entry): games, man, lp; news.
constexpr uid_t attackers[] = {5, 6, 7};
constexpr uid_t bystander = 9;

// What one attacking process saw: calls answered, refused by name, and anything else.
struct Tally {
    int ok = 0, limits = 0, other = 0;
    std::string first_other;
};

// A process as `uid` that opens `want` connections, calls ListBindings once on each, reports
// its tally on a pipe and keeps every connection open until release() (or destruction).
class Attacker {
  public:
    Attacker(const Sandbox &s, uid_t uid, int want) {
        int report[2], hold[2];
        if (pipe2(report, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            // Only its own pipes: another attacker's hold end left open here would keep that
            // one from ever seeing its end of file.
            for (int fd = 3; fd < 1024; ++fd)
                if (fd != report[1] && fd != hold[0]) close(fd);
            if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
                setresuid(uid, uid, uid) != 0)
                _exit(3);
            run(s.address(), want, report[1], hold[0]);
        }
        close(report[1]);
        close(hold[0]);
        report_ = report[0];
        hold_ = hold[1];
    }
    ~Attacker() { release(); }
    Attacker(const Attacker &) = delete;
    Attacker &operator=(const Attacker &) = delete;

    // The tally, once the process has called on every connection (up to 60 s).
    std::optional<Tally> tally() {
        std::string line;
        struct pollfd p {
            report_, POLLIN, 0
        };
        while (poll(&p, 1, 60'000) == 1) {
            char c;
            if (read(report_, &c, 1) != 1 || c == '\n') break;
            line += c;
        }
        std::istringstream in(line);
        Tally t;
        if (!(in >> t.ok >> t.limits >> t.other)) return std::nullopt;
        std::getline(in, t.first_other);
        return t;
    }
    // Closes every connection (the process exits) and waits for it.
    void release() {
        if (pid_ <= 0) return;
        close(hold_);
        close(report_);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

  private:
    [[noreturn]] static void run(const std::string &address, int want, int report, int hold) {
        std::vector<sd_bus *> buses;
        Tally t;
        for (int i = 0; i < want; ++i) {
            sd_bus *bus = nullptr;
            if (sd_bus_new(&bus) < 0) break;
            sd_bus_set_address(bus, address.c_str());
            sd_bus_set_bus_client(bus, 1);
            if (sd_bus_start(bus) < 0) {
                sd_bus_unref(bus);
                ++t.other;
                continue;
            }
            buses.push_back(bus);
            sd_bus_error err = SD_BUS_ERROR_NULL;
            sd_bus_message *reply = nullptr;
            int r =
                sd_bus_call_method(bus, knod::bus::service_name, knod::bus::manager_path,
                                   knod::bus::manager_interface, "ListBindings", &err, &reply, "");
            if (r >= 0)
                ++t.ok;
            else if (err.name && std::strcmp(err.name, knod::bus::error::limits_exceeded) == 0)
                ++t.limits;
            else {
                ++t.other;
                if (t.first_other.empty())
                    t.first_other = err.name ? err.name : std::string(std::strerror(-r));
            }
            sd_bus_message_unref(reply);
            sd_bus_error_free(&err);
        }
        std::string line = std::to_string(t.ok) + " " + std::to_string(t.limits) + " " +
                           std::to_string(t.other) + " " + t.first_other + "\n";
        (void)!write(report, line.data(), line.size());
        char c;
        (void)!read(hold, &c, 1); // until the test closes its end
        _exit(0);
    }

    pid_t pid_ = -1;
    int report_ = -1, hold_ = -1;
};

bool daemon_alive(const Sandbox &s) {
    return s.daemon_pid() > 0 && waitpid(s.daemon_pid(), nullptr, WNOHANG) == 0;
}

const std::string flow = "udp 10.99.0.1:* -> 10.99.0.2:5000";

// One Attacker per attacking uid, each with `connections` connections of its own.
std::vector<std::unique_ptr<Attacker>> attack_from_every_uid(const Sandbox &sb, int connections) {
    std::vector<std::unique_ptr<Attacker>> attack;
    for (uid_t uid : attackers)
        attack.push_back(std::make_unique<Attacker>(sb, uid, connections));
    return attack;
}

} // namespace

// The attack, with the daemon's default bounds (256 connections per uid: the bus's own
// limit, so none is reached): three uids, 255 connections each, one call on each. Every call is
// answered, the daemon stays on the bus, and a fourth user's binding stays.
TEST(Availability, ThreeUsersWithManyConnectionsDoNotTakeTheDaemonOffTheBus) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy, {"--rate-limit=1000000"});
    Holder h(sb, {"knodsim0", "sim0", "4096", flow}, bystander);
    ASSERT_TRUE(h.ok()) << h.line();
    auto attack = attack_from_every_uid(sb, 255);
    for (std::size_t i = 0; i < attack.size(); ++i) {
        auto t = attack[i]->tally();
        ASSERT_TRUE(t) << "attacker " << attackers[i] << " reported nothing";
        EXPECT_EQ(t->ok, 255) << "uid " << attackers[i] << ": " << t->limits << " refused, "
                              << t->other << " failed (" << t->first_other << ")";
    }
    // 765 connections held open: the daemon answers, root and the bystander alike.
    ASSERT_TRUE(daemon_alive(sb)) << slurp(sb.dir() + "/bus.log");
    auto listed = sb.client().list();
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].id, h.id());
    EXPECT_EQ(sb.run_client({"list"}, bystander).out, "ok " + h.id());
    attack.clear(); // 765 connections leave at once
    EXPECT_EQ(sb.run_client({"list"}, bystander).out, "ok " + h.id());
    EXPECT_TRUE(daemon_alive(sb));
    EXPECT_EQ(slurp(sb.dir() + "/bus.log").find("max_match_rules_per_connection"),
              std::string::npos);
    EXPECT_EQ(sb.sql("select count(*) from sessions where end_reason is not null"), "0");
}

// With a lower bound per uid, the attackers get the named refusal past it, journaled and
// coalesced; the bystander is never refused; a connection that leaves is forgotten, so the same
// uid is served again afterwards (nothing is kept for a refused or departed connection).
TEST(Availability, PastTheBoundPerUserTheCallerIsRefusedByName) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy, {"--rate-limit=1000000", "--max-connections-per-user=200"});
    Holder h(sb, {"knodsim0", "sim0", "4096", flow}, bystander);
    ASSERT_TRUE(h.ok()) << h.line();
    auto attack = attack_from_every_uid(sb, 255);
    for (std::size_t i = 0; i < attack.size(); ++i) {
        auto t = attack[i]->tally();
        ASSERT_TRUE(t) << "attacker " << attackers[i] << " reported nothing";
        EXPECT_EQ(t->ok, 200) << "uid " << attackers[i];
        EXPECT_EQ(t->limits, 55) << "uid " << attackers[i];
        EXPECT_EQ(t->other, 0) << t->first_other;
    }
    ASSERT_TRUE(daemon_alive(sb));
    EXPECT_EQ(sb.run_client({"list"}, bystander).out, "ok " + h.id());
    // Refused by name, and journaled: the first in full, the rest coalesced into a count.
    std::string uid = std::to_string(attackers[0]);
    EXPECT_EQ(sb.sql("select count(*) > 0 from events where kind = 'rate-limited' and uid = " +
                     uid + " and reason like 'ListBindings refused: at most 200 connections%'"),
              "1");
    EXPECT_LE(std::stoi(sb.sql("select count(*) from events where kind = 'rate-limited' and "
                               "uid = " +
                               uid)),
              2)
        << "55 refusals are journaled once, with a count";
    attack.clear();
    // Their connections left: the same uid is served in full again.
    EXPECT_TRUE(eventually(
        [&] {
            Attacker again(sb, attackers[0], 200);
            auto t = again.tally();
            return t && t->ok == 200;
        },
        30'000));
    EXPECT_TRUE(daemon_alive(sb));
    EXPECT_EQ(sb.sql("select count(*) from sessions where end_reason is not null"), "0");
}
