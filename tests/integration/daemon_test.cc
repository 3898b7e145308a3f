// knod-policyd end to end: a real dbus-daemon, the real daemon, callers that are other
// processes and other uids.
#include "tests/integration/sandbox.h"

#include "daemon/sinks/sinks.h"
#include "journal/export.h"
#include "journal/verify.h"
#include "knod/client.h"
#include "knod/hex.h"
#include "policy/policy.h"
#include "protocol/names.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>

using namespace knod;
using namespace knod::test;
namespace fs = std::filesystem;

namespace {

const uid_t nobody = 65534;
const char *sim_flow = "udp 10.99.0.1:* -> 10.99.0.2:5000";

const std::string policy_text = R"(
[settings]
admin_group = "knod-test-admins"

[[rule]]
name = "no-nobody-on-9"
action = "deny"
users = [65534]
flows = ["udp * -> *:9000-9999"]

[[rule]]
name = "sim-everyone"
any_caller = true
netdevs = ["knodsim0"]
gpus = ["sim0"]
max_region = "1MiB"
max_bindings_per_uid = 8
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999", "udp 10.99.0.0/24:* -> 10.99.0.2:9000-9999"]
iommu = "any"
)";

class DaemonTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root (they use setpriv)";
        sandbox_ = std::make_unique<Sandbox>(policy_text);
    }
    Sandbox &sb() { return *sandbox_; }

    // Without a flow, each request gets one of its own (5100 and up): flows are exclusive.
    Result<client::GrantedBinding> request(client::Client &c, const std::string &flow = {},
                                           std::size_t bytes = 65536) {
        int fd = make_region(bytes);
        std::string f = flow.empty()
                            ? "udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(5100 + next_port_++)
                            : flow;
        auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, bytes, {f});
        close(fd);
        return g;
    }

    std::unique_ptr<Sandbox> sandbox_;
    int next_port_ = 0;
};

} // namespace

TEST_F(DaemonTest, GrantActivateAndRelease) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_EQ(g->key.size(), 32u);
    EXPECT_EQ(*c.state(g->id), "granted");
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    EXPECT_EQ(*c.state(g->id), "active");
    auto list = c.list();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].id, g->id);
    ASSERT_TRUE(c.release(g->id).ok());
    EXPECT_TRUE(c.list()->empty());
    EXPECT_EQ(sb().sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'"), "release");
    EXPECT_EQ(sb().sql("SELECT rule FROM sessions WHERE id='" + g->id + "'"), "sim-everyone");
    // The key itself is nowhere in the journal.
    std::ifstream db(sb().journal(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(db)), {});
    EXPECT_EQ(bytes.find(std::string(g->key.begin(), g->key.end())), std::string::npos);
}

TEST_F(DaemonTest, DenialNamesTheRule) {
    auto c = sb().client();
    auto outside = request(c, "udp 10.99.0.1:* -> 10.99.0.2:7000");
    ASSERT_FALSE(outside.ok());
    EXPECT_NE(outside.error().message.find("org.knod.Policy1.Error.Denied"), std::string::npos);
    EXPECT_NE(outside.error().message.find("no rule matched"), std::string::npos);
    Output o =
        sb().run_client({"hold", "knodsim0", "sim0", "4096", "udp * -> 10.99.0.2:9001"}, nobody);
    EXPECT_NE(o.out.find("denied by rule 'no-nobody-on-9'"), std::string::npos) << o.out;
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT count(*) FROM events WHERE kind='request-denied' AND "
                        "rule='no-nobody-on-9'") == "1";
    })); // denials are journaled without the caller waiting
    auto big = request(c, sim_flow, 2 << 20);
    ASSERT_FALSE(big.ok());
    EXPECT_NE(big.error().message.find("exceeds max_region"), std::string::npos)
        << big.error().message;
}

TEST_F(DaemonTest, UnprivilegedCallerCannotTouchRootsBinding) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok());
    Output list = sb().run_client({"list"}, nobody);
    EXPECT_EQ(list.out, "ok") << "nobody must not see root's binding";
    Output rel = sb().run_client({"release", g->id}, nobody);
    EXPECT_NE(rel.out.find("error"), std::string::npos) << rel.out;
    Output rev = sb().run_client({"revoke", g->id, "because"}, nobody);
    EXPECT_NE(rev.out.find("org.knod.Policy1.Error.Denied"), std::string::npos) << rev.out;
    Output rel2 = sb().run_client({"reload"}, nobody);
    EXPECT_NE(rel2.out.find("org.knod.Policy1.Error.Denied"), std::string::npos) << rel2.out;
    ASSERT_EQ(c.list()->size(), 1u) << "the binding survives all of that";
    // nobody may still bind for itself, and sees only its own.
    Holder h(sb(), {"knodsim0", "sim0", "4096", sim_flow}, nobody);
    ASSERT_TRUE(h.ok()) << h.line();
    EXPECT_EQ(sb().run_client({"list"}, nobody).out, "ok " + h.id());
    EXPECT_EQ(c.list()->size(), 2u) << "root sees all";
}

TEST_F(DaemonTest, AnotherUsersOverlappingFlowIsAFlowConflict) {
    // Root is active on a /24; the first claimant keeps its traffic.
    auto c = sb().client();
    auto root = request(c, "udp 10.99.0.0/24:* -> 10.99.0.2:5000");
    ASSERT_TRUE(root.ok()) << root.error().message;
    ASSERT_TRUE(c.activate(root->id, root->key).ok());
    // A host inside root's prefix, and the identical prefix, from uid 65534: refused, without
    // naming root's binding.
    for (auto *flow : {"udp 10.99.0.1:* -> 10.99.0.2:5000", "udp 10.99.0.0/24:* -> 10.99.0.2:5000",
                       "udp 10.99.0.0/24:* -> 10.99.0.2:5000-5010"}) {
        Output o = sb().run_client({"hold", "knodsim0", "sim0", "4096", flow}, nobody);
        EXPECT_NE(o.out.find("org.knod.Policy1.Error.FlowConflict"), std::string::npos)
            << flow << ": " << o.out;
        EXPECT_NE(o.out.find("another user's binding"), std::string::npos) << o.out;
        EXPECT_EQ(o.out.find(root->id), std::string::npos) << "root's binding is not named";
        EXPECT_EQ(o.out.find("' of "), std::string::npos) << "nor its flow: " << o.out;
    }
    // Other ports and other sources do not overlap.
    Holder apart(sb(), {"knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5001"}, nobody);
    ASSERT_TRUE(apart.ok()) << apart.line();
    // The same uid is refused too ("most specific wins" would split its own traffic), and is
    // told which of its bindings holds the flow.
    auto again = request(c, "udp 10.99.0.7:* -> 10.99.0.2:5000");
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.error().message.find("FlowConflict"), std::string::npos)
        << again.error().message;
    EXPECT_NE(again.error().message.find(root->id), std::string::npos) << again.error().message;
    // One binding may list a flow twice, or flows that overlap each other.
    int fd = make_region(4096);
    auto twice =
        c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                          {"udp 10.99.0.3:* -> 10.99.0.2:5100", "udp 10.99.0.3:* -> 10.99.0.2:5100",
                           "udp 10.99.0.0/24:* -> 10.99.0.2:5100-5101"});
    close(fd);
    EXPECT_TRUE(twice.ok()) << twice.error().message;
    // Refusals are journaled like other denials, naming the holder for the auditor.
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT count(*) FROM events WHERE decision = 'flow-conflict' AND "
                        "json_extract(detail, '$.conflicts_with') = '" +
                        root->id + "' AND uid = 0") == "1";
    }));
    EXPECT_GE(std::stol(sb().sql("SELECT count(*) FROM events WHERE decision = 'flow-conflict' "
                                 "AND uid = 65534 AND json_extract(detail, '$.conflicts_with') "
                                 "= '" +
                                 root->id + "'")),
              1)
        << "nobody's first refusal in full (the next ones may be counted in its window)";
    EXPECT_EQ(sb().sql("SELECT count(*) FROM sessions WHERE uid = 65534"), "1");
    // Once root releases, the flow is free for the other uid.
    ASSERT_TRUE(c.release(root->id).ok());
    Holder after(sb(), {"knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5000"}, nobody);
    EXPECT_TRUE(after.ok()) << after.line();
}

TEST_F(DaemonTest, ConcurrentRequestsForOneFlowGrantExactlyOne) {
    // Requests that arrive while the first grant waits for the journal see it in flight.
    std::vector<std::thread> threads;
    std::atomic<int> granted{0}, conflicts{0};
    // Each connection (and its binding) stays until all threads are done.
    std::vector<std::optional<client::Client>> clients(12);
    for (std::size_t i = 0; i < clients.size(); ++i)
        threads.emplace_back([&, i] {
            auto c = client::Client::connect(sb().address());
            if (!c) return;
            int fd = make_region(4096);
            auto g = c->request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096,
                                        {"udp 10.99.0.0/24:* -> 10.99.0.2:5500"});
            close(fd);
            if (g)
                ++granted;
            else if (g.error().message.find("FlowConflict") != std::string::npos)
                ++conflicts;
            clients[i] = std::move(*c);
        });
    for (auto &t : threads)
        t.join();
    EXPECT_EQ(granted.load(), 1);
    EXPECT_EQ(conflicts.load(), 11);
}

TEST_F(DaemonTest, KilledHolderIsReleasedAndJournaled) {
    Holder h(sb(), {"knodsim0", "sim0", "4096", sim_flow}, nobody);
    ASSERT_TRUE(h.ok()) << h.line();
    auto c = sb().client();
    ASSERT_EQ(c.list()->size(), 1u);
    h.kill_now(SIGKILL);
    EXPECT_TRUE(eventually([&] { return c.list()->empty(); }));
    // Ends the daemon notices by itself are journaled without anyone waiting on them.
    std::string why;
    EXPECT_TRUE(eventually([&] {
        why = sb().sql("SELECT end_reason FROM sessions WHERE id='" + h.id() + "'");
        return !why.empty();
    }));
    EXPECT_TRUE(why == "process-exit" || why == "disconnect") << why;
}

TEST_F(DaemonTest, KeyFromAnotherProcessCannotActivate) {
    Holder h(sb(), {"knodsim0", "sim0", "4096", sim_flow});
    ASSERT_TRUE(h.ok()) << h.line();
    Output o = sb().run_client({"activate", h.id(), h.key_hex()});
    EXPECT_NE(o.out.find("belongs to another process"), std::string::npos) << o.out;
    EXPECT_EQ(*sb().client().state(h.id()), "granted");
}

// Binding.DmabufId: the kernel's id of a devmem binding's dma-buf; the sim binds none, so it is
// 0 granted and active, on the bus itself (not the client's fallback for an older daemon that
// lacks the property), through the C++ client and through the C API.
TEST_F(DaemonTest, ASimBindingHasNoDmabufId) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto on_the_bus = [&] {
        sd_bus *bus = nullptr;
        if (sd_bus_new(&bus) < 0) return std::string("no bus");
        sd_bus_set_address(bus, sb().address().c_str());
        sd_bus_set_bus_client(bus, 1);
        std::string out = "cannot connect";
        if (sd_bus_start(bus) >= 0) {
            sd_bus_error e = SD_BUS_ERROR_NULL;
            std::uint32_t v = 99;
            std::string path = std::string(bus::bindings_prefix) + "/" + g->id;
            int r = sd_bus_get_property_trivial(bus, bus::service_name, path.c_str(),
                                                bus::binding_interface, "DmabufId", &e, 'u', &v);
            out = r < 0 ? std::string("error ") + (e.name ? e.name : std::strerror(-r))
                        : std::to_string(v);
            sd_bus_error_free(&e);
        }
        sd_bus_flush_close_unref(bus);
        return out;
    };
    EXPECT_EQ(on_the_bus(), "0") << "granted: nothing bound";
    ASSERT_TRUE(c.activate(g->id, g->key).ok());
    EXPECT_EQ(on_the_bus(), "0") << "active on the sim: no dma-buf of the kernel's";
    auto id = c.dmabuf_id(g->id);
    ASSERT_TRUE(id.ok()) << id.error().message;
    EXPECT_EQ(*id, 0u);
    auto d = c.details(g->id);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->dmabuf_id, 0u);
    EXPECT_FALSE(c.dmabuf_id("b-none").ok()) << "no such binding is an error, not 0";

    knod_client *kc = nullptr;
    knod_error *e = nullptr;
    ASSERT_EQ(knod_client_connect(sb().address().c_str(), &kc, &e), KNOD_OK)
        << (e ? knod_error_message(e) : "");
    int fd = make_region(4096);
    ASSERT_GE(fd, 0);
    const char *flows[] = {"udp 10.99.0.1:* -> 10.99.0.2:5099"};
    knod_binding *b = nullptr;
    ASSERT_EQ(knod_request_binding(kc, "knodsim0", "sim0", nullptr, fd, 0, 4096, flows, 1, &b, &e),
              KNOD_OK)
        << (e ? knod_error_message(e) : "");
    close(fd);
    std::uint32_t dmabuf = 99;
    EXPECT_EQ(knod_binding_dmabuf_id(b, &dmabuf, &e), KNOD_OK) << (e ? knod_error_message(e) : "");
    EXPECT_EQ(dmabuf, 0u) << "granted";
    ASSERT_EQ(knod_binding_activate(b, &e), KNOD_OK) << (e ? knod_error_message(e) : "");
    dmabuf = 99;
    EXPECT_EQ(knod_binding_dmabuf_id(b, &dmabuf, &e), KNOD_OK) << (e ? knod_error_message(e) : "");
    EXPECT_EQ(dmabuf, 0u) << "active on the sim";
    EXPECT_EQ(knod_binding_dmabuf_id(b, nullptr, &e), KNOD_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(knod_error_message(e), "out is NULL");
    knod_error_free(e);
    EXPECT_EQ(knod_binding_dmabuf_id(nullptr, &dmabuf, nullptr), KNOD_ERR_INVALID_ARGUMENT);
    knod_binding_free(b);
    knod_client_unref(kc);
}

// Issue #53: Binding.SetJob, over the bus. Only the holder tags its binding (another uid does
// not see it; another process of the same uid, with the key's bytes, is refused); bad strings
// and a second tag are InvalidArgument and change nothing; the tag is the binding's Job,
// JobGroup and JobRank, journaled as job-tagged, and `knod-policy bindings --job` lists it.
TEST_F(DaemonTest, OnlyTheHolderTagsItsBindingWithAJobOnce) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok()) << g.error().message;
    std::string key_hex = knod::to_hex(g->key);
    auto job_of = [&] {
        auto d = c.details(g->id);
        return d ? d->job + "|" + d->job_group + "|" + std::to_string(d->job_rank) : "error";
    };
    EXPECT_EQ(job_of(), "||0") << "untagged: \"\", \"\", 0";

    Output other = sb().run_client({"set-job", g->id, key_hex, "job-x", "0", "0"}, nobody);
    EXPECT_NE(other.status, 0) << other.out;
    EXPECT_TRUE(other.out.find("NoSuchBinding") != std::string::npos ||
                other.out.find("UnknownObject") != std::string::npos)
        << "another uid does not see the binding: " << other.out;
    Output same_uid = sb().run_client({"set-job", g->id, key_hex, "job-x", "0", "0"});
    EXPECT_NE(same_uid.out.find("org.knod.Policy1.Error.Denied"), std::string::npos)
        << same_uid.out;
    EXPECT_NE(same_uid.out.find("belongs to another process"), std::string::npos) << same_uid.out;
    for (auto [job, group, rank] : std::vector<std::tuple<std::string, std::string, std::uint32_t>>{
             {"", "", 0},
             {"job x", "", 0},
             {std::string(65, 'j'), "", 0},
             {"job", "g;rm", 0},
             {"job", "", 65536},
             {"j\xc3\xa9", "", 0}}) {
        auto r = c.set_job(g->id, g->key, job, group, rank);
        ASSERT_FALSE(r.ok()) << job;
        EXPECT_NE(r.error().message.find("org.knod.Policy1.Error.InvalidArgument"),
                  std::string::npos)
            << r.error().message;
    }
    EXPECT_EQ(job_of(), "||0") << "nothing changed";

    ASSERT_TRUE(c.set_job(g->id, g->key, "10.0.0.1:29500", "0", 1).ok());
    EXPECT_EQ(job_of(), "10.0.0.1:29500|0|1");
    auto again = c.set_job(g->id, g->key, "job-2", "", 0);
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.error().message.find("InvalidArgument"), std::string::npos)
        << again.error().message;
    EXPECT_NE(again.error().message.find("already tagged"), std::string::npos)
        << again.error().message;
    EXPECT_EQ(job_of(), "10.0.0.1:29500|0|1") << "the first tag stays";
    auto untagged = request(c);
    ASSERT_TRUE(untagged.ok()) << untagged.error().message;

    EXPECT_TRUE(eventually(
        [&] { return sb().sql("SELECT count(*) FROM events WHERE kind='job-tagged'") == "1"; }));
    EXPECT_EQ(sb().sql("SELECT json_extract(detail, '$.job') || '|' || "
                       "json_extract(detail, '$.group') || '|' || json_extract(detail, '$.rank') "
                       "FROM events WHERE kind='job-tagged' AND session_id='" +
                       g->id + "'"),
              "10.0.0.1:29500|0|1");

    auto listed = sb().run_program({KNOD_CLI_BIN, "bindings", "--json", "--job", "10.0.0.1:29500",
                                    "--bus-address", sb().address()});
    EXPECT_EQ(listed.status, 0) << listed.out;
    auto j = nlohmann::json::parse(listed.out, nullptr, false);
    ASSERT_TRUE(j.is_array()) << listed.out;
    ASSERT_EQ(j.size(), 1u) << "only the tagged binding: " << listed.out;
    EXPECT_EQ(j[0]["id"], g->id);
    EXPECT_EQ(j[0]["job"], "10.0.0.1:29500");
    EXPECT_EQ(j[0]["group"], "0");
    EXPECT_EQ(j[0]["rank"], 1);
    auto table = sb().run_program({KNOD_CLI_BIN, "bindings", "--bus-address", sb().address()});
    EXPECT_EQ(table.status, 0) << table.out;
    auto tagged_at = table.out.find(g->id + " "), untagged_at = table.out.find(untagged->id + " ");
    ASSERT_NE(tagged_at, std::string::npos) << table.out;
    ASSERT_NE(untagged_at, std::string::npos) << table.out;
    EXPECT_LT(tagged_at, untagged_at) << "tagged bindings first: " << table.out;
    EXPECT_NE(table.out.find(" 10.0.0.1:29500[0]#1 "), std::string::npos) << table.out;

    // An ordinary user's holder tags its own binding: the shipped bus policy lets every user
    // call SetJob, as it does Activate (root's calls above pass any bus policy).
    Output own = sb().run_program({"/usr/bin/env", "KNOD_TEST_JOB=job-nobody",
                                   "KNOD_TEST_JOB_RANK=2", KNOD_TEST_CLIENT_BIN, "hold", "knodsim0",
                                   "sim0", "4096", "udp 10.99.0.7:* -> 10.99.0.2:5007"},
                                  nobody);
    EXPECT_EQ(own.out.rfind("ok ", 0), 0u) << own.out;
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT count(*) FROM events WHERE kind='job-tagged' AND uid=65534 AND "
                        "json_extract(detail, '$.job')='job-nobody' AND "
                        "json_extract(detail, '$.rank')=2") == "1";
    })) << own.out;

    auto v = journal::verify_chain(sb().journal());
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->ok) << v->problem;
}

TEST_F(DaemonTest, BrokenPolicyOnReloadKeepsTheOldOne) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok());
    sb().write_policy("[[rule]]\nname = \"x\"\nflows = [\"udp 10.0.0.0/33:* -> *\"]\n");
    auto r = c.reload();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("InvalidPolicy"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("policy.toml:3:"), std::string::npos) << r.error().message;
    EXPECT_EQ(c.status()->rules, 2u);
    EXPECT_EQ(c.list()->size(), 1u);
    EXPECT_TRUE(request(c).ok()) << "the old policy still grants";
}

// #33 item 2: a config tool saves the policy in place (truncate, then write) and a reload
// (SIGHUP from the tool, or an admin's) lands before the rule's `users` line is written. That
// rule named no caller, so it matched everyone and stayed loaded once the file was whole again.
// Now the half-saved file is refused, the old rule stays, and the whole file loads.
TEST_F(DaemonTest, AHalfSavedPolicyNeverWidensARule) {
    auto c = sb().client();
    const std::string rule = "[[rule]]\nname = \"root-only\"\nnetdevs = [\"knodsim*\"]\n"
                             "gpus = [\"sim0\"]\nmax_region = \"1MiB\"\n"
                             "flows = [\"udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999\"]\n"
                             "iommu = \"any\"\n";
    auto count = [&](const std::string &where) {
        return sb().sql("SELECT count(*) FROM events WHERE " + where);
    };
    sb().write_policy(rule + "users = [0]\n");
    ASSERT_TRUE(c.reload().ok());
    sb().write_policy(rule); // the save has not reached its last line
    ASSERT_EQ(kill(sb().daemon_pid(), SIGHUP), 0);
    EXPECT_TRUE(eventually([&] {
        return count("kind = 'reload-refused' AND reason LIKE '%names no caller%'") == "1";
    })) << sb().sql("SELECT kind, reason FROM events WHERE kind LIKE 'reload%'");
    Output o = sb().run_client({"hold", "knodsim0", "sim0", "4096", sim_flow}, nobody);
    EXPECT_NE(o.out.find("Error.Denied"), std::string::npos)
        << "the old rule still names its users: " << o.out;
    sb().write_policy(rule + "users = [0]\n"); // the save is done
    ASSERT_EQ(kill(sb().daemon_pid(), SIGHUP), 0);
    EXPECT_TRUE(eventually([&] {
        return count("kind = 'policy-reload' AND reason = 'reloaded by SIGHUP'") == "1";
    })) << sb().sql("SELECT kind, reason FROM events WHERE kind LIKE '%reload%'");
    // The load names the file it read and that file's digest.
    EXPECT_EQ(sb().sql("SELECT json_extract(detail, '$.files[0].sha256') FROM events WHERE kind "
                       "= 'policy-reload' ORDER BY seq DESC LIMIT 1"),
              knod::policy::policy_digest(rule + "users = [0]\n"));
    o = sb().run_client({"hold", "knodsim0", "sim0", "4096", sim_flow}, nobody);
    EXPECT_NE(o.out.find("Error.Denied"), std::string::npos) << o.out;
}

// #16, 3: refusals of privileged actions are journaled with the actor's uid and pid, and a
// reload names its actor in fields, not only in text.
TEST_F(DaemonTest, RefusedPrivilegedActionsAreJournaledWithTheActor) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto events = [&](const std::string &kind, const std::string &cols) {
        return sb().sql("SELECT " + cols + " FROM events WHERE kind = '" + kind + "' ORDER BY seq");
    };
    // Users who may not: uid 65534 asks to reload and to revoke root's binding.
    Output o = sb().run_client({"reload"}, 65534);
    EXPECT_NE(o.out.find("Error.Denied"), std::string::npos) << o.out;
    o = sb().run_client({"revoke", g->id, "not yours"}, 65534);
    EXPECT_NE(o.out.find("Error.Denied"), std::string::npos) << o.out;
    EXPECT_TRUE(eventually([&] {
        return events("reload-refused", "uid, decision") == "65534|not-authorized" &&
               events("revoke-refused", "uid, decision, json_extract(detail, '$.binding')") ==
                   "65534|not-authorized|" + g->id;
    })) << events("reload-refused", "*")
        << "\n"
        << events("revoke-refused", "*");
    EXPECT_NE(events("reload-refused", "pid"), "") << "the actor's pid is a field";

    // A policy that does not load, over D-Bus and by SIGHUP (the signal's sender is the actor).
    sb().write_policy("[[rule]]\nname = \"x\"\nflows = [\"udp 10.0.0.0/33:* -> *\"]\n");
    ASSERT_FALSE(c.reload().ok());
    std::string me = std::to_string(getpid());
    ASSERT_EQ(kill(sb().daemon_pid(), SIGHUP), 0);
    EXPECT_TRUE(eventually([&] {
        return events("reload-refused", "uid, decision") ==
               "65534|not-authorized\n0|invalid-policy\n0|invalid-policy";
    })) << events("reload-refused", "*");
    EXPECT_EQ(sb().sql("SELECT group_concat(pid) FROM events WHERE kind = 'reload-refused' AND "
                       "uid = 0"),
              me + "," + me)
        << "the D-Bus caller's and the signal sender's pid";
    EXPECT_NE(events("reload-refused", "reason").find("SIGHUP: "), std::string::npos)
        << events("reload-refused", "reason");

    // A reload that succeeds carries its actor as fields too.
    sb().write_policy(R"([[rule]]
name = "any"
any_caller = true
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-9999"]
iommu = "any"
)");
    ASSERT_TRUE(c.reload().ok());
    EXPECT_TRUE(eventually([&] { return events("policy-reload", "uid, pid") == "0|" + me; }))
        << events("policy-reload", "*");
    EXPECT_TRUE(c.list()->size() == 1u) << "nothing was revoked by the refused attempts";
}

TEST_F(DaemonTest, ReloadRevokesWhatTheNewPolicyForbids) {
    auto c = sb().client();
    auto keep = request(c, "udp 10.99.0.1:* -> 10.99.0.2:5000");
    auto lose = request(c, "udp 10.99.0.1:* -> 10.99.0.2:9000");
    ASSERT_TRUE(keep.ok() && lose.ok());
    sb().write_policy(R"([[rule]]
name = "five-only"
any_caller = true
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
)");
    auto r = c.reload();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->first, 1u);
    EXPECT_EQ(r->second, 1u);
    auto list = c.list();
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].id, keep->id);
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT end_reason FROM sessions WHERE id='" + lose->id + "'") ==
               "policy-reload";
    }));
}

TEST_F(DaemonTest, HostileArgumentsGetNamedErrorsAndChangeNothing) {
    auto c = sb().client();
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    std::string file = sb().dir() + "/plain";
    std::ofstream(file) << std::string(8192, 'x');
    int regular = open(file.c_str(), O_RDWR);
    int opath = open(file.c_str(), O_PATH);
    int unsealed = memfd_create("x", MFD_ALLOW_SEALING);
    ASSERT_EQ(ftruncate(unsealed, 8192), 0);
    int sealed = make_region(8192);
    struct Case {
        int fd;
        std::uint64_t offset, length;
        std::vector<std::string> flows;
        std::string netdev, mode, want;
    } cases[] = {
        {p[0], 0, 4096, {sim_flow}, "knodsim0", "rx-only", "got a pipe"},
        {regular, 0, 4096, {sim_flow}, "knodsim0", "rx-only", "regular file"},
        {opath, 0, 4096, {sim_flow}, "knodsim0", "rx-only", "O_PATH"},
        {unsealed, 0, 4096, {sim_flow}, "knodsim0", "rx-only", "F_SEAL_SHRINK"},
        {sealed, UINT64_MAX - 10, 4096, {sim_flow}, "knodsim0", "rx-only", "overflows"},
        {sealed, 4096, 8192, {sim_flow}, "knodsim0", "rx-only", "past the end"},
        {sealed, 0, 0, {sim_flow}, "knodsim0", "rx-only", "length"},
        {sealed, 0, 4096, {}, "knodsim0", "rx-only", "flows"},
        {sealed, 0, 4096, {"garbage"}, "knodsim0", "rx-only", "flows[0]"},
        {sealed, 0, 4096, std::vector<std::string>(100, sim_flow), "knodsim0", "rx-only",
         "at most"},
        {sealed, 0, 4096, {sim_flow}, "eth99", "rx-only", "netdev"},
        {sealed, 0, 4096, {sim_flow}, "knodsim0", "sideways", "mode"},
    };
    for (auto &k : cases) {
        auto r = c.request_binding(k.netdev, "sim0", k.mode, k.fd, k.offset, k.length, k.flows);
        ASSERT_FALSE(r.ok()) << k.want;
        EXPECT_NE(r.error().message.find("org.knod.Policy1.Error.InvalidArgument"),
                  std::string::npos)
            << r.error().message;
        EXPECT_NE(r.error().message.find(k.want), std::string::npos) << r.error().message;
    }
    EXPECT_TRUE(c.list()->empty());
    EXPECT_EQ(sb().sql("SELECT count(*) FROM sessions"), "0");
    EXPECT_FALSE(c.release("bnope").ok());
    EXPECT_TRUE(c.status().ok()) << "the daemon keeps answering";
    for (int fd : {p[0], p[1], regular, opath, unsealed, sealed})
        close(fd);
}

TEST_F(DaemonTest, QuotaAndRateLimitAreQuotaExceeded) {
    auto c = sb().client();
    std::vector<client::GrantedBinding> held;
    for (int i = 0; i < 8; ++i) {
        // Flows are exclusive: each binding its own port.
        auto g = request(c, "udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(5000 + i), 4096);
        ASSERT_TRUE(g.ok()) << g.error().message;
        held.push_back(*g);
    }
    auto ninth = request(c, "udp 10.99.0.1:* -> 10.99.0.2:5008", 4096);
    ASSERT_FALSE(ninth.ok());
    EXPECT_NE(ninth.error().message.find("QuotaExceeded"), std::string::npos)
        << ninth.error().message;
}

TEST_F(DaemonTest, FullJournalRefusesRequestsAndRecovers) {
    // The state dir on a tiny tmpfs, filled up after the daemon started.
    sb().stop_daemon(SIGTERM);
    fs::remove_all(sb().state_dir());
    fs::create_directories(sb().state_dir());
    ASSERT_EQ(mount("knod-test", sb().state_dir().c_str(), "tmpfs", 0, "size=2m,mode=0700"), 0);
    struct Unmount {
        std::string path;
        ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
    } unmount{sb().state_dir()};
    sb().start_daemon();
    auto c = sb().client();
    ASSERT_TRUE(request(c).ok());
    std::string filler = sb().state_dir() + "/filler";
    {
        std::ofstream f(filler, std::ios::binary);
        std::string block(65536, 'f');
        while (f.write(block.data(), static_cast<std::streamsize>(block.size()))) {
        }
    }
    int refused = 0;
    for (int i = 0; i < 20; ++i) {
        auto r = request(c);
        if (!r.ok()) {
            EXPECT_NE(r.error().message.find("JournalUnavailable"), std::string::npos)
                << r.error().message;
            ++refused;
        }
    }
    EXPECT_GT(refused, 0);
    auto st = c.status();
    ASSERT_TRUE(st.ok()) << "the daemon answers the next call";
    fs::remove(filler);
    // It recovers by itself: the records kept meanwhile are written in the background (requests
    // are refused at once until they are), then grants resume.
    std::string last;
    EXPECT_TRUE(eventually(
        [&] {
            auto after = request(c);
            if (!after) last = after.error().message;
            return after.ok();
        },
        10000))
        << last;
    EXPECT_EQ(sb().stop_daemon(SIGTERM), 0);
    EXPECT_EQ(sb().sql("PRAGMA integrity_check"), "ok");
    auto v = journal::verify_chain(sb().journal());
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->problem;
}

TEST_F(DaemonTest, RestartAfterSigkillClosesOrphanedSessions) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok());
    sb().stop_daemon(SIGKILL);
    EXPECT_EQ(sb().sql("SELECT count(*) FROM sessions WHERE ended_us IS NULL"), "1");
    sb().start_daemon();
    // The orphan's end is committed by the journal's writer thread, not before the daemon
    // answers its first call.
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'") ==
               "daemon-restart";
    })) << sb().sql("SELECT end_reason FROM sessions WHERE id='" + g->id + "'");
    EXPECT_TRUE(sb().client().list()->empty());
    auto v = journal::verify_chain(sb().journal());
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->problem;
}

TEST_F(DaemonTest, SigtermReleasesEverythingCleanly) {
    auto c = sb().client();
    ASSERT_TRUE(request(c).ok());
    ASSERT_TRUE(request(c).ok());
    int status = sb().stop_daemon(SIGTERM);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(sb().sql("SELECT count(*) FROM sessions WHERE end_reason='daemon-stop'"), "2");
    EXPECT_EQ(sb().sql("SELECT kind FROM events ORDER BY seq DESC LIMIT 1"), "daemon-stop");
    sb().start_daemon();
}

TEST_F(DaemonTest, IntrospectionMatchesTheSchema) {
    auto c = sb().client();
    auto g = request(c);
    ASSERT_TRUE(g.ok());
    auto introspect = [&](const std::string &path) {
        int out[2];
        EXPECT_EQ(pipe(out), 0);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(out[1], 1);
            execlp("busctl", "busctl", ("--address=" + sb().address()).c_str(), "introspect",
                   "--xml-interface", "org.knod.Policy1", path.c_str(), nullptr);
            _exit(127);
        }
        close(out[1]);
        std::string s = read_all(out[0]);
        close(out[0]);
        waitpid(pid, nullptr, 0);
        return s;
    };
    std::ifstream in(KNOD_SOURCE_DIR "/schema/org.knod.Policy1.xml");
    std::string schema((std::istreambuf_iterator<char>(in)), {});
    // Compare each of our interfaces, whitespace-insensitively, as sd-bus prints it.
    auto block = [](const std::string &xml, const std::string &iface) {
        std::string flat = std::regex_replace(xml, std::regex(R"(\s+)"), " ");
        auto start = flat.find("<interface name=\"" + iface + "\">");
        auto end = flat.find("</interface>", start);
        return start == std::string::npos ? std::string() : flat.substr(start, end - start);
    };
    std::string manager = block(introspect("/org/knod/Policy1"), "org.knod.Policy1.Manager");
    std::string binding =
        block(introspect("/org/knod/Policy1/bindings/" + g->id), "org.knod.Policy1.Binding");
    ASSERT_FALSE(manager.empty());
    ASSERT_FALSE(binding.empty());
    EXPECT_EQ(manager, block(schema, "org.knod.Policy1.Manager"));
    EXPECT_EQ(binding, block(schema, "org.knod.Policy1.Binding"));
}

namespace {

// "CALL ERRORNAME COUNT" lines of the test client's flood command.
std::map<std::string, long> flood_tally(const std::string &out) {
    std::map<std::string, long> t;
    std::istringstream lines(out);
    std::string call, name;
    long n = 0;
    while (lines >> call >> name >> n)
        t[call + " " + name] += n;
    return t;
}

} // namespace

TEST(DaemonRateLimit, AFloodFromOneUidIsThrottledAndJournaledWithinTheBound) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    const int window_s = 1;
    Sandbox sb(policy_text, {"--refusal-window", std::to_string(window_s)}); // 50/s, bursts of 100
    auto c = sb.client();
    ASSERT_TRUE(c.status().ok());
    auto start = std::chrono::steady_clock::now();
    auto since = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    // 50 connections of uid 65534: 3,000 requests the policy denies, 6,000 wrong-key Activates
    // of its own binding.
    Output flood = sb.run_client({"flood", "50", "3000", "6000", "knodsim0", "sim0", sim_flow,
                                  "udp 10.99.0.1:* -> 10.99.0.2:9001"},
                                 nobody);
    double flood_s = since();
    ASSERT_EQ(flood.status, 0) << flood.out;
    auto t = flood_tally(flood.out);
    const std::string denied = "org.knod.Policy1.Error.Denied",
                      limited = "org.knod.Policy1.Error.QuotaExceeded";
    long req_denied = t["RequestBinding " + denied], req_limited = t["RequestBinding " + limited];
    long act_denied = t["Activate " + denied], act_limited = t["Activate " + limited];
    EXPECT_EQ(req_denied + req_limited, 3000) << flood.out;
    EXPECT_EQ(act_denied + act_limited, 6000) << flood.out;
    // One bucket for the uid, however many connections: the burst, then 50 a second.
    EXPECT_LE(req_denied + act_denied + 1, 100 + 50 * flood_s + 1) << flood.out;
    EXPECT_GT(req_limited + act_limited, 0) << flood.out;

    // Another uid is not throttled by the first, and the daemon answers everyone.
    Holder other(sb, {"knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:5001"}, 1000);
    EXPECT_TRUE(other.ok()) << other.line();
    EXPECT_TRUE(c.status().ok());
    Output limited_reply = sb.run_client({"list"}, nobody);
    if (limited_reply.out != "ok") { // only if its bucket has not refilled yet
        ++req_limited;
        EXPECT_NE(limited_reply.out.find("too many requests from uid 65534"), std::string::npos)
            << limited_reply.out;
    }

    // Every refusal is in the journal, either as its own record or in a window's count.
    auto journaled = [&](const std::string &kind) {
        std::string full =
            sb.sql("SELECT count(*) FROM events WHERE uid = 65534 AND kind = '" + kind + "'");
        std::string counted = sb.sql(
            "SELECT coalesce(sum(json_extract(detail, '$.count')), 0) FROM events WHERE uid = "
            "65534 AND kind = 'refusals-coalesced' AND decision = '" +
            kind + "'");
        return std::stol(full) + std::stol(counted);
    };
    EXPECT_TRUE(eventually(
        [&] {
            return journaled("request-denied") == req_denied &&
                   journaled("activate-refused") == act_denied &&
                   journaled("rate-limited") == req_limited + act_limited;
        },
        10000))
        << journaled("request-denied") << "/" << req_denied << " " << journaled("activate-refused")
        << "/" << act_denied << " " << journaled("rate-limited") << "/"
        << req_limited + act_limited;
    // The bound (README): per uid and kind of refusal, one record per window, so at most
    // 3 * (1 + elapsed / window) refusal records; plus the held binding's grant and end.
    double elapsed = since();
    long rows = std::stol(sb.sql("SELECT count(*) FROM events WHERE uid = 65534"));
    EXPECT_LE(rows, 3 * (2 + static_cast<long>(elapsed / window_s)) + 2)
        << sb.sql("SELECT kind, decision, count(*) FROM events WHERE uid = 65534 GROUP BY 1, 2");
    EXPECT_GT(rows, 3) << "each kind of refusal left a record";
    auto v = journal::verify_chain(sb.journal());
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->problem;
}

TEST(DaemonRateLimit, EveryMethodCountsAgainstTheUidAndRootIsNotLimited) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    // One call, then one per 100 s; one refusal window for the whole test.
    Sandbox sb(policy_text, {"--rate-limit", "0.01", "--refusal-window", "3600"});
    // Separate processes (connections) of one uid share the bucket.
    // The one token goes to a request; then every method is refused.
    Holder h(sb, {"knodsim0", "sim0", "4096", sim_flow}, nobody);
    ASSERT_TRUE(h.ok()) << h.line();
    int limited = 0;
    const std::vector<std::vector<std::string>> calls = {
        {"list"}, {"reload"}, {"release", h.id()}, {"revoke", h.id(), "why"}, {"list"}};
    for (auto &call : calls) {
        Output o = sb.run_client(call, nobody);
        if (o.out.find("QuotaExceeded") != std::string::npos &&
            o.out.find("too many requests from uid 65534") != std::string::npos)
            ++limited;
    }
    EXPECT_EQ(limited, 5) << "each from a process of its own";
    EXPECT_EQ(sb.run_client({"list"}, 1000).out, "ok") << "another uid has its own bucket";
    auto c = sb.client();
    for (int i = 0; i < 20; ++i)
        ASSERT_TRUE(c.list().ok()) << "root is not limited";
    EXPECT_TRUE(eventually([&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind = 'rate-limited' AND uid = 65534") ==
               "1";
    })) << "the first refusal is journaled in full, the rest counted";
}

TEST(DaemonIsolation, ARuleRequiringTranslationRefusesTheSimulatedDevices) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    Sandbox sb(R"([[rule]]
name = "strict"
any_caller = true
netdevs = ["knodsim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000"]
)"); // iommu defaults to "translated"
    auto c = sb.client();
    int fd = make_region(4096);
    auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {sim_flow});
    close(fd);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("org.knod.Policy1.Error.IsolationViolation"),
              std::string::npos)
        << g.error().message;
    EXPECT_NE(g.error().message.find("rule 'strict'"), std::string::npos) << g.error().message;
    EXPECT_NE(g.error().message.find("iommu = \"any\""), std::string::npos) << g.error().message;
    EXPECT_TRUE(eventually([&] {
        return sb.sql("SELECT count(*) FROM events WHERE decision = 'isolation-violation'") == "1";
    }));
    EXPECT_EQ(sb.sql("SELECT count(*) FROM sessions"), "0");
}

// #16, 6: what the daemon writes exports as a SIEM wants it (flows an array, not a JSON string
// inside JSON) and re-verifies from the export alone, every detail rebuilt from the record.
TEST_F(DaemonTest, ItsEventsExportWithFlowsAsAnArrayAndVerify) {
    auto c = sb().client();
    auto g = request(c, sim_flow);
    ASSERT_TRUE(g.ok()) << g.error().message;
    ASSERT_TRUE(c.release(g->id).ok());
    Output denied = sb().run_client(
        {"hold", "knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:9000"}, nobody);
    ASSERT_TRUE(eventually([&] {
        return sb().sql("SELECT count(*) FROM events WHERE kind = 'session-ended'") == "1" &&
               sb().sql("SELECT count(*) FROM events WHERE kind = 'request-denied'") == "1";
    })) << denied.out;
    EXPECT_EQ(sb().sql("SELECT group_concat(DISTINCT json_type(detail, '$.flows')) FROM events "
                       "WHERE kind IN ('request-granted', 'request-denied')"),
              "array");

    auto reader = journal::JournalReader::open(sb().journal());
    ASSERT_TRUE(reader) << reader.error().message;
    auto id = reader->identity();
    ASSERT_TRUE(id);
    EXPECT_EQ(id->journal_id.size(), 32u);
    std::stringstream out;
    auto n = journal::export_jsonl(*reader, {}, *id, out);
    ASSERT_TRUE(n) << n.error().message;
    std::string text = out.str();
    EXPECT_NE(text.find(std::string("\"flows\":[\"") + sim_flow + "\"]"), std::string::npos)
        << text;
    EXPECT_EQ(text.find("\"detail_text\""), std::string::npos)
        << "a detail the daemon wrote does not rebuild from its record: " << text;
    EXPECT_NE(text.find("\"host\":\""), std::string::npos) << text;
    auto check = journal::verify_export(out, false);
    ASSERT_TRUE(check) << check.error().message;
    EXPECT_TRUE(check->ok) << check->problem << " at line " << check->bad_line;
    EXPECT_EQ(check->events, *n);
    EXPECT_EQ(check->first_seq, 1);
}

// #16, 1 and 3, through the real daemon: grants, a denial, a revoke, a holder killed, reloads by
// D-Bus and by SIGHUP, a daemon killed and restarted (its open sessions closed at the start).
// Then `audit verify` checks every session row against the chain, every decision names the
// policy in force by digest, every policy load carries its actor, and each text is stored.
TEST_F(DaemonTest, TheChainCoversSessionsAndNamesThePolicyOfEveryDecision) {
    auto verify = [&] {
        std::string cmd = std::string(KNOD_CLI_BIN) + " audit verify --db " + sb().journal() +
                          " >" + sb().dir() + "/verify.out 2>&1";
        return std::system(cmd.c_str()) == 0;
    };
    auto c = sb().client();
    auto kept = request(c);
    auto revoked = request(c);
    ASSERT_TRUE(kept.ok() && revoked.ok());
    Holder killed(sb(), {"knodsim0", "sim0", "4096", sim_flow}, nobody);
    ASSERT_TRUE(killed.ok()) << killed.line();
    Holder denied(sb(), {"knodsim0", "sim0", "4096", "udp 10.99.0.1:* -> 10.99.0.2:9000"}, nobody);
    EXPECT_FALSE(denied.ok()) << denied.line();
    ASSERT_TRUE(c.revoke(revoked->id, "audit test").ok());
    killed.kill_now(SIGKILL);
    std::string me = std::to_string(getpid());
    std::string reloaded = policy_text + "\n# reloaded\n";
    sb().write_policy(reloaded);
    ASSERT_TRUE(c.reload().ok());
    ASSERT_EQ(kill(sb().daemon_pid(), SIGHUP), 0);
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT count(*) FROM events WHERE kind = 'policy-reload'") == "2" &&
               sb().sql("SELECT count(*) FROM sessions WHERE ended_us IS NOT NULL") == "2";
    })) << sb().sql("SELECT kind, uid, pid FROM events");
    EXPECT_TRUE(verify()) << slurp(sb().dir() + "/verify.out");

    // Killed with a binding open; the next start closes its session (daemon-restart).
    pid_t first = sb().daemon_pid();
    sb().stop_daemon(SIGKILL);
    sb().start_daemon();
    EXPECT_TRUE(eventually([&] {
        return sb().sql("SELECT end_reason FROM sessions WHERE id = '" + kept->id + "'") ==
               "daemon-restart";
    }));
    EXPECT_TRUE(verify()) << slurp(sb().dir() + "/verify.out");
    EXPECT_NE(slurp(sb().dir() + "/verify.out").find("sessions: 3 row(s) match"), std::string::npos)
        << slurp(sb().dir() + "/verify.out");

    // Policy loads: the daemon's own start (its uid and pid), then the actors of the reloads.
    EXPECT_EQ(sb().sql("SELECT group_concat(actor, ' ') FROM (SELECT uid || '/' || pid AS actor "
                       "FROM events WHERE kind IN ('daemon-start', 'policy-reload') ORDER BY "
                       "seq)"),
              "0/" + std::to_string(first) + " 0/" + me + " 0/" + me + " 0/" +
                  std::to_string(sb().daemon_pid()));
    EXPECT_EQ(sb().sql("SELECT count(*) FROM events WHERE kind IN ('daemon-start', "
                       "'policy-reload') AND json_extract(detail, '$.policy') NOT IN (SELECT "
                       "digest FROM policies)"),
              "0");
    EXPECT_EQ(sb().sql("SELECT count(*) FROM policies"), "2") << "two texts, each stored once";
    // Every decision names a stored policy: the grants and the denial.
    EXPECT_EQ(sb().sql("SELECT count(*) FROM events WHERE kind IN ('request-granted', "
                       "'request-denied') AND json_extract(detail, '$.policy') IN (SELECT digest "
                       "FROM policies)"),
              "4")
        << sb().sql("SELECT kind, detail FROM events WHERE kind LIKE 'request-%'");
    // The digest in force names the reloaded text, as `audit policy` prints it.
    std::string digest = sb().sql("SELECT json_extract(detail, '$.policy') FROM events WHERE kind "
                                  "= 'daemon-start' ORDER BY seq DESC LIMIT 1");
    Output text =
        sb().run_program({KNOD_CLI_BIN, "audit", "policy", "--db", sb().journal(), digest});
    reloaded.pop_back(); // run_program drops the output's last newline
    EXPECT_EQ(text.out, "# file: " + sb().policy_file() + "\n" + reloaded) << text.out;
}

// #16 item 8: a host without journald. The journald sink's copies fail; status counts them
// (per sink: written, failed, dropped, failing with the reason) and the journal says once that
// the sink started failing, however many records it refused.
TEST(DaemonSinks, AMissingJournaldIsCountedAndJournaledOnce) {
    if (geteuid() != 0) GTEST_SKIP() << "integration tests run as root";
    if (access(sinks::JournaldSink::socket_path, F_OK) == 0)
        GTEST_SKIP() << "journald runs here; this test needs a host without it";
    Sandbox sb(policy_text, {"--journald=true", "--linux-audit=false"});
    auto c = sb.client();
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) {
        int fd = make_region(65536);
        auto g = c.request_binding("knodsim0", "sim0", "rx-only", fd, 0, 65536,
                                   {"udp 10.99.0.1:* -> 10.99.0.2:" + std::to_string(5300 + i)});
        close(fd);
        ASSERT_TRUE(g.ok()) << g.error().message;
        ids.push_back(g->id);
    }
    nlohmann::json journald;
    ASSERT_TRUE(eventually(
        [&] {
            auto report = c.host_report();
            if (!report) return false;
            auto j = nlohmann::json::parse(*report, nullptr, false);
            if (!j.is_object() || !j["sinks"]["each"].is_array()) return false;
            for (auto &k : j["sinks"]["each"])
                if (k["name"] == "journald") journald = k;
            return journald.is_object() && journald["failed"].get<std::uint64_t>() >= 4;
        },
        5000))
        << journald.dump();
    EXPECT_TRUE(journald["failing"].get<bool>());
    EXPECT_EQ(journald["written"].get<std::uint64_t>(), 0u);
    EXPECT_NE(journald["last_error"].get<std::string>().find("no journald"), std::string::npos);
    auto prop = sb.run_program({"/usr/bin/busctl", "--address=" + sb.address(), "get-property",
                                "org.knod.Policy1", "/org/knod/Policy1", "org.knod.Policy1.Manager",
                                "SinkFailedRecords"});
    EXPECT_EQ(prop.status, 0) << "[" << prop.out << "]";
    EXPECT_EQ(prop.out.rfind("t ", 0), 0u) << prop.out;
    EXPECT_GE(std::atoll(prop.out.c_str() + std::min<std::size_t>(2, prop.out.size())), 4)
        << prop.out;

    // The CLI shows it, in text and JSON.
    auto text = sb.run_program({KNOD_CLI_BIN, "status", "--bus-address", sb.address()});
    EXPECT_EQ(text.status, 0) << text.out;
    EXPECT_NE(text.out.find("journald: 0 written"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("FAILING: no journald"), std::string::npos) << text.out;
    auto json = sb.run_program({KNOD_CLI_BIN, "status", "--json", "--bus-address", sb.address()});
    auto j = nlohmann::json::parse(json.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << json.out;
    EXPECT_GE(j["sinks"]["failed"].get<std::uint64_t>(), 4u) << json.out;

    // One sink-failing event for all those records, naming the sink and the error.
    ASSERT_TRUE(eventually([&] {
        return sb.sql("SELECT count(*) FROM events WHERE kind = "
                      "'sink-failing'") == "1";
    })) << sb.sql("SELECT kind FROM events");
    auto detail = nlohmann::json::parse(
        sb.sql("SELECT detail FROM events WHERE kind = 'sink-failing'"), nullptr, false);
    ASSERT_TRUE(detail.is_object());
    EXPECT_EQ(detail["sink"], "journald");
    EXPECT_NE(detail["error"].get<std::string>().find("no journald"), std::string::npos);
    EXPECT_EQ(sb.sql("SELECT count(*) FROM events WHERE kind = 'sink-recovered'"), "0");
    for (auto &id : ids)
        EXPECT_TRUE(c.release(id).ok());
    EXPECT_EQ(sb.stop_daemon(SIGTERM), 0);
    EXPECT_EQ(sb.sql("SELECT count(*) FROM events WHERE kind = 'sink-failing'"), "1");
}
