// Availability (#30): callers who open many bus connections, as real unprivileged uids, on a
// private dbus-daemon with the system bus's limits (dbus-daemon's built-in defaults, which
// Debian's system.conf ships commented out: max_connections_per_user 256,
// max_match_rules_per_connection 512, max_replies_per_connection 128, ...). Before, each caller
// connection cost the daemon one match rule on the bus; the 513th made sd-bus close the
// daemon's connection, and every binding ended as daemon-stop.
#include "knod/client.h"
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
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// A process as `uid` that opens `want` connections, calls `method` (no arguments: ListBindings,
// Subscribe) once on each, reports its tally on a pipe and keeps every connection open until
// release() (or destruction).
class Attacker {
  public:
    Attacker(const Sandbox &s, uid_t uid, int want, const char *method = "ListBindings") {
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
            run(s.address(), want, method, report[1], hold[0]);
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
    [[noreturn]] static void run(const std::string &address, int want, const char *method,
                                 int report, int hold) {
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
            int r = sd_bus_call_method(bus, knod::bus::service_name, knod::bus::manager_path,
                                       knod::bus::manager_interface, method, &err, &reply, "");
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
    // Refused by name, and journaled (by the journal's writer, after the replies): the first in
    // full, the rest coalesced into a count.
    std::string uid = std::to_string(attackers[0]);
    EXPECT_TRUE(eventually([&] {
        return sb.sql(
                   "select count(*) > 0 from events where kind = 'rate-limited' and uid = " + uid +
                   " and reason like 'ListBindings refused: at most 200 connections%'") == "1";
    }));
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

// Subscriptions are bounded per uid and in all (each is a unicast of every signal its
// subscriber may see): past either bound the caller gets the named refusal, journaled; a
// subscribed connection that leaves gives its place back.
TEST(Availability, SubscriptionsAreBoundedPerUserAndInAll) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy,
               {"--rate-limit=1000000", "--max-subscriptions-per-user=3", "--max-subscriptions=5"});
    Attacker first(sb, attackers[0], 4, "Subscribe");
    auto t = first.tally();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->ok, 3) << "the bound per user";
    EXPECT_EQ(t->limits, 1);
    EXPECT_EQ(t->other, 0) << t->first_other;
    Attacker second(sb, attackers[1], 3, "Subscribe");
    t = second.tally();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->ok, 2) << "the bound in all: 3 + 2";
    EXPECT_EQ(t->limits, 1);
    // Root is not bounded.
    auto root = sb.client();
    EXPECT_TRUE(root.subscribe().ok());
    // Journaled (by the journal's writer, after the reply).
    EXPECT_TRUE(eventually([&] {
        return sb.sql("select count(*) > 0 from events where kind = 'rate-limited' and uid = " +
                      std::to_string(attackers[0]) +
                      " and reason like 'Subscribe refused: at most 3 subscribed connections "
                      "per user%'") == "1";
    }));
    first.release();
    // Its three subscriptions left with their connections: another uid gets all three places.
    EXPECT_TRUE(eventually([&] {
        Attacker again(sb, attackers[2], 3, "Subscribe");
        auto a = again.tally();
        return a && a->ok == 3;
    }));
    EXPECT_TRUE(daemon_alive(sb));
}

// The bound in all on remembered connections: past it every new caller is refused by name,
// whoever it is, while the connections already remembered (the bystander holder's) keep
// everything; once the attackers leave, new callers are served again.
TEST(Availability, PastTheBoundInAllNewCallersAreRefusedAndOthersKeepTheirs) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy, {"--rate-limit=1000000", "--max-connections=300"});
    Holder h(sb, {"knodsim0", "sim0", "4096", flow}, bystander); // remembered: 1 of 300
    ASSERT_TRUE(h.ok()) << h.line();
    auto attack = attack_from_every_uid(sb, 255);
    int ok = 0, limits = 0;
    for (std::size_t i = 0; i < attack.size(); ++i) {
        auto t = attack[i]->tally();
        ASSERT_TRUE(t) << "attacker " << attackers[i] << " reported nothing";
        EXPECT_EQ(t->other, 0) << t->first_other;
        ok += t->ok;
        limits += t->limits;
    }
    EXPECT_EQ(ok, 299) << "the holder's connection and 299 attackers' fill the 300";
    EXPECT_EQ(limits, 3 * 255 - 299);
    ASSERT_TRUE(daemon_alive(sb));
    // A new connection of the bystander is refused too; its holder keeps its binding.
    Output refused = sb.run_client({"list"}, bystander);
    EXPECT_NE(refused.out.find("LimitsExceeded"), std::string::npos) << refused.out;
    auto listed = sb.client().list(); // root is not counted
    ASSERT_TRUE(listed.ok()) << listed.error().message;
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].id, h.id());
    attack.clear();
    EXPECT_TRUE(
        eventually([&] { return sb.run_client({"list"}, bystander).out == "ok " + h.id(); }));
    EXPECT_EQ(sb.sql("select count(*) from sessions where end_reason is not null"), "0");
}

namespace {

// A stand-in for polkitd on the sandbox's bus that holds every CheckAuthorization until
// answer_all(), then answers no to those and to every later one at once: so a test can keep
// questions in flight as long as it needs (the real polkitd answers in milliseconds).
class SlowPolkit {
  public:
    explicit SlowPolkit(const Sandbox &s) {
        // The bus lets root own polkit's name and the daemon (root here) call it.
        std::string conf = slurp(s.dir() + "/bus.conf");
        auto end = conf.rfind("</busconfig>");
        if (end == std::string::npos) return;
        conf.insert(end, "<policy user=\"root\"><allow own=\"org.freedesktop.PolicyKit1\"/>"
                         "<allow send_destination=\"org.freedesktop.PolicyKit1\"/></policy>\n");
        {
            std::ofstream out(s.dir() + "/bus.conf");
            out << conf;
        }
        sd_bus *bus = nullptr;
        if (sd_bus_new(&bus) < 0) return;
        sd_bus_set_address(bus, s.address().c_str());
        sd_bus_set_bus_client(bus, 1);
        sd_bus_error err = SD_BUS_ERROR_NULL;
        bool reloaded =
            sd_bus_start(bus) >= 0 &&
            sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                               "org.freedesktop.DBus", "ReloadConfig", &err, nullptr, "") >= 0;
        sd_bus_error_free(&err);
        sd_bus_unref(bus);
        if (!reloaded) return;
        int ready[2], control[2];
        if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(control, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) serve(s.address(), ready[1], control[0]);
        close(ready[1]);
        close(control[0]);
        control_ = control[1];
        char c = 0;
        struct pollfd p {
            ready[0], POLLIN, 0
        };
        ready_ = poll(&p, 1, 60'000) == 1 && read(ready[0], &c, 1) == 1 && c == 'r';
        close(ready[0]);
    }
    ~SlowPolkit() {
        if (pid_ <= 0) return;
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        close(control_);
    }
    bool ready() const { return ready_; }
    void answer_all() { (void)!write(control_, "a", 1); }

  private:
    [[noreturn]] static void serve(const std::string &address, int ready, int control) {
        struct State {
            std::vector<sd_bus_message *> held;
            bool answering = false;
        } st;
        sd_bus *bus = nullptr;
        if (sd_bus_new(&bus) < 0) _exit(1);
        sd_bus_set_address(bus, address.c_str());
        sd_bus_set_bus_client(bus, 1);
        if (sd_bus_start(bus) < 0) _exit(1);
        auto no = [](sd_bus_message *m) { sd_bus_reply_method_return(m, "(bba{ss})", 0, 0, 0); };
        auto on_call = [](sd_bus_message *m, void *ud, sd_bus_error *) -> int {
            auto *s = static_cast<State *>(ud);
            if (!sd_bus_message_is_method_call(m, "org.freedesktop.PolicyKit1.Authority",
                                               "CheckAuthorization"))
                return 0;
            if (s->answering) {
                sd_bus_reply_method_return(m, "(bba{ss})", 0, 0, 0);
                return 1;
            }
            s->held.push_back(sd_bus_message_ref(m));
            return 1; // no reply yet: the question stays in flight
        };
        if (sd_bus_add_object(bus, nullptr, "/org/freedesktop/PolicyKit1/Authority", on_call, &st) <
                0 ||
            sd_bus_request_name(bus, "org.freedesktop.PolicyKit1", 0) < 0)
            _exit(1);
        (void)!write(ready, "r", 1);
        while (true) {
            while (sd_bus_process(bus, nullptr) > 0) {
            }
            struct pollfd p[2] = {{sd_bus_get_fd(bus), POLLIN, 0}, {control, POLLIN, 0}};
            if (poll(p, 2, -1) < 0) continue;
            if (p[1].revents) {
                char c;
                if (read(control, &c, 1) != 1) _exit(0);
                st.answering = true;
                for (sd_bus_message *m : st.held) {
                    no(m);
                    sd_bus_message_unref(m);
                }
                st.held.clear();
                sd_bus_flush(bus);
            }
        }
    }

    pid_t pid_ = -1;
    int control_ = -1;
    bool ready_ = false;
};

// A process as `uid` with one connection that sends `n` RevokeBinding calls at once (each one a
// polkit question for a non-admin) and reports each answer's error name, in the order they come.
class Asker {
  public:
    Asker(const Sandbox &s, uid_t uid, int n) {
        int report[2];
        if (pipe2(report, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            close(report[0]);
            if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
                setresuid(uid, uid, uid) != 0)
                _exit(3);
            ask(s.address(), n, report[1]);
        }
        close(report[1]);
        report_ = report[0];
    }
    ~Asker() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (report_ >= 0) close(report_);
    }
    // The next answer's error name ("ok" for none), or "" when none came within 60 s.
    std::string next() {
        std::string line;
        struct pollfd p {
            report_, POLLIN, 0
        };
        while (poll(&p, 1, 60'000) == 1) {
            char c;
            if (read(report_, &c, 1) != 1 || c == '\n') return line;
            line += c;
        }
        return line;
    }

  private:
    [[noreturn]] static void ask(const std::string &address, int n, int report) {
        sd_bus *bus = nullptr;
        if (sd_bus_new(&bus) < 0) _exit(1);
        sd_bus_set_address(bus, address.c_str());
        sd_bus_set_bus_client(bus, 1);
        if (sd_bus_start(bus) < 0) _exit(1);
        auto answered = [](sd_bus_message *m, void *ud, sd_bus_error *) -> int {
            const sd_bus_error *e = sd_bus_message_get_error(m);
            std::string line = (e && e->name ? e->name : "ok") + std::string("\n");
            (void)!write(*static_cast<int *>(ud), line.data(), line.size());
            return 0;
        };
        for (int i = 0; i < n; ++i)
            if (sd_bus_call_method_async(bus, nullptr, knod::bus::service_name,
                                         knod::bus::manager_path, knod::bus::manager_interface,
                                         "RevokeBinding", answered, &report, "ss", "nope",
                                         "test") < 0)
                _exit(1);
        while (true) {
            while (sd_bus_process(bus, nullptr) > 0) {
            }
            sd_bus_wait(bus, UINT64_MAX);
        }
    }

    pid_t pid_ = -1;
    int report_ = -1;
};

} // namespace

// Polkit questions are bounded per uid and in all (each is a pending reply on the daemon's own
// connection, of the 128 the bus allows it): while they wait, one more from that uid, or from
// anyone past the total, is refused by name at once and journaled; root (never asked) and the
// questions already in flight are untouched; once polkit answers, the same uid may ask again.
TEST(Availability, PolkitQuestionsInFlightAreBoundedPerUserAndInAll) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy, {"--rate-limit=1000000", "--max-polkit-questions-per-user=4",
                            "--max-polkit-questions=6"});
    SlowPolkit polkit(sb);
    ASSERT_TRUE(polkit.ready()) << slurp(sb.dir() + "/bus.log");
    const std::string limits = knod::bus::error::limits_exceeded;
    Asker five(sb, attackers[0], 5);
    EXPECT_EQ(five.next(), limits) << "the fifth of one uid, while four wait for polkit";
    Asker more(sb, attackers[1], 3);
    EXPECT_EQ(more.next(), limits) << "the seventh in all, while six wait";
    // Root is answered at once (no polkit question): no such binding.
    auto r = sb.client().revoke("nope", "test");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, knod::Errc::not_found) << r.error().message;
    polkit.answer_all();
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(five.next(), knod::bus::error::denied) << "question " << i;
    for (int i = 0; i < 2; ++i)
        EXPECT_EQ(more.next(), knod::bus::error::denied) << "question " << i;
    // Answered questions leave the count: the same uid asks four again, all answered.
    Asker again(sb, attackers[0], 4);
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(again.next(), knod::bus::error::denied) << "question " << i;
    EXPECT_TRUE(eventually([&] {
        return sb.sql("select count(*) > 0 from events where kind = 'rate-limited' and uid = " +
                      std::to_string(attackers[0]) + " and reason like '%polkit questions%'") ==
               "1";
    }));
    EXPECT_TRUE(daemon_alive(sb));
}

// The SDK names the refusal: past a daemon-wide bound (here one binding in all) a request is
// KNOD_ERR_LIMITS_EXCEEDED through the C API, with the bus's name, and knod.LimitsExceeded in
// Python (the same library under ctypes), never a policy quota; the holder keeps its binding.
TEST(Availability, TheSdkNamesTheRefusalLimitsExceeded) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they fork other uids)";
    Sandbox sb(sim_policy, {"--max-bindings=1"});
    Holder h(sb, {"knodsim0", "sim0", "4096", flow}, bystander);
    ASSERT_TRUE(h.ok()) << h.line();
    knod_client *c = nullptr;
    knod_error *e = nullptr;
    ASSERT_EQ(knod_client_connect(sb.address().c_str(), &c, &e), KNOD_OK)
        << (e ? knod_error_message(e) : "");
    int fd = make_region(4096);
    ASSERT_GE(fd, 0);
    const char *flows[] = {"udp 10.99.0.1:* -> 10.99.0.2:5001"};
    knod_binding *b = nullptr;
    EXPECT_EQ(knod_request_binding(c, "knodsim0", "sim0", nullptr, fd, 0, 4096, flows, 1, &b, &e),
              KNOD_ERR_LIMITS_EXCEEDED);
    ASSERT_NE(e, nullptr);
    EXPECT_STREQ(knod_error_dbus_name(e), knod::bus::error::limits_exceeded);
    EXPECT_STREQ(knod_errc_name(knod_error_code(e)), "limits-exceeded");
    EXPECT_NE(std::string(knod_error_message(e)).find("at most 1 bindings"), std::string::npos)
        << knod_error_message(e);
    knod_error_free(e);
    knod_client_unref(c);
    close(fd);
    auto py = sb.run_program({"env", "PYTHONPATH=" KNOD_SOURCE_DIR "/python",
                              "KNOD_CLIENT_LIBRARY=" KNOD_CLIENT_LIB, "/usr/bin/python3", "-c",
                              "import knod\n"
                              "try:\n"
                              "    knod.Client().register_buffer(knod.SimBuffer(4096),\n"
                              "        'udp 10.99.0.1:* -> 10.99.0.2:5002', netdev='knodsim0')\n"
                              "except knod.LimitsExceeded as e:\n"
                              "    print('limits', e.code, e.dbus_name)\n"});
    EXPECT_EQ(py.out, "limits 16 " + std::string(knod::bus::error::limits_exceeded))
        << slurp(sb.dir() + "/client.log");
    EXPECT_EQ(sb.run_client({"list"}, bystander).out, "ok " + h.id());
}
