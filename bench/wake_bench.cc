// Packet-to-wake-up latency of wait_for_data (libknod-client, the installed SDK) in the sim,
// against a plain UDP recv() on the same veth in the same run: a datagram is sent from the wire
// namespace while the receiver sleeps, and the time from sendto() to the receiver's wake-up is
// taken, alternating the two, N times each. A third binding waits the old way (polling RxBytes
// every 2 ms, what the library does where a driver has no notifier), for comparison. Prints
// p50/p99 of each, the ratios to recv(), and the CPU a second of idle wait_for_data costs. Run
// inside scripts/knod-sandbox.sh as root:
//   knod_wake_bench [--netdev knodsim0] [--netns knod-sim] [--count 2000]
#include "client/client.h"
#include "knod/client.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint16_t binding_port = 5900, udp_port = 5901, polled_port = 5902;

[[noreturn]] void die(const std::string &why) {
    std::fprintf(stderr, "knod_wake_bench: %s\n", why.c_str());
    std::exit(1);
}

// A UDP socket in `netns` (the sim's wire side): made there, used from here.
int wire_socket(const std::string &netns) {
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int there = open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (home < 0 || there < 0 || setns(there, CLONE_NEWNET) != 0)
        die("cannot enter namespace " + netns + ": " + std::strerror(errno));
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (setns(home, CLONE_NEWNET) != 0) die("cannot return to this namespace");
    close(home);
    close(there);
    if (s < 0) die("socket");
    return s;
}

sockaddr_in to(std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, "10.99.0.2", &a.sin_addr);
    return a;
}

double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

double thread_cpu_ms() {
    rusage r{};
    getrusage(RUSAGE_THREAD, &r);
    return (static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e3;
}

// Times one datagram: `wait` blocks until it has arrived (true) or gives up (false).
template <typename Wait> double one(int tx, std::uint16_t port, char tag, Wait wait) {
    std::atomic<long long> woke{0};
    std::atomic<bool> ready{false}, ok{false};
    std::thread rx([&] {
        ready = true;
        ok = wait();
        woke = Clock::now().time_since_epoch().count();
    });
    while (!ready)
        std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1)); // the receiver is asleep by now
    sockaddr_in a = to(port);
    auto sent = Clock::now();
    if (sendto(tx, &tag, 1, 0, reinterpret_cast<sockaddr *>(&a), sizeof a) != 1) die("sendto");
    rx.join();
    if (!ok) die(std::string("a datagram to port ") + std::to_string(port) + " never arrived");
    return static_cast<double>(woke.load() - sent.time_since_epoch().count()) / 1e3; // us
}

} // namespace

int main(int argc, char **argv) {
    std::string netdev = "knodsim0", netns = "knod-sim";
    int count = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--netdev")
            netdev = argv[i + 1];
        else if (a == "--netns")
            netns = argv[i + 1];
        else if (a == "--count")
            count = std::max(1, std::atoi(argv[i + 1]));
        else
            die("unknown option " + a);
    }
    // The baseline: a plain socket on the sim NIC's address (traffic no binding claims passes
    // to the stack), received with recv().
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in local = to(udp_port);
    if (udp < 0 || bind(udp, reinterpret_cast<sockaddr *>(&local), sizeof local) != 0)
        die(std::string("bind 10.99.0.2:5901: ") + std::strerror(errno));
    timeval tv{5, 0};
    setsockopt(udp, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int tx = wire_socket(netns);

    const std::size_t size = 1 << 16;
    int fd = memfd_create("wake-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        die("memfd");
    auto client = knod::sdk::Client::connect();
    if (!client) die(client.error().message());
    auto b = client->register_buffer(
        netdev, "sim0", fd, 0, size,
        {"udp 10.99.0.0/24:* -> 10.99.0.2:" + std::to_string(binding_port)});
    if (!b) die("register_buffer: " + b.error().message());

    // The polling baseline, on the in-tree C++ client (it has the key to activate with).
    auto poller = knod::client::Client::connect();
    if (!poller) die(poller.error().message);
    int polled_fd = memfd_create("wake-bench-poll", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (polled_fd < 0 || ftruncate(polled_fd, size) != 0 ||
        fcntl(polled_fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        die("memfd");
    auto polled =
        poller->request_binding(netdev, "sim0", "rx-only", polled_fd, 0, size,
                                {"udp 10.99.0.0/24:* -> 10.99.0.2:" + std::to_string(polled_port)});
    if (!polled || !poller->activate(polled->id, polled->key))
        die("the polled binding: " +
            (polled ? std::string("activate failed") : polled.error().message));

    std::vector<double> knod_us, udp_us, polled_us;
    std::uint64_t seen = 0, polled_seen = 0;
    for (int i = 0; i < count; ++i) {
        char tag = static_cast<char>('a' + i % 26);
        knod_us.push_back(one(tx, binding_port, tag, [&] {
            auto rx = b->wait_for_data(seen, 5000);
            if (!rx) return false;
            seen = *rx;
            return true;
        }));
        polled_us.push_back(one(tx, polled_port, tag, [&] {
            auto rx = poller->wait_for_data(polled->id, polled_seen, 5000);
            if (!rx) return false;
            polled_seen = *rx;
            return true;
        }));
        udp_us.push_back(one(tx, udp_port, tag, [&] {
            char c = 0;
            return recv(udp, &c, 1, 0) == 1 && c == tag;
        }));
    }
    // Every byte landed where wait_for_data said, in order.
    std::string got(static_cast<std::size_t>(seen), '\0');
    if (seen != static_cast<std::uint64_t>(count) ||
        pread(fd, got.data(), got.size(), 0) != static_cast<ssize_t>(got.size()))
        die("the binding received " + std::to_string(seen) + " bytes, not " +
            std::to_string(count));
    for (int i = 0; i < count; ++i)
        if (got[static_cast<std::size_t>(i)] != static_cast<char>('a' + i % 26))
            die("byte " + std::to_string(i) + " is wrong");

    double cpu_ms = 0;
    std::thread idle([&] {
        double before = thread_cpu_ms();
        (void)b->wait_for_data(seen, 1000); // nothing is sent
        cpu_ms = thread_cpu_ms() - before;
    });
    idle.join();

    std::printf("packet-to-wake-up, %d datagrams each, sim NIC %s (us):\n", count, netdev.c_str());
    std::printf("  %-28s p50 %8.1f  p99 %8.1f\n", "plain UDP recv()", pct(udp_us, 0.5),
                pct(udp_us, 0.99));
    std::printf("  %-28s p50 %8.1f  p99 %8.1f\n", "wait_for_data (binding)", pct(knod_us, 0.5),
                pct(knod_us, 0.99));
    std::printf("  %-28s p50 %8.1f  p99 %8.1f\n", "polling RxBytes every 2 ms", pct(polled_us, 0.5),
                pct(polled_us, 0.99));
    std::printf("  ratio wait_for_data / recv: p50 %.2fx  p99 %.2fx\n",
                pct(knod_us, 0.5) / pct(udp_us, 0.5), pct(knod_us, 0.99) / pct(udp_us, 0.99));
    std::printf("  ratio polling / recv:       p50 %.2fx  p99 %.2fx\n",
                pct(polled_us, 0.5) / pct(udp_us, 0.5), pct(polled_us, 0.99) / pct(udp_us, 0.99));
    (void)poller->release(polled->id);
    std::printf("CPU of 1 s idle wait_for_data: %.2f ms\n", cpu_ms);
    return 0;
}
