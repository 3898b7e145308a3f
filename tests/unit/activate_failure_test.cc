// #16, 3: an activation the driver fails is journaled as a refusal, with the presenter as the
// actor and the policy in force, like every other refused step. The manager runs with the sim's
// control half whose activation is made to fail (a queue that cannot be opened on hardware).
// #17, 3: a request for a netdev without a DMA device (the devmem rule) is refused at attach,
// before any key is handed out, and journaled as a refusal.
#include "daemon/binding_manager.h"
#include "daemon/driver/sim_driver.h"
#include "host/dma_device.h"
#include "journal/verify.h"
#include "policy/parser.h"
#include "tests/unit/manager_rig.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>

using namespace knod;
namespace fs = std::filesystem;

namespace {

class FailingActivation : public driver::SimDriver {
  public:
    FailingActivation() : SimDriver(config(), nullptr) {}
    Result<void> activate(const std::string &) override {
        return make_error(Errc::driver_failure, "queue 0 of knodsim0: Device or resource busy");
    }

  private:
    static driver::SimConfig config() {
        driver::SimConfig c;
        c.datapath = false;
        return c;
    }
};

// A netdev without a DMA device, refused at request time by the devmem backend's own rule
// (require_dma_device on lo, the real check): the request is denied before any key is handed out.
class NoDmaDevice : public FailingActivation {
  public:
    Result<std::vector<std::uint32_t>> attach(const driver::BindingPlan &) override {
        if (auto dma = driver::require_dma_device(static_cast<int>(if_nametoindex("lo"))); !dma)
            return std::move(dma).error();
        return make_error(Errc::driver_failure, "lo passed the DMA-device rule");
    }
};

using knod::testing::Loop;
using knod::testing::Rig;

// One RequestBinding for a sealed 4 KiB memfd on knodsim0, run to its answer.
void request_one_region(daemon::BindingManager &m, Loop &loop, const daemon::Peer &me,
                        std::optional<Result<daemon::Granted>> &granted,
                        const std::string &flow = "udp 10.0.0.1:* -> 10.0.0.2:5000") {
    int fd = knod::testing::sealed_region();
    ASSERT_GE(fd, 0);
    daemon::RequestArgs args{"knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow}};
    m.request(me, args, [&](Result<daemon::Granted> g) { granted = std::move(g); });
    EXPECT_TRUE(loop.run_until([&] { return granted.has_value(); }));
    close(fd);
    ASSERT_TRUE(granted.has_value());
}

} // namespace

TEST(ActivateFailure, IsJournaledAsARefusalWithTheActorAndThePolicy) {
    Rig rig("activate");
    auto &loop = rig.loop;
    auto load = policy::parse_policy_text(R"([[rule]]
name = "sim"
any_caller = true
netdevs = ["knodsim0"]
max_region = "1MiB"
flows = ["udp * -> *:5000"]
iommu = "any"
)",
                                          "/etc/knod/policy.toml");
    ASSERT_TRUE(load.ok()) << load.errors_text();
    std::string digest = load.policy.digest;
    FailingActivation driver;
    ASSERT_TRUE(driver.start().ok());
    {
        auto manager = rig.manager(driver, std::move(load.policy));
        auto &m = *manager;
        m.start();
        daemon::Peer me;
        me.uid = 4321;
        me.pid = getpid();
        std::optional<Result<daemon::Granted>> granted;
        ASSERT_NO_FATAL_FAILURE(request_one_region(m, loop, me, granted));
        ASSERT_TRUE(granted->ok()) << granted->error().message;
        auto r = m.activate((*granted)->id, me, (*granted)->key);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code, Errc::driver_failure);
        m.shutdown();
    }
    auto db =
        std::move(journal::Database::open(rig.config.journal_path, SQLITE_OPEN_READONLY)).value();
    auto st = db.prepare("SELECT uid, pid, decision, reason, json_extract(detail, '$.policy') "
                         "FROM events WHERE kind = 'activate-refused'");
    ASSERT_TRUE(st.ok());
    auto row = st->step();
    ASSERT_TRUE(row.ok() && *row) << "the failed activation is an event";
    EXPECT_EQ(st->int64(0), 4321);
    EXPECT_EQ(st->int64(1), getpid());
    EXPECT_EQ(st->text(2), "driver-failure");
    EXPECT_NE(st->text(3).find("Device or resource busy"), std::string::npos) << st->text(3);
    EXPECT_EQ(st->text(4), digest);
    // The daemon's start loaded that policy: its text is stored, the chain verifies.
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM policies WHERE digest = '" + digest + "'"), 1);
    auto v = journal::verify_chain(rig.config.journal_path);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_TRUE(v->ok) << v->problem;
    EXPECT_EQ(v->sessions_checked, 1);
}

TEST(AttachFailure, ANetdevWithoutADmaDeviceIsRefusedAtRequestTimeAndJournaled) {
    Rig rig("nodma");
    auto &loop = rig.loop;
    auto load = policy::parse_policy_text(R"([[rule]]
name = "sim"
any_caller = true
netdevs = ["knodsim0"]
max_region = "1MiB"
flows = ["udp * -> *:5000"]
iommu = "any"
)",
                                          "/etc/knod/policy.toml");
    ASSERT_TRUE(load.ok()) << load.errors_text();
    NoDmaDevice driver;
    ASSERT_TRUE(driver.start().ok());
    {
        auto manager = rig.manager(driver, std::move(load.policy));
        auto &m = *manager;
        m.start();
        daemon::Peer me;
        me.uid = 4321;
        me.pid = getpid();
        std::optional<Result<daemon::Granted>> granted;
        ASSERT_NO_FATAL_FAILURE(request_one_region(m, loop, me, granted));
        ASSERT_FALSE(granted->ok()) << "granted on a netdev without a DMA device";
        EXPECT_EQ(granted->error().code, Errc::driver_failure);
        EXPECT_NE(granted->error().message.find("'lo' has no parent device"), std::string::npos)
            << granted->error().message;
        m.shutdown();
    }
    auto db =
        std::move(journal::Database::open(rig.config.journal_path, SQLITE_OPEN_READONLY)).value();
    auto st = db.prepare("SELECT uid, decision, reason FROM events WHERE kind = 'request-denied'");
    ASSERT_TRUE(st.ok());
    auto row = st->step();
    ASSERT_TRUE(row.ok() && *row) << "the refusal is an event";
    EXPECT_EQ(st->int64(0), 4321);
    EXPECT_EQ(st->text(1), "driver-failure");
    EXPECT_NE(st->text(2).find("no DMA device"), std::string::npos) << st->text(2);
    EXPECT_NE(st->text(2).find("the kernel is not asked"), std::string::npos) << st->text(2);
    EXPECT_EQ(*db.scalar("SELECT count(*) FROM sessions"), 0);
}

namespace {

// The sim's control half whose bindings drift when told: what the devmem guard reports for
// foreign packets on a bound queue (DevmemGuards::drifted).
class Drifting : public driver::SimDriver {
  public:
    Drifting() : SimDriver(config(), nullptr) {}
    std::map<std::string, std::string> drifted() override {
        std::map<std::string, std::string> out;
        if (!drift_.empty()) out[drift_] = "3 foreign packet(s) landed on queue 0 of knodsim0";
        drift_.clear();
        return out;
    }
    std::string drift_;

  private:
    static driver::SimConfig config() {
        driver::SimConfig c;
        c.datapath = false;
        return c;
    }
};

} // namespace

// #18: a binding the driver reports drifted is ended at the next tick as steering-drift, with
// what was seen journaled; the others stay.
TEST(SteeringDrift, EndsTheDriftedBindingAtTheNextTick) {
    Rig rig("drift");
    auto &loop = rig.loop;
    auto load = policy::parse_policy_text(R"([[rule]]
name = "sim"
any_caller = true
netdevs = ["knodsim0"]
max_region = "1MiB"
flows = ["udp * -> *:*"]
iommu = "any"
)",
                                          "/etc/knod/policy.toml");
    ASSERT_TRUE(load.ok()) << load.errors_text();
    Drifting driver;
    ASSERT_TRUE(driver.start().ok());
    std::vector<std::string> ids;
    {
        auto manager = rig.manager(driver, std::move(load.policy));
        auto &m = *manager;
        m.start();
        daemon::Peer me;
        me.uid = 4321;
        me.pid = getpid();
        for (int port : {5000, 5001}) {
            std::optional<Result<daemon::Granted>> granted;
            ASSERT_NO_FATAL_FAILURE(request_one_region(
                m, loop, me, granted, "udp 10.0.0.1:* -> 10.0.0.2:" + std::to_string(port)));
            ASSERT_TRUE(granted->ok()) << granted->error().message;
            ASSERT_TRUE(m.activate((*granted)->id, me, (*granted)->key).ok());
            ids.push_back((*granted)->id);
        }
        m.tick(journal::now_us());
        EXPECT_EQ(m.bindings().size(), 2u) << "nothing drifted yet";
        driver.drift_ = ids[0];
        m.tick(journal::now_us());
        auto left = m.bindings();
        ASSERT_EQ(left.size(), 1u);
        EXPECT_EQ(left[0]->id, ids[1]);
        m.shutdown();
    }
    auto db =
        std::move(journal::Database::open(rig.config.journal_path, SQLITE_OPEN_READONLY)).value();
    auto reason = [&](const std::string &id) {
        auto st = db.prepare("SELECT end_reason FROM sessions WHERE id = '" + id + "'");
        auto row = st->step();
        return row.ok() && *row ? st->text(0) : std::string("(none)");
    };
    EXPECT_EQ(reason(ids[0]), "steering-drift");
    EXPECT_EQ(reason(ids[1]), "daemon-stop");
    auto st = db.prepare("SELECT detail FROM events WHERE kind = 'session-ended' AND detail LIKE "
                         "'%foreign packet%'");
    auto row = st->step();
    EXPECT_TRUE(row.ok() && *row) << "what was seen is journaled";
}
