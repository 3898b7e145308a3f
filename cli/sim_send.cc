// knod-policy sim-send: UDP from the sim's wire side, for demos and tests. The sender runs in a
// child that enters the sim namespace, so this process stays where it is. Needs root.
// --queue N plays a stray steering rule: the datagrams land on the sim NIC's RX queue N whatever
// the sim's own steering says, which is how a test or a demo makes the devmem guard see foreign
// traffic on a bound queue (steering drift).
#include "cli/commands.h"
#include "knod/result.h"
#include "knod/untrusted.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <net/if.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>
#include <utility>

namespace knod::cli {
namespace {

struct Options {
    std::string netns = "knod-sim";
    std::string to;
    std::uint16_t from_port = 0;
    int count = 1;
    std::string data = "knod";
    int interval_ms = 0;
    int queue = -1; // -1: the sim's steering decides
};

// A tc program that is not the daemon's, on the wire end's egress ahead of the sim's steering
// (priority 1): every packet gets queue_mapping = queue + 1, which veth delivers on RX queue
// `queue`. Four instructions, so no object file: r2 = queue + 1; skb->queue_mapping = r2;
// r0 = TC_ACT_OK; exit. Detached (and its fd closed) by the returned cleanup.
class StraySteering {
  public:
    static Result<StraySteering> attach(int queue, const sockaddr_in &dst) {
        libbpf_set_print(nullptr); // an existing clsact is fine; errors are reported below
        StraySteering s;
        // The wire is the link the destination is routed through: the namespace may hold other
        // links too (knod.distributed's tests route their nodes' veths through it, #53).
        s.ifindex_ = link_towards(dst);
        struct if_nameindex *links = s.ifindex_ ? nullptr : if_nameindex();
        for (auto *l = links; l && l->if_index; ++l)
            if (std::strcmp(l->if_name, "lo") != 0) s.ifindex_ = static_cast<int>(l->if_index);
        if (links) if_freenameindex(links);
        if (s.ifindex_ == 0) return make_error(Errc::not_found, "no wire link in the namespace");
        const bpf_insn insns[] = {
            {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_2, 0, 0, queue + 1},
            {BPF_STX | BPF_MEM | BPF_W, BPF_REG_1, BPF_REG_2,
             static_cast<__s16>(offsetof(__sk_buff, queue_mapping)), 0},
            {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, TC_ACT_OK},
            {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
        };
        s.prog_fd_ = bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "knod_stray", "GPL", insns,
                                   sizeof insns / sizeof insns[0], nullptr);
        if (s.prog_fd_ < 0)
            return make_error(Errc::unavailable, std::string("cannot load the steering program: ") +
                                                     std::strerror(errno));
        LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = s.ifindex_, .attach_point = BPF_TC_EGRESS);
        int r = bpf_tc_hook_create(&hook);
        if (r != 0 && r != -EEXIST)
            return make_error(Errc::unavailable,
                              std::string("cannot add clsact: ") + std::strerror(-r));
        LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = s.prog_fd_, .handle = 1, .priority = 1);
        if ((r = bpf_tc_attach(&hook, &opts)) != 0)
            return make_error(Errc::unavailable,
                              std::string("cannot attach to the wire end: ") + std::strerror(-r));
        s.attached_ = true;
        return s;
    }
    StraySteering(StraySteering &&o) noexcept
        : ifindex_(o.ifindex_), prog_fd_(std::exchange(o.prog_fd_, -1)),
          attached_(std::exchange(o.attached_, false)) {}
    ~StraySteering() {
        if (attached_) {
            LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex_, .attach_point = BPF_TC_EGRESS);
            LIBBPF_OPTS(bpf_tc_opts, opts, .handle = 1, .priority = 1);
            bpf_tc_detach(&hook, &opts);
        }
        if (prog_fd_ >= 0) close(prog_fd_);
    }

  private:
    StraySteering() = default;

    // The index of the link whose address the kernel would send from to `dst` (0: none found).
    static int link_towards(const sockaddr_in &dst) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return 0;
        sockaddr_in src{};
        socklen_t len = sizeof src;
        bool routed = connect(fd, reinterpret_cast<const sockaddr *>(&dst), sizeof dst) == 0 &&
                      getsockname(fd, reinterpret_cast<sockaddr *>(&src), &len) == 0;
        close(fd);
        if (!routed) return 0;
        int index = 0;
        ifaddrs *all = nullptr;
        if (getifaddrs(&all) != 0) return 0;
        for (auto *a = all; a && !index; a = a->ifa_next)
            if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET &&
                reinterpret_cast<const sockaddr_in *>(a->ifa_addr)->sin_addr.s_addr ==
                    src.sin_addr.s_addr)
                index = static_cast<int>(if_nametoindex(a->ifa_name));
        freeifaddrs(all);
        return index;
    }

    int ifindex_ = 0;
    int prog_fd_ = -1;
    bool attached_ = false;
};

int send(const Options &o) {
    auto colon = o.to.rfind(':');
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    std::uint16_t port = 0;
    if (colon != std::string::npos) {
        // from_chars: no throw, no sign, the whole rest or nothing.
        const char *first = o.to.data() + colon + 1, *last = o.to.data() + o.to.size();
        auto [end, ec] = std::from_chars(first, last, port);
        if (ec != std::errc() || end != last) port = 0;
    }
    if (colon == std::string::npos || port == 0 ||
        inet_pton(AF_INET, o.to.substr(0, colon).c_str(), &dst.sin_addr) != 1) {
        std::cerr << "knod-policy sim-send: --to must be IPV4:PORT (a port 1-65535), not " << o.to
                  << "\n";
        return exit_usage;
    }
    dst.sin_port = htons(port);
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
        std::optional<StraySteering> stray;
        if (o.queue >= 0) {
            auto attached = StraySteering::attach(o.queue, dst);
            if (!attached) {
                std::cerr << "knod-policy sim-send: --queue: " << attached.error().message << "\n";
                _exit(exit_failed);
            }
            stray.emplace(std::move(*attached));
        }
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (o.from_port) {
            sockaddr_in src{};
            src.sin_family = AF_INET;
            src.sin_port = htons(o.from_port);
            if (bind(s, reinterpret_cast<sockaddr *>(&src), sizeof src) != 0) {
                stray.reset();
                _exit(exit_failed);
            }
        }
        for (int i = 0; i < o.count; ++i) {
            if (sendto(s, o.data.data(), o.data.size(), 0, reinterpret_cast<sockaddr *>(&dst),
                       sizeof dst) < 0) {
                std::cerr << "knod-policy sim-send: " << std::strerror(errno) << "\n";
                stray.reset();
                _exit(exit_failed);
            }
            if (o.interval_ms)
                std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
        }
        stray.reset(); // _exit runs no destructor
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
    cmd->add_option("--queue", o->queue,
                    "deliver on the sim NIC's RX queue N whatever the sim's steering says, as a "
                    "stray ntuple rule would (shows the devmem guard revoking a binding for "
                    "steering drift)")
        ->check(CLI::Range(0, 63));
    return [cmd, o]() -> int { return cmd->parsed() ? send(*o) : -1; };
}

} // namespace knod::cli
