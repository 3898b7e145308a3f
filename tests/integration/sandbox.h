// A private dbus-daemon (with the project's bus policy) and a knod-policyd on it, as real
// processes, for integration tests. Everything it starts is stopped and removed when it goes.
#pragma once

#include "client/client.h"

#include <sys/types.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace knod::test {

// In a forked child: runs argv (searched in PATH), or exits 127.
[[noreturn]] void exec_argv(const std::vector<std::string> &argv);

struct Output {
    int status = -1;
    std::string out;
};

// Which bus the sandbox runs: Debian 12's dbus-daemon 1.14 (no ProcessFD), or dbus-broker 37
// (ProcessFD; unpacked by scripts/fetch-dbus-broker.sh, run by tests/tools/dbus-broker-bus.sh).
enum class BusKind { dbus_daemon, dbus_broker };

// Whether dbus-broker can be run here (it was fetched); why not otherwise.
std::string dbus_broker_missing();

// The daemon gets `--driver=sim` unless a test names a driver, and `--sim-guard=VALUE` from
// KNOD_TEST_SIM_GUARD (tc or xdp: where the sim's guard runs) whenever it builds a sim data path
// and the test names no --sim-guard itself. A daemon that exits while starting ends the wait at
// once; start_daemon() then throws with its log (daemon_pid() is -1).
class Sandbox {
  public:
    // `daemon_uid` != 0: the daemon runs as that uid with exactly the capabilities the shipped
    // unit grants (AmbientCapabilities), in a state dir that uid owns, as under systemd.
    // `start`: start the daemon now (otherwise call start_daemon()).
    explicit Sandbox(const std::string &policy_text, std::vector<std::string> daemon_args = {},
                     uid_t daemon_uid = 0, bool start = true, BusKind bus = BusKind::dbus_daemon);
    ~Sandbox();

    const std::string &dir() const { return dir_; }
    std::string state_dir() const { return state_dir_; }
    std::string policy_file() const { return dir_ + "/policy.toml"; }
    std::string journal() const { return state_dir_ + "/journal.db"; }
    std::string address() const { return "unix:path=" + dir_ + "/bus"; }
    pid_t daemon_pid() const { return daemon_pid_; }

    // `once`: arguments for this start only (after the constructor's).
    void start_daemon(const std::vector<std::string> &once = {});
    // Playing systemd: the daemon gets NOTIFY_SOCKET=`path` (otherwise none, whatever the test
    // runner's environment says) ...
    void set_notify_socket(const std::string &path) { notify_socket_ = path; }
    // ... and, at its next start only, these fds as LISTEN_FDS (at 3, 4, ...) with
    // LISTEN_FDNAMES, LISTEN_PID its own pid. The fds stay the caller's.
    void pass_fds(std::vector<int> fds, std::vector<std::string> names) {
        listen_fds_ = std::move(fds);
        listen_names_ = std::move(names);
    }
    // Sends `sig` and waits for the daemon to exit; returns its wait status.
    int stop_daemon(int sig);
    client::Client client() const;
    void write_policy(const std::string &text) const;

    // Runs the test client once, as `uid` (via setpriv) when uid != 0.
    Output run_client(const std::vector<std::string> &args, uid_t uid = 0) const;
    // Runs any program once the same way (argv[0] is its path).
    Output run_program(const std::vector<std::string> &argv, uid_t uid = 0) const;
    // Kills the private dbus-daemon (the daemon loses its bus).
    void kill_bus();
    // Waits up to `ms` for the daemon to exit by itself; its wait status, or -1 if it did not.
    int wait_daemon_exit(int ms);
    // Runs `prefix` + the test client + `args` (prefix: a setpriv, a shell that moves itself
    // to a cgroup first...).
    Output run_client_with(const std::vector<std::string> &prefix,
                           const std::vector<std::string> &args) const;
    // Runs an SQL query on the journal with the sqlite3 CLI; returns its output trimmed.
    std::string sql(const std::string &query) const;

  private:
    std::string dir_;
    std::string state_dir_;
    pid_t bus_pid_ = -1;
    pid_t daemon_pid_ = -1;
    std::vector<std::string> daemon_args_;
    uid_t daemon_uid_ = 0;
    std::string notify_socket_;
    std::vector<int> listen_fds_;
    std::vector<std::string> listen_names_;
};

// A process that holds a binding until stopped: the test client's "hold" command.
class Holder {
  public:
    // `activate`: the holder presents its own key (hold-active), so data flows to it.
    Holder(const Sandbox &s, const std::vector<std::string> &request, uid_t uid = 0,
           bool activate = false);
    // Run under `prefix` (which says who runs it and where: setpriv, ip netns exec, ...).
    Holder(const Sandbox &s, const std::vector<std::string> &prefix,
           const std::vector<std::string> &request, bool activate = false);
    ~Holder();
    bool ok() const { return ok_; }
    const std::string &line() const { return line_; }
    const std::string &id() const { return id_; }
    const std::string &key_hex() const { return key_hex_; }
    pid_t pid() const { return pid_; }
    void kill_now(int sig);

  private:
    pid_t pid_ = -1;
    int stdin_fd_ = -1;
    bool ok_ = false;
    std::string line_, id_, key_hex_;
};

// A process whose output is read as it comes (holders that wait for their end); killed when
// it goes.
class WatchedProcess {
  public:
    explicit WatchedProcess(const std::vector<std::string> &argv);
    ~WatchedProcess();
    WatchedProcess(const WatchedProcess &) = delete;
    WatchedProcess &operator=(const WatchedProcess &) = delete;
    // Reads until `needle` appears in the output (or it ends, or `ms` pass).
    bool wait_for(const std::string &needle, int ms = 30000);
    void kill_now();
    void signal(int sig) const;
    pid_t pid() const { return pid_; }
    const std::string &output() const { return out_; }

  private:
    pid_t pid_ = -1;
    int stdin_ = -1, stdout_ = -1;
    std::string out_;
};

// A forked child that runs `enter` (joins a pod's network namespace, or nothing: the host's),
// then, with `uid`, becomes that user, then runs `fn`; `fn` writes lines to its FILE and reads
// its fd to go on past a step (proceed(); EOF when the child goes). Killed when it goes.
struct ForkedChild {
    pid_t pid = -1;
    int out = -1; // what the child writes
    int go = -1;  // the parent's end of the child's steps
    std::string said;
    ForkedChild() = default;
    ForkedChild(const ForkedChild &) = delete;
    ForkedChild &operator=(const ForkedChild &) = delete;
    ~ForkedChild();
    // "" when started, else why not.
    std::string start(const std::function<bool()> &enter,
                      const std::function<void(FILE *, int)> &fn, uid_t uid = 0);
    // Reads until `needle` appears (or EOF, or `ms`).
    bool wait_for(const std::string &needle, int ms = 60000);
    void proceed(); // one step
};

// A pod sandbox for the daemon: a named network namespace (ip netns), registered as the node's
// CNI plugin registers one (RegisterPod, as the host's root, attested), removed when it goes.
class TestPod {
  public:
    TestPod(const std::string &name, const std::string &k8s_namespace);
    ~TestPod();
    TestPod(const TestPod &) = delete;
    TestPod &operator=(const TestPod &) = delete;
    std::string path() const { return "/run/netns/" + name_; }
    // "" when registered, else what the daemon said (on the bus DBUS_SYSTEM_BUS_ADDRESS names:
    // the sandbox's).
    std::string register_with(const Sandbox &s) const;
    // A prefix that runs the rest in the pod's network namespace as `uid`.
    std::vector<std::string> enter_as(uid_t uid) const;
    // Moves the calling process into the pod's network namespace (a forked child).
    std::function<bool()> join() const;

  private:
    std::string name_, k8s_namespace_;
    bool made_ = false;
};

// Waits until `pred` holds; returns whether it did. The deadline is `ms` but never less than
// min_wait_ms: a machine a neighbour loads runs 10x slower, and a condition that holds returns
// at once, so a long deadline costs nothing (docs/testing.md). Nothing here waits for a
// condition that must not hold: for those, send a positive fence after and wait for it.
inline constexpr int min_wait_ms = 30000;
template <typename Pred> bool eventually(Pred pred, int ms = min_wait_ms);

// A policy that lets anyone bind any sim NIC (knodsim*) on UDP ports 5000-5999.
inline const char *sim_policy = R"([[rule]]
name = "sim"
any_caller = true
netdevs = ["knodsim*"]
gpus = ["sim0"]
max_region = "1MiB"
flows = ["udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999"]
iommu = "any"
)";

// A sealed memfd of `size` bytes, as the sim's region.
int make_region(std::size_t size);

// Everything readable from `fd` until end of file.
std::string read_all(int fd);
// A whole file's bytes ("" when it cannot be read).
std::string slurp(const std::string &path);

// Another process (sqlite3) holding the journal's write lock (BEGIN IMMEDIATE) until release()
// or destruction. held() says whether it got it: its BEGIN went through, not merely started.
class JournalLock {
  public:
    explicit JournalLock(const Sandbox &s, int busy_timeout_ms = 10000);
    ~JournalLock() { release(); }
    JournalLock(const JournalLock &) = delete;
    JournalLock &operator=(const JournalLock &) = delete;
    bool held() const { return held_; }
    const std::string &output() const { return said_; }
    void release();

  private:
    FILE *sqlite_ = nullptr;
    std::string said_;
    bool held_ = false;
};

} // namespace knod::test

#include <algorithm>
#include <chrono>
#include <thread>

template <typename Pred> bool knod::test::eventually(Pred pred, int ms) {
    auto end = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(std::max(ms, knod::test::min_wait_ms));
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
}
