// knod::list_dir: a directory walk that reports errors through std::error_code and never throws
// (#17 item 10: no exception may escape in the daemon).
#include "knod/dir.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace fs = std::filesystem;

namespace {

struct TempTree {
    fs::path root = fs::temp_directory_path() / ("knod-dir-test-" + std::to_string(getpid()));
    TempTree() {
        fs::remove_all(root);
        fs::create_directories(root / "sub");
        std::ofstream(root / "a") << "a";
    }
    ~TempTree() {
        std::error_code ec;
        fs::permissions(root, fs::perms::owner_all, ec);
        fs::remove_all(root, ec);
    }
};

} // namespace

TEST(ListDir, ListsEveryEntry) {
    TempTree t;
    std::error_code ec;
    auto entries = knod::list_dir(t.root, ec);
    ASSERT_FALSE(ec) << ec.message();
    std::sort(entries.begin(), entries.end());
    ASSERT_EQ(entries.size(), 2u);
    EXPECT_EQ(entries[0], t.root / "a");
    EXPECT_EQ(entries[1], t.root / "sub");
}

TEST(ListDir, AMissingDirIsAnErrorCode) {
    TempTree t;
    std::error_code ec;
    auto entries = knod::list_dir(t.root / "missing", ec);
    EXPECT_TRUE(ec);
    EXPECT_TRUE(entries.empty());
}

TEST(ListDir, AnUnreadableDirIsAnErrorCodeNotAnException) {
    TempTree t;
    ASSERT_EQ(chmod(t.root.c_str(), 0), 0);
    pid_t pid = fork();
    if (pid == 0) {
        // Root without the capabilities that override file modes (as under sim.conf).
        __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct d[2]{};
        if (syscall(SYS_capget, &h, d) != 0) _exit(10);
        d[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
        if (syscall(SYS_capset, &h, d) != 0) _exit(11);
        try {
            std::error_code ec;
            auto entries = knod::list_dir(t.root, ec);
            _exit(ec == std::errc::permission_denied && entries.empty() ? 0 : 1);
        } catch (...) {
            _exit(2);
        }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: listed or another error, 2: threw";
}
