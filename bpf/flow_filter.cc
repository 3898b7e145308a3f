#include "bpf/flow_filter.h"
#include "knod/dir.h"

#include "flow_filter.skel.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <linux/magic.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <type_traits>

namespace fs = std::filesystem;

namespace knod::bpf {
namespace {

std::string err(int e) {
    return std::strerror(e < 0 ? -e : e);
}

const char *pinned_maps[] = {"config", "exact4",   "exact6", "prefixes4", "prefixes6",
                             "slots",  "counters", "stats",  "xsks",      "bound_queues"};

// The devmem guard's tc filter: a fixed handle and priority, so that it is ours to remove.
constexpr __u32 guard_handle = 0x4b4e, guard_priority = 0x4b4e;

struct bpf_map *map_named(flow_filter_bpf *s, const std::string &name) {
    return bpf_object__find_map_by_name(s->obj, name.c_str());
}

// The pin folder for IFNAME under PIN_ROOT, which must not exist yet: one filter per netdev.
// Not fs::exists(path), which throws when the pin root cannot be searched (#17 item 10).
Result<std::string> free_pin_dir(const std::string &pin_root, const std::string &ifname) {
    std::string pin_dir = pin_root + "/" + ifname;
    std::error_code ec;
    auto pin_status = fs::symlink_status(pin_dir, ec);
    if (ec && pin_status.type() != fs::file_type::not_found)
        return make_error(Errc::io, "cannot look for a pinned filter in " + pin_root + ": " +
                                        ec.message() +
                                        " (the pin root must belong to the daemon's user)");
    if (fs::exists(pin_status))
        return make_error(Errc::denied, pin_dir +
                                            " already exists: another knod filter is pinned "
                                            "for " +
                                            ifname + " (run reconcile first)");
    return pin_dir;
}

// Makes PIN_DIR and pins every map there (the daemon's next start and `reconcile` find them).
Result<void> pin_maps(flow_filter_bpf *skel, const std::string &pin_dir) {
    std::error_code ec;
    fs::create_directories(pin_dir, ec);
    if (ec) return make_error(Errc::io, "cannot create " + pin_dir + ": " + ec.message());
    for (const char *m : pinned_maps)
        if (bpf_map__fd(map_named(skel, m)) >= 0 && // xsks only where the XDP filter runs
            bpf_map__pin(map_named(skel, m), (pin_dir + "/" + m).c_str()) != 0)
            return make_error(Errc::io, std::string("cannot pin map ") + m + ": " + err(errno));
    return {};
}

// Silences libbpf's own printing; errors come back through Result.
int quiet(enum libbpf_print_level, const char *, va_list) {
    return 0;
}

// libbpf's warnings during one load (which program or map failed, and the verifier's log), kept
// to say what the kernel refused. libbpf's print hook is process-wide: loads take turns, and the
// hook writes only into the log of the thread that is loading (another thread's warnings are
// dropped, as quiet() drops them).
std::mutex load_log_mutex;
thread_local std::string *load_log = nullptr;
constexpr std::size_t load_log_cap = 1u << 20;

int keep_warnings(enum libbpf_print_level level, const char *format, va_list args) {
    if (level == LIBBPF_DEBUG || load_log == nullptr) return 0;
    va_list copy;
    va_copy(copy, args);
    int n = std::vsnprintf(nullptr, 0, format, copy);
    va_end(copy);
    if (n <= 0) return 0;
    std::string line(static_cast<std::size_t>(n) + 1, '\0');
    std::vsnprintf(line.data(), line.size(), format, args);
    line.resize(static_cast<std::size_t>(n));
    // A verifier log can be tens of MiB and its reason is at its end: keep each message's tail.
    if (line.size() > load_log_cap) line.erase(0, line.size() - load_log_cap);
    load_log->append(line);
    return 0;
}

bool starts_with(const std::string &s, const char *prefix) {
    return s.rfind(prefix, 0) == 0;
}

// What the kernel refused in a failed load, from libbpf's warnings: "BPF program P: REASON" with
// the verifier's last word on P, "BPF map M: REASON", or empty when libbpf named nothing.
std::string refused_part(const std::string &log) {
    std::vector<std::string> lines;
    for (std::size_t at = 0; at < log.size();) {
        std::size_t nl = log.find('\n', at);
        if (nl == std::string::npos) nl = log.size();
        lines.push_back(log.substr(at, nl - at));
        at = nl + 1;
    }
    // libbpf prefixes its own messages ("libbpf: prog 'x': ..."); the verifier's lines come bare.
    for (auto &l : lines)
        if (starts_with(l, "libbpf: ")) l.erase(0, 8);
    for (std::size_t i = 0; i < lines.size(); ++i) {
        const std::string &l = lines[i];
        auto quoted = [&](const char *kind) -> std::string {
            std::size_t open = l.find('\''), close = l.find('\'', open + 1);
            if (!starts_with(l, kind) || open == std::string::npos || close == std::string::npos)
                return {};
            return l.substr(open + 1, close - open - 1);
        };
        if (std::string map = quoted("map '");
            !map.empty() && l.find("failed to create") != std::string::npos) {
            std::size_t colon = l.find("failed to create");
            return "BPF map " + map + ": " + l.substr(colon);
        }
        std::string prog = quoted("prog '");
        if (prog.empty() || l.find("BEGIN PROG LOAD LOG") == std::string::npos) continue;
        // The verifier's reason is the last line of the log that is not its statistics.
        std::string reason;
        for (std::size_t j = i + 1; j < lines.size(); ++j) {
            const std::string &v = lines[j];
            if (v.find("END PROG LOAD LOG") != std::string::npos) break;
            if (v.empty() || starts_with(v, "processed ") || starts_with(v, "verification time") ||
                starts_with(v, "stack depth") || starts_with(v, "max_states_per_insn") ||
                starts_with(v, "Validating "))
                continue;
            reason = v;
        }
        return "BPF program " + prog + ": " + (reason.empty() ? "refused" : reason);
    }
    for (auto &l : lines) // no log: libbpf still names the program it failed on
        if (starts_with(l, "prog '") && l.find("failed to load") != std::string::npos) return l;
    return {};
}

} // namespace

Result<void> FlowFilter::ensure_bpffs(const std::string &pin_root) {
    struct statfs st {};
    // A pin root that is itself on bpffs (the shipped unit bind-mounts /sys/fs/bpf/knod at
    // /run/knod-policy/bpf, whose parent is tmpfs) needs nothing mounted.
    if (statfs(pin_root.c_str(), &st) == 0 && st.f_type == BPF_FS_MAGIC) return {};
    std::string base = fs::path(pin_root).parent_path().string(); // /sys/fs/bpf
    if (statfs(base.c_str(), &st) != 0 || st.f_type != BPF_FS_MAGIC) {
        std::error_code ec;
        fs::create_directories(base, ec);
        if (mount("bpf", base.c_str(), "bpf", 0, "mode=0700") != 0)
            return make_error(Errc::unavailable,
                              "cannot mount bpffs at " + base + ": " + err(errno));
    }
    std::error_code ec;
    fs::create_directories(pin_root, ec);
    if (ec) return make_error(Errc::io, "cannot create " + pin_root + ": " + ec.message());
    chmod(pin_root.c_str(), 0700);
    return {};
}

const char *to_string(SimGuardPath path) {
    return path == SimGuardPath::tc ? "tc" : "xdp";
}

Result<std::unique_ptr<FlowFilter>> FlowFilter::load(const FilterOptions &options) {
    return load_programs(options, xdp_filter | steer | devmem_guard | devmem_guard_test |
                                      (options.sim_guard == SimGuardPath::tc ? sim_tc_guard : 0u));
}

Result<std::unique_ptr<FlowFilter>> FlowFilter::load_programs(const FilterOptions &options,
                                                              unsigned programs) {
    libbpf_set_print(quiet);
    std::unique_ptr<FlowFilter> f(new FlowFilter());
    f->sim_guard_ = options.sim_guard;
    f->skel_ = flow_filter_bpf__open();
    if (!f->skel_)
        return make_error(Errc::unavailable, "cannot open the flow filter object: " + err(errno));
    // Fresh hash keys for each loaded filter: nobody can choose rules that pile into one bucket.
    std::array<knod_exact4_hash, 2> hash4{};
    std::array<knod_exact6_hash, 2> hash6{};
    if (getrandom(hash4.data(), sizeof hash4, 0) != static_cast<ssize_t>(sizeof hash4) ||
        getrandom(hash6.data(), sizeof hash6, 0) != static_cast<ssize_t>(sizeof hash6))
        return make_error(Errc::unavailable, "cannot draw the filter's hash keys: " + err(errno));
    auto odd = [](auto &hashes) {
        for (auto &h : hashes)
            for (auto &m : h.mul)
                m |= 1; // odd multipliers keep every input bit
    };
    odd(hash4);
    odd(hash6);
    std::copy(hash4.begin(), hash4.end(), f->skel_->rodata->exact4_hash);
    std::copy(hash6.begin(), hash6.end(), f->skel_->rodata->exact6_hash);
    for (auto &table : f->exact4_)
        table = std::make_unique<Exact4Table>(hash4);
    for (auto &table : f->exact6_)
        table = std::make_unique<Exact6Table>(hash6);
    auto &progs = f->skel_->progs;
    bool tc_path = options.sim_guard == SimGuardPath::tc;
    const std::pair<bpf_program *, unsigned> wanted[] = {
        {progs.knod_flow_filter, tc_path ? 0u : xdp_filter},
        {progs.knod_flow_filter_meta, tc_path ? xdp_filter : 0u},
        {progs.knod_steer, steer},
        {progs.knod_devmem_guard, devmem_guard},
        {progs.knod_devmem_guard_test, devmem_guard_test},
        {progs.knod_sim_guard, sim_tc_guard},
    };
    for (auto [prog, bit] : wanted)
        bpf_program__set_autoload(prog, (programs & bit) != 0);
    // The AF_XDP socket map only where the XDP filter redirects to it: a kernel without AF_XDP
    // (CONFIG_XDP_SOCKETS) still runs the devmem guard.
    bpf_map__set_autocreate(f->skel_->maps.xsks, (programs & xdp_filter) != 0);
    std::string log;
    int r = 0;
    {
        std::lock_guard lock(load_log_mutex);
        load_log = &log;
        auto before = libbpf_set_print(keep_warnings);
        r = flow_filter_bpf__load(f->skel_);
        libbpf_set_print(before);
        load_log = nullptr;
    }
    if (r != 0) {
        std::string what = refused_part(log);
        std::string hint = (r == -EPERM || r == -EACCES)
                               ? " (loading BPF programs needs CAP_BPF, CAP_NET_ADMIN and "
                                 "CAP_PERFMON, or root)"
                               : "";
        return make_error(Errc::unavailable,
                          "the kernel refused the flow filter's " +
                              (what.empty() ? "programs: " + err(r) : what + " (" + err(r) + ")") +
                              hint);
    }
    if (auto c = f->set_unmatched_drop(options.drop_unmatched); !c) return c.error();
    return f;
}

Result<std::unique_ptr<FlowFilter>> FlowFilter::attach(const std::string &ifname,
                                                       const FilterOptions &options) {
    unsigned ifindex = if_nametoindex(ifname.c_str());
    if (ifindex == 0) return make_error(Errc::not_found, "no network interface '" + ifname + "'");
    __u32 existing = 0;
    if (bpf_xdp_query_id(static_cast<int>(ifindex), 0, &existing) == 0 && existing != 0)
        return make_error(Errc::denied,
                          "interface " + ifname + " already has an XDP program (id " +
                              std::to_string(existing) +
                              "); knod-policy never replaces a program it did not load");
    if (auto b = ensure_bpffs(options.pin_root); !b) return b.error();
    auto pin_dir = free_pin_dir(options.pin_root, ifname);
    if (!pin_dir) return pin_dir.error();
    auto loaded = load_programs(
        options, xdp_filter | steer | (options.sim_guard == SimGuardPath::tc ? sim_tc_guard : 0u));
    if (!loaded) return loaded.error();
    auto f = std::move(*loaded);
    f->ifname_ = ifname;
    int prog = f->program_fd();
    LIBBPF_OPTS(bpf_link_create_opts, native, .flags = XDP_FLAGS_DRV_MODE);
    f->link_fd_ = bpf_link_create(prog, static_cast<int>(ifindex), BPF_XDP, &native);
    f->mode_ = "native";
    if (f->link_fd_ < 0) {
        int native_err = errno;
        if (!options.allow_generic)
            return make_error(Errc::unsupported,
                              "native XDP on " + ifname + " refused: " + err(native_err));
        LIBBPF_OPTS(bpf_link_create_opts, generic, .flags = XDP_FLAGS_SKB_MODE);
        f->link_fd_ = bpf_link_create(prog, static_cast<int>(ifindex), BPF_XDP, &generic);
        if (f->link_fd_ < 0)
            return make_error(Errc::unavailable, "cannot attach XDP to " + ifname + ": native: " +
                                                     err(native_err) + "; generic: " + err(errno));
        f->mode_ = "generic";
        f->mode_note_ =
            "native XDP refused on " + ifname + " (" + err(native_err) + "); using generic XDP";
    }
    f->pin_dir_ = *pin_dir; // set first: a failure below is cleaned up by detach()
    if (auto p = pin_maps(f->skel_, *pin_dir); !p) return p.error();
    if (bpf_obj_pin(f->link_fd_, (*pin_dir + "/link").c_str()) != 0)
        return make_error(Errc::io, "cannot pin the XDP link in " + *pin_dir + ": " + err(errno));
    return f;
}

namespace {

// Attaches a guard program to `ifname`'s tc ingress (a clsact qdisc is added if none), with our
// fixed handle and priority: it replaces a guard a crashed daemon left (ours by construction).
Result<int> attach_tc_ingress(const std::string &ifname, int prog_fd) {
    int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (ifindex == 0) return make_error(Errc::not_found, "no network interface '" + ifname + "'");
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS);
    int r = bpf_tc_hook_create(&hook);
    if (r != 0 && r != -EEXIST)
        return make_error(Errc::unavailable,
                          "cannot add a clsact qdisc to " + ifname + ": " + err(r));
    LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog_fd, .flags = BPF_TC_F_REPLACE,
                .handle = guard_handle, .priority = guard_priority);
    if ((r = bpf_tc_attach(&hook, &opts)) != 0)
        return make_error(Errc::unavailable,
                          "cannot attach the guard to " + ifname + " (tc ingress): " + err(r));
    return ifindex;
}

} // namespace

Result<std::unique_ptr<FlowFilter>> FlowFilter::attach_guard(const std::string &ifname,
                                                             const FilterOptions &options) {
    if (if_nametoindex(ifname.c_str()) == 0)
        return make_error(Errc::not_found, "no network interface '" + ifname + "'");
    if (auto b = ensure_bpffs(options.pin_root); !b) return b.error();
    auto pin_dir = free_pin_dir(options.pin_root, ifname);
    if (!pin_dir) return pin_dir.error();
    // The guard and its test entry (the same code, run by BPF_PROG_TEST_RUN): never the XDP
    // filter, which a devmem NIC cannot carry and some kernels refuse.
    auto loaded = load_programs(options, devmem_guard | devmem_guard_test);
    if (!loaded) return loaded.error();
    auto f = std::move(*loaded);
    f->ifname_ = ifname;
    auto ifindex = attach_tc_ingress(ifname, bpf_program__fd(f->skel_->progs.knod_devmem_guard));
    if (!ifindex) return ifindex.error();
    f->guard_ifindex_ = *ifindex;
    f->mode_ = "tc";
    f->pin_dir_ = *pin_dir; // set first: a failure below is cleaned up by detach()
    if (auto p = pin_maps(f->skel_, *pin_dir); !p) return p.error();
    return f;
}

Result<void> FlowFilter::guard_passed_traffic() {
    if (link_fd_ < 0)
        return make_error(Errc::invalid_argument, "the guard runs behind an attached XDP filter");
    // Queues recorded first: until the guard is on, a recorded queue is only read by no one.
    config_.record_queue = 1;
    if (auto w = write_config(); !w) return w;
    if (sim_guard_ == SimGuardPath::xdp) return {}; // the filter checks bound queues itself
    auto ifindex = attach_tc_ingress(ifname_, bpf_program__fd(skel_->progs.knod_sim_guard));
    if (!ifindex) return ifindex.error();
    guard_ifindex_ = *ifindex;
    return {};
}

bool FlowFilter::guard_attached(const std::string &ifname) {
    int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (ifindex == 0) return false;
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS);
    LIBBPF_OPTS(bpf_tc_opts, opts, .handle = guard_handle, .priority = guard_priority);
    return bpf_tc_query(&hook, &opts) == 0;
}

Result<std::vector<std::string>> FlowFilter::beside_guard(const std::string &ifname) {
    int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (ifindex == 0) return make_error(Errc::not_found, "no network interface '" + ifname + "'");
    std::vector<std::string> out;
    // tcx programs run before every clsact filter; one that returns anything but next hides the
    // packet from the guard.
    // BPF_TCX_INGRESS (Linux 6.6+; Debian 12's headers stop before it): an older kernel refuses
    // the query, and has no tcx.
    constexpr int tcx_ingress = 46;
    __u32 tcx_count = 0;
    if (bpf_prog_query(ifindex, static_cast<bpf_attach_type>(tcx_ingress), 0, nullptr, nullptr,
                       &tcx_count) == 0 &&
        tcx_count > 0)
        out.push_back(std::to_string(tcx_count) + " tcx ingress program(s)");
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return make_error(Errc::io, "rtnetlink socket: " + err(errno));
    struct {
        nlmsghdr n;
        tcmsg t;
    } req{};
    req.n.nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
    req.n.nlmsg_type = RTM_GETTFILTER;
    req.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.t.tcm_family = AF_UNSPEC;
    req.t.tcm_ifindex = ifindex;
    req.t.tcm_parent = TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS);
    if (send(fd, &req, req.n.nlmsg_len, 0) < 0) {
        int e = errno;
        close(fd);
        return make_error(Errc::io, "tc filter dump of " + ifname + ": " + err(e));
    }
    std::vector<char> buf(32768);
    for (bool done = false; !done;) {
        ssize_t n = recv(fd, buf.data(), buf.size(), 0);
        if (n < 0) {
            int e = errno;
            close(fd);
            return make_error(Errc::io, "tc filter dump of " + ifname + ": " + err(e));
        }
        int left = static_cast<int>(n);
        for (auto *h = reinterpret_cast<nlmsghdr *>(buf.data()); NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type == NLMSG_DONE) {
                done = true;
                break;
            }
            if (h->nlmsg_type == NLMSG_ERROR) {
                auto *e = static_cast<nlmsgerr *>(NLMSG_DATA(h));
                close(fd);
                if (e->error == -EINVAL || e->error == -ENOENT) return out; // no clsact
                return make_error(Errc::io, "tc filter dump of " + ifname + ": " + err(e->error));
            }
            if (h->nlmsg_type != RTM_NEWTFILTER || h->nlmsg_len < NLMSG_LENGTH(sizeof(tcmsg)))
                continue;
            auto *t = static_cast<tcmsg *>(NLMSG_DATA(h));
            if (t->tcm_handle == 0) continue; // a priority's head, not a filter
            __u32 prio = TC_H_MAJ(t->tcm_info) >> 16;
            if (prio == guard_priority && t->tcm_handle == guard_handle) continue; // ours
            out.push_back("tc ingress filter pref " + std::to_string(prio) + " handle 0x" +
                          [](__u32 v) {
                              char hex[16];
                              std::snprintf(hex, sizeof hex, "%x", v);
                              return std::string(hex);
                          }(t->tcm_handle));
        }
    }
    close(fd);
    return out;
}

void FlowFilter::detach() {
    if (guard_ifindex_ > 0) {
        LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = guard_ifindex_, .attach_point = BPF_TC_INGRESS);
        LIBBPF_OPTS(bpf_tc_opts, opts, .handle = guard_handle, .priority = guard_priority);
        bpf_tc_detach(&hook, &opts);
        guard_ifindex_ = -1;
    }
    if (!pin_dir_.empty()) {
        std::error_code ec;
        fs::remove_all(pin_dir_, ec); // unlinking pins is how bpffs removes them
        pin_dir_.clear();
    }
    if (link_fd_ >= 0) {
        bpf_link_detach(link_fd_);
        close(link_fd_);
        link_fd_ = -1;
    }
}

FlowFilter::~FlowFilter() {
    detach();
    flow_filter_bpf__destroy(skel_);
}

namespace {

// Detaches a pinned filter's program and unpins everything in its directory.
void unpin_dir(const fs::path &dir) {
    int link = bpf_obj_get((dir / "link").c_str());
    if (link >= 0) {
        bpf_link_detach(link); // the program leaves the interface even if others hold it
        close(link);
    }
    std::error_code ec;
    fs::remove_all(dir, ec); // unlinking pins is how bpffs removes them
}

} // namespace

Result<std::vector<std::string>> FlowFilter::reconcile(const std::string &pin_root,
                                                       const std::set<std::string> &keep) {
    if (auto b = ensure_bpffs(pin_root); !b) return b.error();
    std::vector<std::string> removed;
    std::error_code ec;
    for (auto &entry : knod::list_dir(pin_root, ec)) {
        std::string name = entry.filename().string();
        if (keep.count(name)) continue;
        unpin_dir(entry);
        removed.push_back(name);
    }
    return removed;
}

Result<bool> FlowFilter::remove_pinned(const std::string &pin_root, const std::string &ifname) {
    if (auto b = ensure_bpffs(pin_root); !b) return b.error();
    fs::path dir = fs::path(pin_root) / ifname;
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
    unpin_dir(dir);
    return true;
}

Result<void> FlowFilter::write_config() {
    __u32 zero = 0;
    if (bpf_map__update_elem(skel_->maps.config, &zero, sizeof zero, &config_, sizeof config_, 0) !=
        0)
        return make_error(Errc::io, "cannot write the filter config: " + err(errno));
    return {};
}

Result<void> FlowFilter::bump_epoch() {
    config_.epoch += 1;
    return write_config();
}

Result<void> FlowFilter::set_unmatched_drop(bool drop) {
    config_.unmatched = drop ? KNOD_UNMATCHED_DROP : KNOD_UNMATCHED_PASS;
    return write_config();
}

Result<void> FlowFilter::set_slot(std::uint32_t slot, SlotState state, std::uint32_t queue) {
    if (slot >= KNOD_MAX_BINDINGS) return make_error(Errc::invalid_argument, "slot out of range");
    knod_slot v{static_cast<__u32>(state), queue};
    // Slots are not per generation: a packet that matched this slot's old rules must not act on
    // its new state (a freed slot given to another binding, a revoked one). The bump makes such
    // a packet decide again (see knod_config).
    if (auto w = bump_epoch(); !w) return w;
    if (bpf_map__update_elem(skel_->maps.slots, &slot, sizeof slot, &v, sizeof v, 0) != 0)
        return make_error(Errc::io,
                          "cannot write slot " + std::to_string(slot) + ": " + err(errno));
    // The devmem guard's reverse index: an active slot holds its queue, nothing else does.
    auto held = queue_of_.find(slot);
    if (held != queue_of_.end()) {
        __u32 q = held->second;
        queue_of_.erase(held);
        // The sim puts several bindings on one queue: the queue stays bound while one is active.
        __u32 owner = 0;
        for (auto &[other, other_queue] : queue_of_)
            if (other_queue == q) owner = other + 1;
        bpf_map__update_elem(skel_->maps.bound_queues, &q, sizeof q, &owner, sizeof owner, 0);
    }
    if (state == SlotState::active && queue < KNOD_MAX_QUEUES) {
        __u32 owner = slot + 1;
        if (bpf_map__update_elem(skel_->maps.bound_queues, &queue, sizeof queue, &owner,
                                 sizeof owner, 0) != 0)
            return make_error(Errc::io, "cannot mark queue " + std::to_string(queue) +
                                            " bound: " + err(errno));
        queue_of_[slot] = queue;
    }
    return {};
}

Result<void> FlowFilter::set_flows(std::uint32_t slot, const std::vector<policy::FlowSpec> &flows) {
    auto change = rules_.set(slot, flows);
    if (!change) return change.error(); // refused: nothing changed, nothing written
    if (change->exact.empty() && change->buckets.empty()) return {}; // the live rules stand
    for (auto &dirty : dirty_exact_)
        dirty.insert(change->exact.begin(), change->exact.end());
    for (auto &dirty : dirty_buckets_)
        dirty.insert(change->buckets.begin(), change->buckets.end());
    auto r = publish();
    // Not published: the rules go back; what was dirty stays dirty, so whatever the failed
    // publish wrote into the idle generation is rewritten at the next one.
    if (!r) rules_.undo();
    return r;
}

template <typename Family>
Result<std::vector<std::uint32_t>> FlowFilter::update_exact(ExactTable<Family> &table,
                                                            std::uint32_t gen) {
    std::vector<typename Family::Entry> upserts, removals;
    char family = std::is_same_v<Family, Exact4> ? 4 : 6;
    for (auto &key : dirty_exact_[gen]) {
        if (key.empty() || key[0] != family) continue;
        std::optional<typename Family::Entry> e;
        if constexpr (std::is_same_v<Family, Exact4>)
            e = rules_.exact4(key);
        else
            e = rules_.exact6(key);
        if (e) {
            upserts.push_back(*e);
        } else {
            // Gone: the entry as it was (only its key matters for a removal).
            if constexpr (std::is_same_v<Family, Exact4>)
                removals.push_back(RuleSet::exact4_of(key));
            else
                removals.push_back(RuleSet::exact6_of(key));
        }
    }
    return table.update(upserts, removals);
}

// Writes the given buckets of generation `gen` of an exact table in one batch (bucket by bucket
// where the kernel has no batch update for arrays); all of them when the kernel's copy is unknown.
template <typename Family>
Result<void> FlowFilter::write_exact(bpf_map *map, const ExactTable<Family> &table,
                                     std::uint32_t gen, const std::vector<std::uint32_t> &changed,
                                     bool &unsynced) {
    constexpr unsigned bits =
        std::is_same_v<Family, Exact4> ? KNOD_EXACT4_BUCKET_BITS : KNOD_EXACT6_BUCKET_BITS;
    std::vector<std::uint32_t> all;
    if (unsynced) {
        all.resize(Family::buckets);
        for (std::uint32_t b = 0; b < Family::buckets; ++b)
            all[b] = b;
    }
    const std::vector<std::uint32_t> &buckets = unsynced ? all : changed;
    if (buckets.empty()) return {};
    std::vector<__u32> keys;
    std::vector<typename Family::Bucket> values;
    keys.reserve(buckets.size());
    values.reserve(buckets.size());
    for (std::uint32_t b : buckets) {
        keys.push_back(gen << bits | b);
        values.push_back(table.bucket(b));
    }
    int fd = bpf_map__fd(map);
    __u32 count = static_cast<__u32>(keys.size());
    if (bpf_map_update_batch(fd, keys.data(), values.data(), &count, nullptr) == 0) {
        unsynced = false;
        return {};
    }
    for (std::size_t i = 0; i < keys.size(); ++i)
        if (bpf_map_update_elem(fd, &keys[i], &values[i], 0) != 0) {
            unsynced = true;
            return make_error(Errc::io, std::string("cannot write the exact ") + Family::name +
                                            " rule table: " + err(errno));
        }
    unsynced = false;
    return {};
}

// Writes or deletes generation `gen`'s copy of every dirty prefix bucket.
Result<void> FlowFilter::write_buckets(std::uint32_t gen) {
    for (auto &d : dirty_buckets_[gen]) {
        bool v4 = d.family == policy::Family::ipv4;
        knod_lpm4_key k4{32u + d.length, static_cast<__u8>(gen), {}, {}};
        knod_lpm6_key k6{32u + d.length, static_cast<__u8>(gen), {}, {}};
        std::memcpy(k4.addr, d.addr.data(), sizeof k4.addr);
        std::memcpy(k6.addr, d.addr.data(), sizeof k6.addr);
        bpf_map *map = v4 ? skel_->maps.prefixes4 : skel_->maps.prefixes6;
        void *key = v4 ? static_cast<void *>(&k4) : static_cast<void *>(&k6);
        std::size_t key_size = v4 ? sizeof k4 : sizeof k6;
        auto bucket = rules_.bucket(d);
        if (!bucket) {
            bpf_map__delete_elem(map, key, key_size, 0); // not there after a failed write: fine
            continue;
        }
        if (bpf_map__update_elem(map, key, key_size, &*bucket, sizeof *bucket, 0) != 0)
            return make_error(Errc::io, std::string("rule map ") + bpf_map__name(map) +
                                            " is full or refused an entry: " + err(errno));
    }
    return {};
}

// Brings the idle generation to the new rule set with only the writes that differ from what it
// held, then flips the config: from that instant packets use the new set as a whole.
Result<void> FlowFilter::publish() {
    std::uint32_t next = config_.generation ^ 1;
    // The userspace tables first: a rule that finds no place is refused before the kernel sees
    // anything.
    auto changed4 = update_exact(*exact4_[next], next);
    if (!changed4) return changed4.error();
    auto changed6 = update_exact(*exact6_[next], next);
    if (!changed6) {
        exact4_[next]->undo();
        return changed6.error();
    }
    // Packets that read the config before the last flip may still be reading this generation:
    // the bump makes them decide again (see knod_config).
    Result<void> r = bump_epoch();
    if (r)
        r = write_exact(skel_->maps.exact4, *exact4_[next], next, *changed4,
                        exact4_unsynced_[next]);
    if (r)
        r = write_exact(skel_->maps.exact6, *exact6_[next], next, *changed6,
                        exact6_unsynced_[next]);
    if (r) r = write_buckets(next);
    knod_config flipped = config_;
    flipped.generation = next;
    flipped.prefixes4 = static_cast<__u32>(rules_.bucket_count(policy::Family::ipv4));
    flipped.prefixes6 = static_cast<__u32>(rules_.bucket_count(policy::Family::ipv6));
    if (r) {
        std::swap(config_, flipped);
        if (r = write_config(); !r) config_ = flipped;
    }
    if (!r) {
        // The idle generation is half written, but packets never look at it. The tables go back
        // to the rules that stay; what the kernel got of them is unknown, so the next publish
        // rewrites them whole.
        exact4_[next]->undo();
        exact6_[next]->undo();
        exact4_unsynced_[next] = exact6_unsynced_[next] = true;
        return r;
    }
    dirty_exact_[next].clear();
    dirty_buckets_[next].clear();
    return {};
}

Result<void> FlowFilter::remove(std::uint32_t slot) {
    if (auto r = set_slot(slot, SlotState::free, 0); !r) return r;
    if (auto r = set_flows(slot, {}); !r) return r;
    int cpus = libbpf_num_possible_cpus();
    std::vector<knod_counters> zero(static_cast<std::size_t>(cpus > 0 ? cpus : 1));
    bpf_map__update_elem(skel_->maps.counters, &slot, sizeof slot, zero.data(),
                         zero.size() * sizeof(knod_counters), 0);
    return {};
}

SlotCounters FlowFilter::counters(std::uint32_t slot) const {
    int cpus = libbpf_num_possible_cpus();
    std::vector<knod_counters> per_cpu(static_cast<std::size_t>(cpus > 0 ? cpus : 1));
    SlotCounters out;
    if (bpf_map__lookup_elem(skel_->maps.counters, &slot, sizeof slot, per_cpu.data(),
                             per_cpu.size() * sizeof(knod_counters), 0) != 0)
        return out;
    for (auto &c : per_cpu) {
        out.packets += c.packets;
        out.bytes += c.bytes;
        out.drops += c.drops;
        out.misrouted += c.misrouted;
    }
    return out;
}

FilterStats FlowFilter::stats() const {
    int cpus = libbpf_num_possible_cpus();
    auto read = [&](__u32 index) {
        std::vector<__u64> per_cpu(static_cast<std::size_t>(cpus > 0 ? cpus : 1));
        __u64 sum = 0;
        if (bpf_map__lookup_elem(skel_->maps.stats, &index, sizeof index, per_cpu.data(),
                                 per_cpu.size() * sizeof(__u64), 0) == 0)
            for (auto v : per_cpu)
                sum += v;
        return sum;
    };
    return {read(KNOD_STAT_PASSED),   read(KNOD_STAT_DROPPED),      read(KNOD_STAT_MALFORMED),
            read(KNOD_STAT_FRAGMENT), read(KNOD_STAT_BINDING_DROP), read(KNOD_STAT_REDECIDED),
            read(KNOD_STAT_RACED),    read(KNOD_STAT_MISROUTED)};
}

int FlowFilter::program_fd() const {
    return bpf_program__fd(sim_guard_ == SimGuardPath::tc ? skel_->progs.knod_flow_filter_meta
                                                          : skel_->progs.knod_flow_filter);
}
int FlowFilter::steer_program_fd() const {
    return bpf_program__fd(skel_->progs.knod_steer);
}
int FlowFilter::guard_program_fd() const {
    return bpf_program__fd(skel_->progs.knod_devmem_guard);
}
int FlowFilter::guard_test_program_fd() const {
    return bpf_program__fd(skel_->progs.knod_devmem_guard_test);
}
int FlowFilter::xsks_fd() const {
    return bpf_map__fd(skel_->maps.xsks);
}

} // namespace knod::bpf
