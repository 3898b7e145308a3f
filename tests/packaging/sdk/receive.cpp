// A C++ program of one's own against the installed knod/client.hpp (header-only over
// libknod-client): the same as receive.c. Usage: receive NETDEV FLOW EXPECT | --deny NETDEV FLOW
#include <knod/client.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>

int main(int argc, char **argv) {
    bool deny = argc > 1 && std::strcmp(argv[1], "--deny") == 0;
    if (argc != 4) {
        std::cerr << "usage: receive NETDEV FLOW EXPECT | receive --deny NETDEV FLOW\n";
        return 2;
    }
    std::string netdev = argv[1 + deny], flow = argv[2 + deny];
    int fd = memfd_create("sdk-cpp", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, 4096) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return 1;
    auto client = knod::sdk::Client::connect();
    if (!client) {
        std::cerr << client.error().message() << "\n";
        return 1;
    }
    auto b = client->register_buffer(netdev, "sim0", fd, 0, 4096, {flow});
    if (deny) {
        if (b) return 1;
        auto &e = b.error();
        std::cout << "denied " << knod_errc_name(e.code()) << " " << e.dbus_name() << " "
                  << (e.rule().empty() ? "-" : e.rule()) << std::endl;
        return 0;
    }
    if (!b) {
        std::cerr << "register_buffer: " << b.error().message() << "\n";
        return 1;
    }
    std::cout << "bound " << b->id() << " " << b->rule() << std::endl;
    std::uint64_t expect = std::stoull(argv[3]), rx = 0;
    while (rx < expect) {
        auto r = b->wait_for_data(rx, 10000);
        if (!r) {
            std::cerr << "wait_for_data: " << r.error().message() << "\n";
            return 1;
        }
        rx = *r;
    }
    std::string data(rx, '\0');
    if (pread(fd, data.data(), rx, 0) != static_cast<ssize_t>(rx)) return 1;
    std::cout << "received " << rx << " " << data << std::endl;
    if (auto r = b->release(); !r) return 1;
    auto end = b->end();
    std::cout << "ended " << (end && *end ? 1 : 0) << " " << (end && *end ? (*end)->reason : "-")
              << std::endl;
    return 0;
}
