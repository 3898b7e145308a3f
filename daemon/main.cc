// knod-policyd: wires the policy, keys, journal and driver to the bus, then runs the event loop.
#include "daemon/binding_manager.h"
#include "daemon/bus/bus_service.h"
#include "daemon/bus/guard.h"
#include "daemon/bus/pod_socket.h"
#include "daemon/driver/devmem_driver.h"
#include "daemon/driver/knod_driver.h"
#include "daemon/driver/no_driver.h"
#include "daemon/driver/selection.h"
#include "daemon/driver/sim_driver.h"
#include "daemon/fd_store.h"
#include "daemon/state_dir.h"
#include "host/kernel_features.h"
#include "host/link_monitor.h"
#include "knod/file_lock.h"
#include "policy/parser.h"
#include "protocol/names.h"
#include "protocol/pod_spool.h"

#include <CLI/CLI.hpp>
#include <net/if.h>
#include <signal.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>

#include <deque>
#include <mutex>

// A start refused for its configuration (policy, state dir, options): restarting cannot help,
// and the unit's RestartPreventExitStatus= names this (EX_CONFIG, sysexits.h).
constexpr int exit_config = 78;

namespace {

struct Options {
    std::string bus = "system";
    std::string bus_address;
    std::vector<std::string> policy = {"/etc/knod"};
    std::string state_dir = "/var/lib/knod-policy";
    std::string driver = "auto";
    knod::driver::SimConfig sim;
    double rate = 50;
    int refusal_window = 10;
    bool journald = true;
    bool linux_audit = true;
    std::string retain;
    std::int64_t retain_events = 0;
    int snapshot_interval = 10;
    std::string keep_bindings = "auto";
    std::string cni_spool = knod::pod_spool::default_dir;
    std::string pod_socket; // empty: no pod socket
    knod::bus::PodSocketLimits pod_limits;
    unsigned pod_reclaim_seconds = 30;
    knod::host::HostPaths host;
    knod::bus::CallerLimits limits;
    std::size_t max_bindings = knod::daemon::ManagerConfig{}.max_bindings;
    std::size_t max_grants_in_flight = knod::daemon::ManagerConfig{}.max_grants_in_flight;
};

void log(const std::string &line) {
    std::cerr << line << std::endl;
}

// The drivers' view of sd-event: readable fds call back.
class SdEventLoop : public knod::driver::EventLoop {
  public:
    explicit SdEventLoop(sd_event *e) : event_(e) {}
    knod::Result<void> watch(int fd, std::function<void()> fn) override {
        auto cb = std::make_unique<std::function<void()>>(std::move(fn));
        sd_event_source *src = nullptr;
        int r = sd_event_add_io(
            event_, &src, fd, EPOLLIN,
            [](sd_event_source *, int, uint32_t, void *ud) -> int {
                return knod::bus::guarded("event", nullptr, [ud] {
                    (*static_cast<std::function<void()> *>(ud))();
                    return 0;
                });
            },
            cb.get());
        if (r < 0)
            return knod::make_error(knod::Errc::driver_failure,
                                    "cannot watch fd: " + std::string(std::strerror(-r)));
        sources_[fd] = {knod::bus::SourcePtr(src), std::move(cb)};
        return {};
    }
    void unwatch(int fd) override { sources_.erase(fd); }

    // Runs `fn` on the loop thread, from any thread: a queue and an eventfd that wakes the loop.
    knod::Result<void> start_posting() {
        wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!wake_.valid()) return knod::make_error(knod::Errc::io, "eventfd failed");
        return watch(wake_.get(), [this] {
            std::uint64_t n;
            (void)!read(wake_.get(), &n, sizeof n);
            std::deque<std::function<void()>> ready;
            {
                std::lock_guard lock(mu_);
                ready.swap(posted_);
            }
            for (auto &fn : ready)
                fn();
        });
    }
    void post(std::function<void()> fn) {
        {
            std::lock_guard lock(mu_);
            posted_.push_back(std::move(fn));
        }
        std::uint64_t one = 1;
        (void)!write(wake_.get(), &one, sizeof one);
    }

  private:
    sd_event *event_;
    std::map<int, std::pair<knod::bus::SourcePtr, std::unique_ptr<std::function<void()>>>> sources_;
    knod::UniqueFd wake_;
    std::mutex mu_;
    std::deque<std::function<void()>> posted_;
};

knod::Result<knod::policy::Policy> load_policy(const std::vector<std::string> &paths) {
    // The same files `knod-policy check` and `explain` read for these paths.
    auto files = knod::policy::expand_policy_paths(paths);
    auto load = knod::policy::load_policy_files(files);
    if (!load.ok()) return knod::make_error(knod::Errc::invalid_policy, load.errors_text());
    for (auto &d : load.diagnostics)
        log(d.to_string());
    if (files.empty()) log("no policy files found: every request will be denied");
    return std::move(load.policy);
}

// The backend the options name; `auto` picks one and logs why.
knod::Result<std::unique_ptr<knod::driver::Driver>> open_driver(Options &o,
                                                                knod::driver::EventLoop *loop) {
    std::string which = o.driver;
    std::string reason = "--driver=none";
    if (which == "auto") {
        auto choice = knod::driver::choose_driver(o.host);
        log("driver auto: " + choice.driver + " (" + choice.reason + ")");
        which = choice.driver;
        reason = choice.reason;
    }
    if (which != "sim" && o.sim.guard != "auto")
        log("--sim-guard=" + o.sim.guard + " is ignored: the driver is " + which + ", not the sim");
    if (which == "knod") {
        auto d = knod::driver::KnodDriver::open(o.host);
        if (!d) return std::move(d).error().context("knod driver");
        return std::unique_ptr<knod::driver::Driver>(std::move(*d));
    }
    if (which == "devmem") {
        // What the guards and bind-rx need, named at start rather than at the first binding.
        for (auto &f : knod::host::probe_kernel_features(false))
            if (f.probe.missing() && (f.id == "bpf.prog.sched_cls" || f.id == "bpf.map.lpm_trie" ||
                                      f.id == "netdev.genl"))
                log("kernel: " + knod::host::describe_missing(f) + "; fix: " + f.fix);
        auto d = knod::driver::DevmemDriver::open(o.host, knod::driver::require_devmem_device,
                                                  o.sim.pin_root);
        if (!d) return std::move(d).error().context("devmem driver");
        return std::unique_ptr<knod::driver::Driver>(std::move(*d));
    }
    if (which == "none")
        return std::unique_ptr<knod::driver::Driver>(
            std::make_unique<knod::driver::NoDriver>(reason));
    auto sim = std::make_unique<knod::driver::SimDriver>(o.sim, loop);
    if (auto r = sim->start(); !r) return std::move(r).error().context("sim driver");
    if (auto note = sim->datapath_note(); !note.empty()) log(note);
    for (auto &note : sim->notes())
        log(note);
    return std::unique_ptr<knod::driver::Driver>(std::move(sim));
}

knod::Result<knod::bus::BusPtr> connect_bus(const Options &o) {
    sd_bus *raw = nullptr;
    int r = sd_bus_new(&raw);
    if (r < 0) return knod::make_error(knod::Errc::io, "sd_bus_new failed");
    knod::bus::BusPtr bus(raw);
    std::string address = o.bus_address;
    if (address.empty() && o.bus == "system") {
        const char *env = getenv("DBUS_SYSTEM_BUS_ADDRESS");
        address = env ? env : "unix:path=/run/dbus/system_bus_socket";
    } else if (address.empty()) {
        const char *env = getenv("DBUS_SESSION_BUS_ADDRESS");
        if (!env) return knod::make_error(knod::Errc::invalid_argument, "no session bus address");
        address = env;
    }
    sd_bus_set_address(bus.get(), address.c_str());
    sd_bus_set_bus_client(bus.get(), 1);
    // Untrusted: members without SD_BUS_VTABLE_UNPRIVILEGED stay root-only.
    sd_bus_set_trusted(bus.get(), 0);
    sd_bus_negotiate_creds(bus.get(), 1, SD_BUS_CREDS_EUID | SD_BUS_CREDS_PID);
    if ((r = sd_bus_start(bus.get())) < 0)
        return knod::make_error(knod::Errc::unavailable, "cannot connect to the bus at " + address +
                                                             ": " + std::strerror(-r));
    return bus;
}

// Reads the command line into `o`. Returns the exit code when the process stops here (--help,
// --version, bad usage).
std::optional<int> parse_options(int argc, char **argv, Options &o) {
    CLI::App app{"knod-policyd: the KNOD binding policy daemon. It owns org.knod.Policy1 on the "
                 "bus and controls every binding of a network device to GPU memory."};
    app.add_option("--bus", o.bus, "system or session")
        ->check(CLI::IsMember({"system", "session"}))
        ->capture_default_str();
    app.add_option("--bus-address", o.bus_address, "connect to this D-Bus address instead (tests)");
    app.add_option("--policy", o.policy,
                   "policy root directory (reads policy.toml and policy.d/*.toml, never names "
                   "starting with '.') or files, as knod-policy check reads them")
        ->capture_default_str();
    app.add_option("--state-dir", o.state_dir, "journal and key secret live here (mode 0700)")
        ->capture_default_str();
    app.add_option(
           "--driver", o.driver,
           "driver backend: knod, devmem, sim, none, or auto (knod, then devmem, else none: "
           "bindings are refused; never the sim; the log says which and why)")
        ->check(CLI::IsMember({"auto", "knod", "devmem", "sim", "none"}))
        ->capture_default_str();
    app.add_option("--sim-netdev", o.sim.netdev, "sim: the simulated NIC's name")
        ->capture_default_str();
    app.add_option("--sim-queues", o.sim.queues, "sim: RX queues (queue 0 is the normal stack)")
        ->capture_default_str();
    app.add_option("--sim-gpu", o.sim.gpu, "sim: the simulated GPU's name")->capture_default_str();
    app.add_option("--sim-vram", o.sim.vram_bytes, "sim: the simulated GPU's VRAM in bytes")
        ->capture_default_str();
    app.add_option("--sim-datapath", o.sim.datapath,
                   "sim: build the veth/XDP/AF_XDP data path (off: control half only)")
        ->capture_default_str();
    app.add_option("--sim-guard", o.sim.guard,
                   "sim: where the guard checks what the filter passed onto a bound RX queue: tc "
                   "(at tc ingress, handed the queue in XDP metadata: needs bpf_xdp_adjust_meta), "
                   "xdp (inside the XDP filter), or auto (tc where the kernel allows it, else "
                   "xdp; the log says which and why)")
        ->check(CLI::IsMember({"auto", "tc", "xdp"}))
        ->capture_default_str();
    app.add_option("--sim-netns", o.sim.netns, "sim: the wire side's network namespace")
        ->capture_default_str();
    app.add_option("--bpf-pin-root", o.sim.pin_root,
                   "where the flow filter (sim) or the devmem guards are pinned")
        ->capture_default_str();
    // NaN and infinity would pass a plain range check and switch the limit off.
    CLI::Validator rate_range(
        [](std::string &text) -> std::string {
            double v = 0;
            try {
                v = std::stod(text);
            } catch (...) {
                return "not a number: " + text;
            }
            return std::isfinite(v) && v > 0 && v <= 1e6 ? "" : "must be above 0, at most 1000000";
        },
        "above 0, at most 1000000");
    app.add_option("--rate-limit", o.rate,
                   "calls per second per uid (bursts of twice that; root is not limited)")
        ->capture_default_str()
        ->check(rate_range);
    app.add_option("--refusal-window", o.refusal_window,
                   "seconds: a user's repeated refusals of one kind are journaled once per window, "
                   "with a count")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600));
    app.add_option("--journald", o.journald, "copy events to the system journal")
        ->capture_default_str();
    app.add_option("--linux-audit", o.linux_audit,
                   "copy grants, denials and revocations to Linux audit")
        ->capture_default_str();
    app.add_option("--retain", o.retain,
                   "prune journal events older than this (e.g. 180d); default: keep all");
    app.add_option("--retain-events", o.retain_events, "keep at most this many journal events");
    app.add_option("--snapshot-interval", o.snapshot_interval,
                   "seconds: publish the auditors' copy of the journal (STATE_DIR/snapshot/) at "
                   "most this often after it changed (and at stop); 0: publish none (then only "
                   "root reads the journal)")
        ->capture_default_str()
        ->check(CLI::Range(0, 86400));
    app.add_option("--sysfs-root", o.host.sysfs,
                   "read sysfs here: IOMMU groups, PCI, /sys/class/knod (tests use fixture trees)")
        ->capture_default_str();
    app.add_option("--proc-root", o.host.proc, "read the kernel command line and config here")
        ->capture_default_str();
    app.add_option("--boot-root", o.host.boot, "look for the kernel's config-RELEASE here")
        ->capture_default_str();
    app.add_option("--rocm-root", o.host.rocm, "ROCm's install directory")->capture_default_str();
    app.add_option("--keep-bindings-on-restart", o.keep_bindings,
                   "on SIGTERM, hand live bindings to systemd's file-descriptor store and take "
                   "them back at the next start instead of ending them (auto: when NOTIFY_SOCKET "
                   "is set, i.e. under systemd)")
        ->check(CLI::IsMember({"auto", "true", "false"}))
        ->capture_default_str();
    app.add_option("--cni-spool", o.cni_spool,
                   "carry out the pod registrations and deletions knod-cni left here while "
                   "this daemon did not answer (at the start and every second; empty: none)")
        ->capture_default_str();
    app.add_option("--pod-socket", o.pod_socket,
                   "serve pods' processes on a socket at this path (peer-to-peer D-Bus, no bus "
                   "in between; only callers in a registered pod's network namespace are "
                   "served); empty: none")
        ->capture_default_str();
    app.add_option("--pod-reclaim-seconds", o.pod_reclaim_seconds,
                   "after a restart that kept bindings, how long a binding held over the pod "
                   "socket waits for its holder process to connect again (its connection closed "
                   "with the old daemon); then it ends as a disconnect. 0: it ends at the start")
        ->capture_default_str()
        ->check(CLI::Range(0u, 3600u));
    app.add_option("--max-pod-connections-per-pod", o.pod_limits.per_sandbox,
                   "connections of one pod sandbox on the pod socket; one more is closed")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--max-pod-connections", o.pod_limits.total,
                   "connections on the pod socket in all; one more is closed")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--max-connections-per-user", o.limits.connections_per_uid,
                   "connections of one uid the daemon remembers (credentials, subscription, "
                   "bindings); a call from one more is refused with LimitsExceeded")
        ->capture_default_str()
        ->check(CLI::Range(1, 65536));
    app.add_option("--max-connections", o.limits.connections,
                   "connections remembered in all (root's not counted)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--max-polkit-questions-per-user", o.limits.polkit_per_uid,
                   "polkit questions of one uid in flight (RevokeBinding, ReloadPolicy, Release of "
                   "another's binding)")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    app.add_option("--max-polkit-questions", o.limits.polkit,
                   "polkit questions in flight in all (each one of the daemon's pending replies "
                   "on the bus, 128 by default)")
        ->capture_default_str()
        ->check(CLI::Range(1, 100));
    app.add_option("--max-subscriptions-per-user", o.limits.subscriptions_per_uid,
                   "connections of one uid that may Subscribe")
        ->capture_default_str()
        ->check(CLI::Range(1, 65536));
    app.add_option("--max-subscriptions", o.limits.subscriptions,
                   "subscribed connections in all (root's not counted)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--max-bindings", o.max_bindings,
                   "live and in-flight bindings in all, root's too, and as many notifier pipes; "
                   "one more is refused with LimitsExceeded (so is one past the fd limit)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--max-grants-in-flight", o.max_grants_in_flight,
                   "grants waiting for the journal's commit in all")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    app.set_version_flag("--version", "knod-policyd " KNOD_VERSION);
    app.footer("Exit codes: 0 stopped cleanly; 78 (EX_CONFIG) configuration refused (invalid "
               "policy, unsafe state dir or files, an unreadable --retain; systemd does not "
               "restart it); 1 refused to start otherwise (bus name owned or refused, driver "
               "failure) or lost the bus; 2 bad usage or the bus unreachable (the message names "
               "the address tried).");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        // CLI11's own codes (109, 106...) mean nothing to scripts: usage errors are 2.
        return app.exit(e) == 0 ? 0 : 2;
    }
    return std::nullopt;
}

// What a signal, a tick or the bus's disconnect needs.
struct Loop {
    knod::daemon::BindingManager *manager = nullptr;
    knod::bus::BusService *service = nullptr;
    sd_event *event = nullptr;
    bool keep_bindings = false;
    bool confirmed = false; // confirm_remembered() has run (the first tick)
};

// Everything the daemon runs with, built in order by build() and torn down in reverse.
class Daemon {
  public:
    ~Daemon() { sd_event_source_unref(tick_); }
    // Builds and starts everything; nullopt when ready to run, else the exit code.
    std::optional<int> build(Options &o);
    // Serves until a signal or the bus's loss stops it; the exit code.
    int run();

  private:
    std::optional<knod::daemon::FdStore> fd_store_;
    std::optional<knod::FileLock> state_lock_;
    knod::bus::EventPtr event_;
    knod::bus::BusPtr bus_;
    std::unique_ptr<SdEventLoop> driver_loop_;
    std::unique_ptr<knod::driver::Driver> driver_;
    std::unique_ptr<knod::bus::BusService> service_;
    std::unique_ptr<knod::sinks::SinkQueue> sinks_;
    std::unique_ptr<knod::daemon::BindingManager> manager_;
    std::optional<knod::host::LinkMonitor> links_;
    // After the service and the manager: it goes first, and they outlive its connections.
    std::unique_ptr<knod::bus::PodSocket> pod_socket_;
    Loop loop_;
    sd_event_source *tick_ = nullptr;
};

std::optional<int> Daemon::build(Options &o) {
    // What systemd's fd store handed back, taken before anything else opens a descriptor or
    // starts a child.
    bool keep_bindings = o.keep_bindings == "true" ||
                         (o.keep_bindings == "auto" && knod::daemon::FdStore::available());
    if (keep_bindings && !knod::daemon::FdStore::available()) {
        std::cerr << "knod-policyd: --keep-bindings-on-restart needs systemd's NOTIFY_SOCKET and "
                     "a unit with FileDescriptorStoreMax=\n";
        return exit_config;
    }
    fd_store_.emplace(knod::daemon::FdStore::from_environment(keep_bindings));
    auto &fd_store = *fd_store_;

    auto policy = load_policy(o.policy);
    if (!policy) {
        std::cerr << policy.error().message
                  << "knod-policyd: refusing to start with an invalid policy\n";
        return exit_config;
    }
    // Everything the daemon creates is its own, whoever started it and with what umask: no one
    // else may write it, and only the state dir's group may read what is meant for it (the
    // journal's files; the key secret is 0600 whatever the umask).
    umask(027);
    if (auto dir = knod::daemon::prepare_state_dir(o.state_dir); !dir) {
        std::cerr << "knod-policyd: refusing to start: " << dir.error().message << "\n";
        return exit_config;
    }
    // One daemon per state dir, decided before anything is touched: a second one started by
    // mistake must not reconcile, rebuild or journal over the first. The lock is a 0600 file,
    // not the directory: a member of the state dir's group (an auditor) can open the directory
    // and would hold the lock against every start.
    auto state_lock = knod::FileLock::acquire(o.state_dir + "/daemon.lock", false);
    if (!state_lock) {
        std::cerr << "knod-policyd: "
                  << (state_lock.error().code == knod::Errc::unavailable
                          ? "another knod-policyd is running with state dir " + o.state_dir +
                                "; stop it first, or give this one its own --state-dir"
                          : state_lock.error().message)
                  << "\n";
        return 1;
    }
    state_lock_.emplace(std::move(*state_lock));
    // The live journal and the key secret are the daemon's alone: a reader of a WAL database
    // can lock bytes of its -shm that every commit needs (#33). The auditors (the state dir's
    // group; knod-audit when packaged) read the snapshot the daemon publishes instead.
    auto state_files = knod::daemon::check_state_files(o.state_dir,
                                                       {{"journal.db", 0600},
                                                        {"journal.db-wal", 0600},
                                                        {"journal.db-shm", 0600},
                                                        {"journal.db.anchor", 0600},
                                                        {"journal.db.snapshot-work", 0600},
                                                        {"key-secret", 0600},
                                                        {"daemon.lock", 0600}},
                                                       "journal.db");
    if (!state_files) {
        std::cerr << "knod-policyd: refusing to start: " << state_files.error().message << "\n";
        return exit_config;
    }
    for (auto &note : *state_files)
        std::cerr << "knod-policyd: " << note << "\n";
    auto snapshot_mode = o.snapshot_interval > 0 ? knod::daemon::prepare_snapshot_dir(o.state_dir)
                                                 : knod::Result<mode_t>(mode_t{0600});
    if (!snapshot_mode) {
        std::cerr << "knod-policyd: refusing to start: " << snapshot_mode.error().message << "\n";
        return exit_config;
    }
    // Publishing off: a copy an earlier run left would go on being read as the journal.
    if (o.snapshot_interval == 0)
        for (const char *name : {"journal.db", "journal.db.anchor", "journal.db-journal"})
            if (std::string stale = o.state_dir + "/snapshot/" + name; ::unlink(stale.c_str()) == 0)
                std::cerr << "knod-policyd: --snapshot-interval 0: removed the old snapshot file "
                          << stale << "\n";
    auto keys = knod::keys::KeyAuthority::open(o.state_dir + "/key-secret");
    if (!keys) {
        std::cerr << "knod-policyd: " << keys.error().message << "\n";
        return 1;
    }

    // Each binding holds its region fd and its holder's pidfd: allow as many as we may.
    struct rlimit files {};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    // What callers make the daemon hold (regions, pidfds, notifier pipes) stays below the fd
    // limit, with 1024 left for the daemon itself (bus, journal, netlink, AF_XDP sockets, BPF
    // maps): past the limit a grant would fail somewhere deep, or a holder go unwatched.
    std::size_t caller_fds = 0;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
        caller_fds = files.rlim_cur > 2048 ? files.rlim_cur - 1024 : files.rlim_cur / 2;

    // SIGTERM, SIGINT and SIGHUP were blocked first thing in main(); the loop's signal sources
    // take them (and any that came during start-up) from here on.
    signal(SIGPIPE, SIG_IGN);

    sd_event *ev_raw = nullptr;
    sd_event_default(&ev_raw);
    event_.reset(ev_raw);
    auto &event = event_;
    auto connected = connect_bus(o);
    if (!connected) {
        std::cerr << "knod-policyd: " << connected.error().message << "\n";
        return connected.error().code == knod::Errc::unavailable ? 2 : 1;
    }
    bus_ = std::move(*connected);
    auto *bus = &bus_;
    sd_bus_attach_event(bus->get(), event.get(), SD_EVENT_PRIORITY_NORMAL);
    // The name before the network, BPF or journal: a second daemon on the same bus stops here.
    // Calls that arrive before the vtables exist wait in the queue until the loop runs.
    if (int rc = sd_bus_request_name(bus->get(), knod::bus::service_name, 0); rc < 0) {
        std::cerr << "knod-policyd: cannot own " << knod::bus::service_name << ": "
                  << std::strerror(-rc)
                  << (rc == -EEXIST ? " (another knod-policyd serves this bus; stop it first)"
                                    : " (does the bus policy let this user own the name?)")
                  << "\n";
        return 1;
    }

    driver_loop_ = std::make_unique<SdEventLoop>(event.get());
    auto &driver_loop = *driver_loop_;
    o.sim.drop_unmatched =
        policy->settings.unmatched_traffic == knod::policy::UnmatchedTraffic::drop;
    auto opened = open_driver(o, &driver_loop);
    if (!opened) {
        std::cerr << "knod-policyd: " << opened.error().message << "\n";
        return 1;
    }
    driver_ = std::move(*opened);
    knod::driver::Driver &driver = *driver_;
    auto paths = o.policy;
    service_ = std::make_unique<knod::bus::BusService>(bus->get(), o.limits);
    auto &service = *service_;
    knod::daemon::ManagerConfig config;
    config.journal_path = o.state_dir + "/journal.db";
    config.requests_per_second = o.rate;
    config.request_burst = o.rate * 2;
    config.max_bindings = o.max_bindings;
    config.max_grants_in_flight = o.max_grants_in_flight;
    config.max_notifiers = o.max_bindings; // one per binding at most: the same bound
    config.max_caller_fds = caller_fds;
    config.refusal_window = std::chrono::seconds(o.refusal_window);
    if (!o.retain.empty()) {
        auto age = knod::policy::parse_duration(o.retain);
        if (!age) {
            std::cerr << "knod-policyd: --retain: cannot read duration '" << o.retain << "'\n";
            return exit_config;
        }
        config.retain_age = *age;
    }
    if (o.retain_events > 0) config.retain_events = o.retain_events;
    config.snapshot_interval = std::chrono::seconds(o.snapshot_interval);
    config.snapshot_mode = *snapshot_mode;
    config.host = o.host;
    std::vector<std::unique_ptr<knod::sinks::Sink>> sink_list;
    if (o.journald) sink_list.push_back(std::make_unique<knod::sinks::JournaldSink>());
    if (o.linux_audit)
        if (auto audit = knod::sinks::LinuxAuditSink::open()) sink_list.push_back(std::move(audit));
    sinks_ = std::make_unique<knod::sinks::SinkQueue>(std::move(sink_list));
    auto &sinks = *sinks_;
    if (auto p = driver_loop.start_posting(); !p) {
        std::cerr << "knod-policyd: " << p.error().message << "\n";
        return 1;
    }
    manager_ = std::make_unique<knod::daemon::BindingManager>(
        config, driver, std::move(*keys), std::move(*policy), service,
        [&driver_loop](std::function<void()> fn) { driver_loop.post(std::move(fn)); });
    auto &manager = *manager_;
    manager.set_sinks(&sinks);
    manager.set_event_loop(&driver_loop);
    manager.set_policy_loader([paths] { return load_policy(paths); });
    // A link that goes down or away takes its bindings with it. A deleted link is reported down
    // before it is gone: "down" is judged again 200 ms later (a down link delivers nothing
    // meanwhile), so a removal is recorded as link-removed.
    struct DownCheck {
        knod::daemon::BindingManager *manager;
        std::string ifname;
    };
    auto links = knod::host::LinkMonitor::open(
        [&manager, &event](const std::string &ifname, const std::string &why) {
            if (!manager.driver().netdevs_are_links()) return;
            auto reason = why == "link-removed" ? knod::daemon::EndReason::link_removed
                                                : knod::daemon::EndReason::link_down;
            if (reason != knod::daemon::EndReason::link_down)
                return manager.netdev_gone(ifname, reason);
            auto *check = new DownCheck{&manager, ifname};
            auto later = [](sd_event_source *src, uint64_t, void *ud) -> int {
                std::unique_ptr<DownCheck> c(static_cast<DownCheck *>(ud));
                c->manager->netdev_gone(c->ifname, if_nametoindex(c->ifname.c_str()) == 0
                                                       ? knod::daemon::EndReason::link_removed
                                                       : knod::daemon::EndReason::link_down);
                sd_event_source_unref(src);
                return 0;
            };
            uint64_t now = 0;
            sd_event_now(event.get(), CLOCK_MONOTONIC, &now);
            sd_event_source *src = nullptr; // unreferenced by `later` when it has run
            if (sd_event_add_time(event.get(), &src, CLOCK_MONOTONIC, now + 200'000, 10'000, later,
                                  check) < 0) {
                delete check;
                manager.netdev_gone(ifname, reason);
            }
        });
    if (!links) {
        std::cerr << "knod-policyd: " << links.error().message << "\n";
        return 1;
    }
    links_.emplace(std::move(*links));
    if (auto w = driver_loop.watch(links_->fd(), [this] { links_->drain(); }); !w) {
        std::cerr << "knod-policyd: " << w.error().message << "\n";
        return 1;
    }
    if (auto r = manager.apply_settings(); !r) {
        std::cerr << "knod-policyd: " << r.error().message << "\n";
        return 1;
    }
    if (fd_store.enabled()) manager.set_handle_store(&fd_store);
    // The objects before the start: bindings taken back are watched and shown through them.
    // Calls wait in the queue until the loop runs.
    service.set_pod_reclaim(std::chrono::seconds(o.pod_socket.empty() ? 0 : o.pod_reclaim_seconds));
    if (auto r = service.start(manager, o.cni_spool); !r) {
        std::cerr << "knod-policyd: " << r.error().message << "\n";
        return 1;
    }
    manager.start();
    service.check_connections();
    if (std::size_t stale = fd_store.discard_untaken())
        log("discarded " + std::to_string(stale) + " stored fd(s) no binding took back");
    // Pods started while no daemon answered become theirs now (and again on every tick).
    service.admission().consume_spool();
    // Pods reach the daemon here, once it knows their sandboxes (the spool, a restart's).
    if (!o.pod_socket.empty()) {
        auto pods = knod::bus::PodSocket::listen(o.pod_socket, event.get(), service, o.pod_limits);
        if (!pods) {
            std::cerr << "knod-policyd: " << pods.error().message << "\n";
            return pods.error().code == knod::Errc::invalid_argument ? exit_config : 1;
        }
        pod_socket_ = std::move(*pods);
    }
    if (std::size_t n = manager.bindings().size())
        log("took back " + std::to_string(n) + " binding(s) from before the restart");
    if (!fd_store.last_error().empty()) log("knod-policyd: " + fd_store.last_error());
    if (auto pruned = manager.apply_retention(); pruned && *pruned > 0)
        log("journal retention pruned " + std::to_string(*pruned) + " event(s)");

    loop_ = Loop{&manager, &service, event.get(), fd_store.enabled()};
    auto &loop = loop_;
    auto on_signal = [](sd_event_source *s, const struct signalfd_siginfo *si, void *ud) -> int {
        return knod::bus::guarded("signal", nullptr, [&] {
            auto *l = static_cast<Loop *>(ud);
            if (si->ssi_signo == SIGHUP) {
                // The sender's uid and pid, from the kernel, are the reload's actor.
                knod::daemon::Peer by;
                by.uid = si->ssi_uid;
                by.pid = static_cast<pid_t>(si->ssi_pid);
                // Only a process allowed to signal the daemon sent it (root, or the daemon's
                // own user: never a container's, which cannot see it): the host's, as a
                // refusal record (one by one) goes.
                by.host_namespaces = true;
                auto r = l->manager->reload(by, "SIGHUP");
                log(r ? "policy reloaded; " + std::to_string(*r) + " binding(s) revoked"
                      : "policy reload refused, keeping the old policy:\n" + r.error().message);
                return 0;
            }
            if (l->keep_bindings) {
                // A restart (or a stop: then systemd discards the store, the kernel closes the
                // handles, and the next start ends the sessions as daemon-restart).
                (void)knod::daemon::notify_nowait(
                    "STOPPING=1\nSTATUS=Handing live bindings to the fd store");
                std::size_t n = l->manager->hand_off();
                log("handed " + std::to_string(n) + " binding(s) to systemd's fd store");
            } else {
                (void)knod::daemon::notify_nowait("STOPPING=1\nSTATUS=Releasing every binding");
                l->manager->shutdown();
            }
            return sd_event_exit(sd_event_source_get_event(s), 0);
        });
    };
    for (int sig : {SIGTERM, SIGINT, SIGHUP})
        sd_event_add_signal(event.get(), nullptr, sig, on_signal, &loop);
    // Off the bus (dbus-daemon gone, or it dropped us) nobody can reach us or release: end every
    // binding as on SIGTERM and exit non-zero, so systemd restarts the daemon and says why.
    auto on_disconnect = [](sd_bus_message *, void *ud, sd_bus_error *) -> int {
        return knod::bus::guarded("bus disconnect", nullptr, [&] {
            auto *l = static_cast<Loop *>(ud);
            log("knod-policyd: lost the connection to the bus; ending every binding and exiting");
            (void)knod::daemon::notify_nowait(
                "STOPPING=1\nSTATUS=Lost the bus; releasing every binding");
            l->manager->shutdown();
            return sd_event_exit(l->event, 2);
        });
    };
    if (int rc = sd_bus_match_signal(bus->get(), nullptr, "org.freedesktop.DBus.Local",
                                     "/org/freedesktop/DBus/Local", "org.freedesktop.DBus.Local",
                                     "Disconnected", on_disconnect, &loop);
        rc < 0) {
        std::cerr << "knod-policyd: cannot watch the bus connection: " << std::strerror(-rc)
                  << "\n";
        return 1;
    }

    auto on_tick = [](sd_event_source *s, uint64_t usec, void *ud) -> int {
        sd_event_source_set_time(s, usec + 1'000'000);
        return knod::bus::guarded("tick", nullptr, [ud, usec] {
            auto *l = static_cast<Loop *>(ud);
            if (!l->confirmed) {
                // Calls queued before the bus applied the daemon's match have been served by
                // now; their connections may have left unseen.
                l->service->confirm_remembered();
                l->confirmed = true;
            }
            l->manager->tick(knod::journal::now_us());
            l->service->reclaim_tick();
            knod::daemon::watchdog_tick(usec); // never waits for PID 1 (fd_store.h)
            l->service->admission().consume_spool();
            return 0;
        });
    };
    uint64_t now = 0;
    sd_event_now(event.get(), CLOCK_MONOTONIC, &now);
    auto &tick = tick_;
    sd_event_add_time(event.get(), &tick, CLOCK_MONOTONIC, now + 1'000'000, 100'000, on_tick,
                      &loop);
    sd_event_source_set_enabled(tick, SD_EVENT_ON);

    std::string status = "Serving org.knod.Policy1 with the " + driver.name() + " driver, " +
                         std::to_string(manager.policy().rules.size()) + " rule(s)";
    if (auto why = driver.unavailable()) status += "; refusing bindings: " + *why;
    log(status);
    sd_notifyf(0, "READY=1\nSTATUS=%s", status.c_str());
    return std::nullopt;
}

int Daemon::run() {
    int r = sd_event_loop(event_.get());
    sd_event_source_unref(tick_);
    tick_ = nullptr;
    if (r < 0) log("knod-policyd: event loop failed: " + std::string(std::strerror(-r)));
    return r == 0 ? 0 : 1;
}

} // namespace

// Options, then everything built in order, then the loop.
int main(int argc, char **argv) {
    // Before anything else: a SIGHUP (a config tool's reload) or SIGTERM while the policy loads
    // would otherwise kill the daemon, and systemd counts death by SIGHUP as a clean exit. Once
    // blocked they wait for the event loop's signal sources.
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : {SIGTERM, SIGINT, SIGHUP})
        sigaddset(&mask, sig);
    sigprocmask(SIG_BLOCK, &mask, nullptr);
    Options o;
    if (auto code = parse_options(argc, argv, o)) return *code;
    Daemon daemon;
    if (auto code = daemon.build(o)) return *code;
    return daemon.run();
}
