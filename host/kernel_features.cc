#include "host/kernel_features.h"
#include "host/netdev_genl.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <linux/if_xdp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace knod::host {
namespace {

FeatureProbe available() {
    return {FeatureProbe::State::available, {}};
}
FeatureProbe missing(std::string detail) {
    return {FeatureProbe::State::missing, std::move(detail)};
}
FeatureProbe unknown(std::string detail) {
    return {FeatureProbe::State::unknown, std::move(detail)};
}

bool no_privilege(int e) {
    return e == EPERM || e == EACCES;
}

// The verifier's last line that is not its statistics.
std::string last_words(const char *log) {
    std::string text(log), last;
    for (std::size_t at = 0; at < text.size();) {
        std::size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(at, nl - at);
        at = nl + 1;
        if (line.empty() || line.rfind("processed ", 0) == 0 ||
            line.rfind("verification time", 0) == 0 || line.rfind("stack depth", 0) == 0)
            continue;
        last = line;
    }
    return last;
}

int quiet(enum libbpf_print_level, const char *, va_list) {
    return 0;
}

// r0 = 0; exit: a program every type accepts.
constexpr bpf_insn return_zero[] = {
    {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},
    {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
};

} // namespace

FeatureProbe probe_bpf_helper(int prog_type, int helper_id) {
    const bpf_insn insns[] = {
        {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_2, 0, 0, -8},
        {BPF_JMP | BPF_CALL, 0, 0, 0, helper_id},
        {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},
        {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
    };
    char log[4096] = "";
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .log_level = 1, .log_size = sizeof log, .log_buf = log);
    int fd = bpf_prog_load(static_cast<bpf_prog_type>(prog_type), "knod_probe", "GPL", insns,
                           sizeof insns / sizeof insns[0], &opts);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        return available();
    }
    std::string words = last_words(log);
    if (words.find("cannot use helper") != std::string::npos ||
        words.find("unknown func") != std::string::npos ||
        words.find("invalid func") != std::string::npos)
        return missing(words);
    if (no_privilege(e) && words.empty())
        return unknown("not probed: loading BPF programs needs root (CAP_BPF)");
    if (words.empty()) return unknown(std::string("the probe failed: ") + std::strerror(e));
    return available(); // refused for its arguments, so the helper itself is allowed
}

FeatureProbe probe_bpf_prog_type(int prog_type) {
    char log[4096] = "";
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .log_level = 1, .log_size = sizeof log, .log_buf = log);
    int fd = bpf_prog_load(static_cast<bpf_prog_type>(prog_type), "knod_probe", "GPL", return_zero,
                           2, &opts);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        return available();
    }
    if (no_privilege(e)) return unknown("not probed: loading BPF programs needs root (CAP_BPF)");
    std::string words = last_words(log);
    return missing(words.empty() ? std::strerror(e) : words);
}

FeatureProbe probe_bpf_map_type(int map_type) {
    // One small map of the type, made as the filters make theirs. Not libbpf's probe, which
    // takes a refusal for want of privilege as "not supported".
    LIBBPF_OPTS(bpf_map_create_opts, opts);
    __u32 key = 4, value = 4;
    if (map_type == BPF_MAP_TYPE_LPM_TRIE) {
        key = 8; // prefixlen + an IPv4 address
        opts.map_flags = BPF_F_NO_PREALLOC;
    }
    int fd =
        bpf_map_create(static_cast<bpf_map_type>(map_type), "knod_probe", key, value, 1, &opts);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        return available();
    }
    if (no_privilege(e)) return unknown("not probed: creating BPF maps needs root (CAP_BPF)");
    return missing(std::string("the kernel does not create this map type: ") + std::strerror(e));
}

FeatureProbe probe_af_xdp() {
    int fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        return available();
    }
    if (no_privilege(e)) return unknown("not probed: AF_XDP sockets need CAP_NET_RAW");
    // EAFNOSUPPORT also comes from a sandbox's address-family filter (RestrictAddressFamilies).
    return missing(
        std::string("socket(AF_XDP): ") + std::strerror(e) +
        (e == EAFNOSUPPORT ? " (no CONFIG_XDP_SOCKETS, or a sandbox that forbids it)" : ""));
}

FeatureProbe probe_tc_bpf() {
    FeatureProbe out;
    // A thread's network namespace is its own: unshare() here moves this thread alone.
    std::thread probe([&out] {
        if (unshare(CLONE_NEWNET) != 0) {
            int e = errno;
            out = unknown(no_privilege(e) ? "not probed: a network namespace of its own needs "
                                            "CAP_SYS_ADMIN (or a sandbox forbids namespaces)"
                                          : std::string("not probed: no network namespace of "
                                                        "its own: ") +
                                                std::strerror(e));
            return;
        }
        libbpf_set_print(quiet);
        LIBBPF_OPTS(bpf_prog_load_opts, opts);
        int prog =
            bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "knod_probe", "GPL", return_zero, 2, &opts);
        if (prog < 0) {
            out = no_privilege(errno)
                      ? unknown("not probed: needs root (CAP_BPF)")
                      : missing(std::string("no tc BPF programs: ") + std::strerror(errno));
            return;
        }
        LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = 1, .attach_point = BPF_TC_INGRESS); // lo
        LIBBPF_OPTS(bpf_tc_opts, tc, .prog_fd = prog);
        int r = bpf_tc_hook_create(&hook);
        if (r != 0 && r != -EEXIST)
            out = missing(std::string("no clsact qdisc (CONFIG_NET_SCH_INGRESS): ") +
                          std::strerror(-r));
        else if ((r = bpf_tc_attach(&hook, &tc)) != 0)
            out = missing(std::string("no BPF classifier (CONFIG_NET_CLS_BPF): ") +
                          std::strerror(-r));
        else
            out = available();
        close(prog);
        // The namespace, its loopback and the qdisc go with this thread.
    });
    probe.join();
    return out;
}

FeatureProbe probe_netdev_genl() {
    auto genl = driver::NetdevGenl::open();
    if (genl) return available();
    return missing(genl.error().message);
}

std::vector<KernelFeature> probe_kernel_features(bool with_namespaces) {
    const char *sim_datapath = "the sim driver's data path cannot run (knod-policyd "
                               "--sim-datapath=off runs its control half alone)";
    std::vector<KernelFeature> out;
    auto add = [&](std::string id, std::string what, std::string needed_by, std::string cost,
                   std::string fix, CheckStatus when_missing, FeatureProbe probe) {
        out.push_back({std::move(id), std::move(what), std::move(needed_by), std::move(cost),
                       std::move(fix), when_missing, std::move(probe)});
    };
    add("bpf.prog.xdp", "XDP programs", "the sim driver's flow filter", sim_datapath,
        "boot a kernel with CONFIG_BPF_SYSCALL and CONFIG_XDP (every Debian kernel has both)",
        CheckStatus::warn, probe_bpf_prog_type(BPF_PROG_TYPE_XDP));
    add("bpf.prog.sched_cls", "tc BPF programs (SCHED_CLS)",
        "the devmem driver's guards, the sim's steering",
        "the devmem driver cannot guard a bound RX queue and refuses every binding; " +
            std::string(sim_datapath),
        "boot a kernel with CONFIG_BPF_SYSCALL and CONFIG_NET_CLS_BPF", CheckStatus::warn,
        probe_bpf_prog_type(BPF_PROG_TYPE_SCHED_CLS));
    add("bpf.map.lpm_trie", "BPF LPM trie maps", "every flow filter and guard (prefix rules)",
        "the devmem driver refuses every binding; " + std::string(sim_datapath),
        "boot a kernel with CONFIG_BPF_SYSCALL (LPM tries are in every kernel since 4.11)",
        CheckStatus::warn, probe_bpf_map_type(BPF_MAP_TYPE_LPM_TRIE));
    add("bpf.map.xskmap", "AF_XDP socket maps (XSKMAP)", "the sim driver's flow filter",
        sim_datapath, "boot a kernel with CONFIG_XDP_SOCKETS", CheckStatus::warn,
        probe_bpf_map_type(BPF_MAP_TYPE_XSKMAP));
    add("bpf.helper.redirect_map", "bpf_redirect_map in XDP programs",
        "the sim driver's flow filter", sim_datapath,
        "boot a kernel that lets XDP programs redirect (mainline has since 4.14)",
        CheckStatus::warn, probe_bpf_helper(BPF_PROG_TYPE_XDP, BPF_FUNC_redirect_map));
    add("bpf.helper.xdp_adjust_meta", "bpf_xdp_adjust_meta in XDP programs",
        "the sim's guard at tc ingress (knod-policyd --sim-guard=tc)",
        "the sim's guard checks passed packets inside the XDP filter instead (--sim-guard=xdp, "
        "which --sim-guard=auto chooses): steering drift is still caught; only --sim-guard=tc "
        "is unavailable",
        "nothing to do; a kernel that allows the helper (mainline does) runs the guard at tc "
        "ingress, as on a devmem NIC",
        CheckStatus::info, probe_bpf_helper(BPF_PROG_TYPE_XDP, BPF_FUNC_xdp_adjust_meta));
    add("af_xdp", "AF_XDP sockets", "the sim driver's data path", sim_datapath,
        "boot a kernel with CONFIG_XDP_SOCKETS", CheckStatus::warn, probe_af_xdp());
    if (with_namespaces)
        add("tc.bpf", "a clsact qdisc with a BPF classifier",
            "the devmem driver's guards, the sim's steering",
            "the devmem driver cannot guard a bound RX queue and refuses every binding; " +
                std::string(sim_datapath),
            "boot a kernel with CONFIG_NET_SCH_INGRESS and CONFIG_NET_CLS_BPF (or load the "
            "sch_ingress and cls_bpf modules)",
            CheckStatus::warn, probe_tc_bpf());
    add("netdev.genl", "the netdev generic-netlink family", "the devmem driver (bind-rx)",
        "the devmem driver is unavailable (--driver=auto falls back to knod or none)",
        "boot Linux 6.12 or later with CONFIG_NET_DEVMEM (Debian 12: bookworm-backports' 6.12)",
        CheckStatus::warn, probe_netdev_genl());
    return out;
}

std::string describe_missing(const KernelFeature &f) {
    return f.what + " " + (f.probe.missing() ? "refused by this kernel" : "not probed") +
           (f.probe.detail.empty() ? "" : " (" + f.probe.detail + ")") + ": " + f.cost;
}

std::vector<HostCheck> kernel_feature_checks(const std::vector<KernelFeature> &features) {
    std::vector<HostCheck> out;
    for (auto &f : features) {
        HostCheck c;
        c.id = "kernel.feature." + f.id;
        c.subject = "host";
        switch (f.probe.state) {
        case FeatureProbe::State::available:
            c.status = CheckStatus::pass;
            c.message = f.what + ": available (used by " + f.needed_by + ")";
            break;
        case FeatureProbe::State::missing:
            c.status = f.when_missing;
            c.message = describe_missing(f);
            c.fix = f.fix;
            break;
        case FeatureProbe::State::unknown:
            c.status = CheckStatus::info;
            c.message = f.what + ": " + f.probe.detail + " (used by " + f.needed_by + ")";
            c.fix = "run knod-policy doctor as root";
            break;
        }
        out.push_back(std::move(c));
    }
    return out;
}

} // namespace knod::host
