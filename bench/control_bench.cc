// Control-plane benchmark: N clients loop RequestBinding + Activate + Release against the daemon
// for a fixed time; in the same run the same clients time a bare method call (Peer.Ping) on the
// daemon. Prints p50/p99 of both, their ratio, pairs per second; then holds many live bindings
// and reads the daemon's RSS. Run inside scripts/knod-sandbox.sh (see docs/performance.md).
//   knod_control_bench [--seconds S] [--clients 1,4,16] [--live 10000]
#include "client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

namespace {

int region(std::size_t size) {
    int fd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        std::exit(1);
    return fd;
}

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

long rss_kib(const char *pid) {
    std::ifstream in(std::string("/proc/") + pid + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

// Flows are exclusive: binding k gets source host 1 + k % 250 and port 5000 + k / 250.
std::string flow(int k) {
    return "udp 10.99.0." + std::to_string(1 + k % 250) +
           ":* -> 10.99.0.2:" + std::to_string(5000 + k / 250);
}

struct Result {
    std::vector<double> pair_us, ping_us;
    std::size_t errors = 0;
};

Result run(int clients, double seconds, bool ping) {
    std::vector<Result> per(static_cast<std::size_t>(clients));
    std::vector<std::thread> threads;
    std::atomic<bool> stop{false};
    for (int c = 0; c < clients; ++c)
        threads.emplace_back([&, c] {
            auto client = knod::client::Client::connect();
            if (!client) return;
            int fd = region(4096);
            auto &r = per[static_cast<std::size_t>(c)];
            while (!stop.load()) {
                auto t = Clock::now();
                if (ping) {
                    if (!client->ping()) ++r.errors;
                    r.ping_us.push_back(
                        std::chrono::duration<double, std::micro>(Clock::now() - t).count());
                    continue;
                }
                auto g =
                    client->request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow(c)});
                if (!g || !client->activate(g->id, g->key) || !client->release(g->id)) {
                    ++r.errors;
                    continue;
                }
                r.pair_us.push_back(
                    std::chrono::duration<double, std::micro>(Clock::now() - t).count());
            }
            close(fd);
        });
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (auto &t : threads)
        t.join();
    Result all;
    for (auto &r : per) {
        all.pair_us.insert(all.pair_us.end(), r.pair_us.begin(), r.pair_us.end());
        all.ping_us.insert(all.ping_us.end(), r.ping_us.begin(), r.ping_us.end());
        all.errors += r.errors;
    }
    return all;
}

} // namespace

int main(int argc, char **argv) {
    double seconds = 5;
    std::vector<int> client_counts = {1, 4, 16};
    int live = 10000;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (!std::strcmp(argv[i], "--clients") && i + 1 < argc) {
            client_counts.clear();
            std::stringstream ss(argv[++i]);
            std::string n;
            while (std::getline(ss, n, ','))
                client_counts.push_back(std::stoi(n));
        } else if (!std::strcmp(argv[i], "--live") && i + 1 < argc) {
            live = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: %s [--seconds S] [--clients 1,4,16] [--live N]\n",
                         argv[0]);
            return 2;
        }
    }
    const char *pid = std::getenv("KNOD_DAEMON_PID");
    std::printf("daemon RSS idle: %ld KiB\n", pid ? rss_kib(pid) : -1L);
    std::printf("%-8s %10s %10s %10s %10s %10s %12s %8s\n", "clients", "ping p50", "ping p99",
                "pair p50", "pair p99", "p50 ratio", "pairs/s", "errors");
    for (int n : client_counts) {
        Result ping = run(n, seconds / 2, true);
        Result pairs = run(n, seconds, false);
        double p50 = pct(pairs.pair_us, 0.5), b50 = pct(ping.ping_us, 0.5);
        std::printf("%-8d %8.0fus %8.0fus %8.0fus %8.0fus %10.2f %12.0f %8zu\n", n, b50,
                    pct(ping.ping_us, 0.99), p50, pct(pairs.pair_us, 0.99), b50 > 0 ? p50 / b50 : 0,
                    static_cast<double>(pairs.pair_us.size()) / seconds,
                    pairs.errors + ping.errors);
    }
    if (live > 0) {
        auto client = knod::client::Client::connect();
        if (!client) return 1;
        int fd = region(4096);
        auto t = Clock::now();
        int held = 0;
        for (int i = 0; i < live; ++i)
            if (client->request_binding("knodsim0", "sim0", "rx-only", fd, 0, 4096, {flow(i)}))
                ++held;
        double s = std::chrono::duration<double>(Clock::now() - t).count();
        std::printf("%d live bindings held (%d asked) in %.1f s; daemon RSS: %ld KiB\n", held, live,
                    s, pid ? rss_kib(pid) : -1L);
        close(fd);
    }
    return 0;
}
