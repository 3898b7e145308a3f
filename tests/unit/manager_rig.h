// What a unit test of the binding manager needs besides a driver: the daemon's loop played by
// the test thread (journal completions are posted here and run when the test drains them), a
// temporary journal folder, and the manager over a driver and a policy.
#pragma once

#include "daemon/binding_manager.h"
#include "policy/parser.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>

namespace knod::testing {

// Posted work runs on the test thread, in order, only inside run_until().
struct Loop {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> posted;
    void post(std::function<void()> f) {
        std::lock_guard lock(mu);
        posted.push_back(std::move(f));
        cv.notify_all();
    }
    // Runs posted work until `done` holds; false after 20 s without it.
    bool run_until(const std::function<bool()> &done) {
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!done()) {
            std::unique_lock lock(mu);
            if (!cv.wait_until(lock, end, [&] { return !posted.empty(); })) return false;
            auto f = std::move(posted.front());
            posted.pop_front();
            lock.unlock();
            f();
        }
        return true;
    }
};

struct NoEvents : daemon::BindingEvents {
    void binding_created(const daemon::Binding &) override {}
    void binding_ended(const daemon::Binding &, daemon::EndReason, const std::string &) override {}
    void policy_reloaded(std::size_t, std::size_t) override {}
};

// A temporary journal folder (removed at the end), the loop the manager posts to, and the
// manager over a driver and a policy.
struct Rig {
    explicit Rig(const std::string &name)
        : dir(std::filesystem::temp_directory_path() /
              ("knod-" + name + "-" + std::to_string(getpid()))) {
        std::filesystem::remove_all(dir);
        std::filesystem::create_directories(dir);
        config.journal_path = (dir / "journal.db").string();
    }
    ~Rig() { std::filesystem::remove_all(dir); }
    std::unique_ptr<daemon::BindingManager> manager(driver::Driver &driver, policy::Policy p,
                                                    daemon::BindingEvents *to = nullptr) {
        std::array<std::uint8_t, 32> secret{};
        return std::make_unique<daemon::BindingManager>(
            config, driver, std::move(keys::KeyAuthority::with_secret(secret)).value(),
            std::move(p), to ? *to : events,
            [this](std::function<void()> f) { loop.post(std::move(f)); });
    }
    std::filesystem::path dir;
    NoEvents events;
    Loop loop;
    daemon::ManagerConfig config;
};

// A sealed memfd of `size` bytes, as the sim's callers pass their region; -1 on failure.
inline int sealed_region(std::size_t size = 4096) {
    int fd = memfd_create("region", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

inline policy::Policy parse_or_fail(const std::string &text) {
    auto load = policy::parse_policy_text(text, "/etc/knod/policy.toml");
    EXPECT_TRUE(load.ok()) << load.errors_text();
    return std::move(load.policy);
}

} // namespace knod::testing
