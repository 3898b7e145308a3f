#include "daemon/driver/sim_network.h"

#include <bpf/libbpf.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>

namespace knod::driver {
namespace {

std::string read_first_line(const std::string &path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

// Attaches the steering program to the wire end's egress from inside the sim namespace. A
// short-lived child enters the namespace, so the daemon itself never changes namespace; the tc
// filter stays after the child exits.
Result<void> attach_steering(const SimNetworkConfig &c, int prog_fd) {
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return make_error(Errc::io, "pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        auto fail = [&](const std::string &why) {
            (void)!write(pipefd[1], why.data(), why.size());
            _exit(1);
        };
        int ns = open(("/run/netns/" + c.netns).c_str(), O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) fail("cannot enter namespace " + c.netns);
        int ifindex = static_cast<int>(if_nametoindex(c.wire.c_str()));
        if (ifindex == 0) fail("no " + c.wire + " in " + c.netns);
        LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_EGRESS);
        int r = bpf_tc_hook_create(&hook);
        if (r != 0 && r != -EEXIST)
            fail(std::string("clsact on ") + c.wire + ": " + std::strerror(-r));
        LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog_fd);
        if ((r = bpf_tc_attach(&hook, &opts)) != 0)
            fail(std::string("tc attach on ") + c.wire + ": " + std::strerror(-r));
        _exit(0);
    }
    close(pipefd[1]);
    char buf[512];
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return make_error(Errc::driver_failure,
                          "sim steering: " +
                              (n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "failed"));
    return {};
}

} // namespace

Result<std::string> run_ip(const std::vector<std::string> &args) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return make_error(Errc::io, "pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        std::vector<char *> argv{const_cast<char *>("ip")};
        for (auto &a : args)
            argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        execvp("ip", argv.data());
        _exit(127);
    }
    close(out[1]);
    std::string text;
    char buf[1024];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0)
        text.append(buf, static_cast<std::size_t>(n));
    close(out[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::string cmd = "ip";
        for (auto &a : args)
            cmd += " " + a;
        return make_error(Errc::driver_failure, cmd + ": " + text);
    }
    return text;
}

void SimNetwork::remove(const SimNetworkConfig &c) {
    (void)run_ip({"link", "del", c.nic}); // takes the wire end with it
    (void)run_ip({"netns", "del", c.netns});
    // Only this network's own pins: other daemons may pin other netdevs' filters under the same
    // root.
    (void)bpf::FlowFilter::remove_pinned(c.filter.pin_root, c.nic);
}

Result<std::unique_ptr<SimNetwork>> SimNetwork::create(const SimNetworkConfig &c) {
    remove(c);
    std::unique_ptr<SimNetwork> net(new SimNetwork(c));
    std::string q = std::to_string(c.queues);
    std::string mtu = std::to_string(c.mtu);
    std::string nic_cidr = c.nic_address + "/" + std::to_string(c.prefix_length);
    std::string wire_cidr = c.wire_address + "/" + std::to_string(c.prefix_length);
    const std::vector<std::vector<std::string>> steps = {
        {"netns", "add", c.netns},
        {"link", "add",  c.nic,  "mtu", mtu, "numtxqueues", q, "numrxqueues", q, "type", "veth",
         "peer", "name", c.wire, "mtu", mtu, "numtxqueues", q, "numrxqueues", q},
        {"link", "set", c.wire, "netns", c.netns},
        {"addr", "add", nic_cidr, "dev", c.nic},
        {"link", "set", c.nic, "up"},
        {"-n", c.netns, "addr", "add", wire_cidr, "dev", c.wire},
        {"-n", c.netns, "link", "set", c.wire, "up"},
        {"-n", c.netns, "link", "set", "lo", "up"},
    };
    for (auto &step : steps) {
        auto r = run_ip(step);
        if (!r) {
            remove(c);
            return std::move(r).error().context("sim network");
        }
    }
    // A permanent neighbour entry: the wire side never needs ARP through the filter, which may
    // be set to drop everything no binding claims.
    std::string mac = read_first_line("/sys/class/net/" + c.nic + "/address");
    if (auto r = run_ip({"-n", c.netns, "neigh", "replace", c.nic_address, "lladdr", mac, "dev",
                         c.wire, "nud", "permanent"});
        !r) {
        remove(c);
        return r.error();
    }
    auto filter = bpf::FlowFilter::attach(c.nic, c.filter);
    if (!filter) {
        remove(c);
        return std::move(filter).error().context("sim flow filter");
    }
    net->filter_ = std::move(*filter);
    if (auto r = attach_steering(c, net->filter_->steer_program_fd()); !r) {
        net.reset();
        return r.error();
    }
    if (auto r = net->filter_->guard_passed_traffic(); !r) {
        net.reset();
        return std::move(r).error().context("sim guard");
    }
    return net;
}

SimNetwork::~SimNetwork() {
    filter_.reset(); // detach and unpin first
    (void)run_ip({"link", "del", config_.nic});
    (void)run_ip({"netns", "del", config_.netns});
    rmdir(config_.filter.pin_root.c_str()); // only if nothing else is pinned there
}

} // namespace knod::driver
