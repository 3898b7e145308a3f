// The article's example, on knod-policy: register a buffer for a flow, then wait for data.
//
//   handle = knod.register_buffer(ptr, n)          -> request_binding + activate
//   knod.wait_for_data(handle, timeout_ms=100)     -> wait_for_data
//
// It uses only the installed SDK (libknod-client, knod/client.hpp), as a program of one's own
// would. Here the "VRAM buffer" is a sealed memfd (the sim); on hardware it is a dma-buf.
//   knod-example-receive --netdev knodsim0 --gpu sim0 --bytes 4096
//       --flow 'udp 10.99.0.0/24:* -> 10.99.0.2:5000' --packets 3
// Exit status: 0 after receiving and releasing; 1 on failure; 3 when the binding ended under it
// (revoked, expired, its NIC gone: the reason is printed).
#include "knod/client.hpp"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

int main(int argc, char **argv) {
    std::string netdev = "knodsim0", gpu = "sim0", flow;
    std::uint64_t bytes = 4096;
    std::uint64_t packets = 1;
    int timeout_ms = 10000;
    CLI::App app{"Receive a flow into a (simulated) VRAM buffer through knod-policyd."};
    app.add_option("--netdev", netdev)->capture_default_str();
    app.add_option("--gpu", gpu)->capture_default_str();
    app.add_option("--bytes", bytes, "buffer size")->capture_default_str();
    app.add_option("--flow", flow, "flow spec to receive")->required();
    app.add_option("--packets", packets, "stop after this many packets")->capture_default_str();
    app.add_option("--timeout-ms", timeout_ms, "give up after this long without data")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    // The buffer: a memfd that cannot shrink under the data path.
    int fd = memfd_create("knod-vram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        std::cerr << "cannot make the buffer\n";
        return 1;
    }
    auto client = knod::sdk::Client::connect();
    if (!client) {
        std::cerr << client.error().message() << "\n";
        return 1;
    }
    auto granted = client->request_binding(netdev, gpu, "rx-only", fd, 0, bytes, {flow});
    if (!granted) {
        auto &e = granted.error();
        std::cerr << "refused: " << e.message() << "\n";
        if (!e.rule().empty()) std::cerr << "deciding rule: " << e.rule() << "\n";
        return 1;
    }
    knod::sdk::Binding &b = *granted;
    std::cout << "granted binding " << b.id() << " by rule '" << b.rule() << "'; key id "
              << b.key_id() << std::endl;
    if (auto a = b.activate(); !a) {
        std::cerr << "activate: " << a.error().message() << "\n";
        return 1;
    }
    std::cout << "activated with the key; waiting for data" << std::endl;
    std::uint64_t seen = 0;
    for (;;) {
        auto rx = b.wait_for_data(seen, timeout_ms);
        if (!rx) {
            // Revoked, expired, its NIC gone...: the daemon told us why; nothing to release.
            if (auto end = b.end(); end && *end) {
                std::cout << "binding " << b.id() << " ended: " << (*end)->reason << std::endl;
                return 3;
            }
            std::cout << "no more data: " << rx.error().message() << std::endl;
            break;
        }
        seen = *rx;
        auto c = b.counters();
        if (c && c->rx_packets >= packets) break;
    }
    // Bytes and packets from one reading of the counters: a wake-up's RxBytes can be older than
    // the packet count read after it (more may have landed between the two).
    auto c = b.counters();
    if (!c) {
        std::cerr << "counters: " << c.error().message() << "\n";
        return 1;
    }
    std::uint64_t n = std::min(c->rx_bytes, bytes);
    std::string data(n, '\0');
    if (n && pread(fd, data.data(), n, 0) != static_cast<ssize_t>(n)) return 1;
    std::cout << "buffer holds " << c->rx_bytes << " byte(s) from " << c->rx_packets
              << " packet(s): \"" << data << "\"" << std::endl;
    if (auto r = b.release(); !r) {
        std::cerr << "release: " << r.error().message() << "\n";
        return 1;
    }
    std::cout << "released " << b.id() << std::endl;
    return 0;
}
