// knod-policy sim-send: UDP from the sim's wire side, for demos and tests. The sender runs in a
// child that enters the sim namespace, so this process stays where it is. Needs root.
#include "cli/commands.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <thread>

namespace knod::cli {
namespace {

struct Options {
    std::string netns = "knod-sim";
    std::string to;
    std::uint16_t from_port = 0;
    int count = 1;
    std::string data = "knod";
    int interval_ms = 0;
};

int send(const Options &o) {
    auto colon = o.to.rfind(':');
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    if (colon == std::string::npos ||
        inet_pton(AF_INET, o.to.substr(0, colon).c_str(), &dst.sin_addr) != 1) {
        std::cerr << "knod-policy sim-send: --to must be IPV4:PORT\n";
        return exit_usage;
    }
    dst.sin_port = htons(static_cast<std::uint16_t>(std::stoi(o.to.substr(colon + 1))));
    pid_t pid = fork();
    if (pid == 0) {
        int ns = open(("/run/netns/" + o.netns).c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
            std::cerr << "knod-policy sim-send: cannot enter namespace " << o.netns << ": "
                      << std::strerror(errno)
                      << " (is the daemon running with the sim driver, "
                         "and are you root?)\n";
            _exit(exit_usage);
        }
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (o.from_port) {
            sockaddr_in src{};
            src.sin_family = AF_INET;
            src.sin_port = htons(o.from_port);
            if (bind(s, reinterpret_cast<sockaddr *>(&src), sizeof src) != 0) _exit(exit_failed);
        }
        for (int i = 0; i < o.count; ++i) {
            if (sendto(s, o.data.data(), o.data.size(), 0, reinterpret_cast<sockaddr *>(&dst),
                       sizeof dst) < 0) {
                std::cerr << "knod-policy sim-send: " << std::strerror(errno) << "\n";
                _exit(exit_failed);
            }
            if (o.interval_ms)
                std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
        }
        _exit(exit_ok);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : exit_failed;
}

} // namespace

Runner add_sim_send(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "sim-send", "Send UDP datagrams from the sim driver's wire side (root; demos and tests).");
    cmd->add_option("--netns", o->netns, "the sim's wire namespace")->capture_default_str();
    cmd->add_option("--to", o->to, "destination IPV4:PORT, e.g. 10.99.0.2:5000")->required();
    cmd->add_option("--from-port", o->from_port, "source port (default: any)");
    cmd->add_option("--count", o->count, "datagrams to send")->capture_default_str();
    cmd->add_option("--data", o->data, "payload of each datagram")->capture_default_str();
    cmd->add_option("--interval-ms", o->interval_ms, "pause between datagrams");
    return [cmd, o]() -> int { return cmd->parsed() ? send(*o) : -1; };
}

} // namespace knod::cli
