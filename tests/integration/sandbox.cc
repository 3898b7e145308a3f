#include "tests/integration/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace knod::test {

void exec_argv(const std::vector<std::string> &argv) {
    std::vector<char *> args;
    for (auto &a : argv)
        args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
}

namespace {

pid_t spawn(const std::vector<std::string> &argv, int stdin_fd = -1, int stdout_fd = -1,
            const std::string &stderr_path = {}) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (stdin_fd >= 0) dup2(stdin_fd, 0);
    if (stdout_fd >= 0) dup2(stdout_fd, 1);
    if (!stderr_path.empty()) {
        int fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) dup2(fd, 2);
    }
    exec_argv(argv);
}

std::vector<std::string> as_uid(uid_t uid, std::vector<std::string> argv) {
    if (uid == 0) return argv;
    std::vector<std::string> out = {"setpriv", "--reuid=" + std::to_string(uid),
                                    "--regid=" + std::to_string(uid), "--clear-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
}

} // namespace

std::string dbus_broker_missing() {
    const char *dir = getenv("KNOD_DBUS_BROKER_DIR");
    std::string launcher = std::string(dir ? dir : "/var/cache/knod-policy/dbus-broker") +
                           "/usr/bin/dbus-broker-launch";
    if (::access(launcher.c_str(), X_OK) != 0)
        return "no " + launcher + " (scripts/fetch-dbus-broker.sh fetches it)";
    if (::access("/usr/bin/systemd-socket-activate", X_OK) != 0)
        return "no systemd-socket-activate (package systemd)";
    return {};
}

Sandbox::Sandbox(const std::string &policy_text, std::vector<std::string> daemon_args,
                 uid_t daemon_uid, bool start, BusKind bus)
    : daemon_args_(std::move(daemon_args)), daemon_uid_(daemon_uid) {
    char tmpl[] = "/tmp/knod-test.XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755); // other uids reach the bus socket
    state_dir_ = dir_ + "/state";
    write_policy(policy_text);
    std::string conf = slurp(KNOD_SOURCE_DIR "/scripts/private-bus.conf.in");
    auto replace = [&](const std::string &from, const std::string &to) {
        conf.replace(conf.find(from), from.size(), to);
    };
    replace("@SOCKET@", dir_ + "/bus");
    replace("@POLICY_CONF@", KNOD_SOURCE_DIR "/packaging/dbus/org.knod.Policy1.conf");
    if (daemon_uid_ != 0) {
        // The daemon's own user may own the name, as knod-policy may on the system bus (the bus
        // takes user names only).
        struct passwd *pw = getpwuid(daemon_uid_);
        if (!pw) throw std::runtime_error("the daemon's uid needs a user name for the bus policy");
        replace("</busconfig>", "  <policy user=\"" + std::string(pw->pw_name) +
                                    "\"><allow own=\"org.knod.Policy1\"/></policy>\n</busconfig>");
        mkdir(state_dir_.c_str(), 0700);
        if (chown(state_dir_.c_str(), daemon_uid_, daemon_uid_) != 0)
            throw std::runtime_error("chown " + state_dir_);
    }
    std::ofstream(dir_ + "/bus.conf") << conf;
    if (bus == BusKind::dbus_broker)
        bus_pid_ = spawn({KNOD_SOURCE_DIR "/tests/tools/dbus-broker-bus.sh", dir_ + "/bus.conf",
                          dir_ + "/bus", dir_},
                         -1, -1, dir_ + "/bus.log");
    else
        bus_pid_ = spawn({"dbus-daemon", "--config-file=" + dir_ + "/bus.conf", "--nofork"}, -1, -1,
                         dir_ + "/bus.log");
    if (!eventually([&] { return fs::exists(dir_ + "/bus"); }))
        throw std::runtime_error("the bus did not start: " + slurp(dir_ + "/bus.log"));
    setenv("DBUS_SYSTEM_BUS_ADDRESS", address().c_str(), 1);
    try {
        if (start) start_daemon();
    } catch (...) {
        // No destructor runs for a half-built sandbox: stop the bus here.
        kill(bus_pid_, SIGTERM);
        waitpid(bus_pid_, nullptr, 0);
        if (!getenv("KNOD_TEST_KEEP")) {
            std::error_code ec;
            fs::remove_all(dir_, ec);
        }
        throw;
    }
}

Sandbox::~Sandbox() {
    // SIGTERM, so the daemon takes down what it built (sim namespace, links, pins).
    if (daemon_pid_ > 0) stop_daemon(SIGTERM);
    if (bus_pid_ > 0) {
        kill(bus_pid_, SIGTERM);
        waitpid(bus_pid_, nullptr, 0);
    }
    if (getenv("KNOD_TEST_KEEP")) return;
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

void Sandbox::write_policy(const std::string &text) const {
    std::ofstream(policy_file()) << text;
}

void Sandbox::start_daemon(const std::vector<std::string> &once) {
    // KNOD_TEST_DAEMON: another build of the daemon (an older one, to see a test fail on it).
    const char *bin = getenv("KNOD_TEST_DAEMON");
    std::vector<std::string> argv = {bin && *bin ? bin : KNOD_DAEMON_BIN,
                                     "--bus-address=" + address(),
                                     "--policy",
                                     policy_file(),
                                     "--state-dir",
                                     state_dir_};
    // The sim unless a test picks a driver: `auto` could find real hardware on a developer's box.
    if (std::none_of(daemon_args_.begin(), daemon_args_.end(),
                     [](const std::string &a) { return a.rfind("--driver", 0) == 0; }))
        argv.push_back("--driver=sim");
    // Control-plane tests run in parallel: no sim network unless a test asks for its own.
    if (std::find(daemon_args_.begin(), daemon_args_.end(), "--sim-datapath=true") ==
        daemon_args_.end())
        argv.push_back("--sim-datapath=false");
    argv.insert(argv.end(), daemon_args_.begin(), daemon_args_.end());
    argv.insert(argv.end(), once.begin(), once.end());
    // KNOD_TEST_SIM_GUARD=tc|xdp: the sim's guard path forced for every sim data path a test
    // builds (the suite and vm.sim run the data path tests once per path); a test that names
    // --sim-guard itself keeps its own.
    const char *guard = getenv("KNOD_TEST_SIM_GUARD");
    if (guard && *guard &&
        std::find(argv.begin(), argv.end(), "--sim-datapath=true") != argv.end() &&
        std::find(argv.begin(), argv.end(), "--driver=sim") != argv.end() &&
        std::none_of(daemon_args_.begin(), daemon_args_.end(),
                     [](const std::string &a) { return a.rfind("--sim-guard", 0) == 0; }))
        argv.push_back(std::string("--sim-guard=") + guard);
    if (daemon_uid_ != 0) {
        // packaging/systemd/knod-policyd.service: AmbientCapabilities and CapabilityBoundingSet.
        const std::string caps = "+net_admin,+bpf,+perfmon,+sys_ptrace,+audit_write";
        std::string id = std::to_string(daemon_uid_);
        argv.insert(argv.begin(), {"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups",
                                   "--inh-caps=-all," + caps, "--ambient-caps=-all," + caps,
                                   "--bounding-set=-all," + caps, "--no-new-privs"});
    }
    std::vector<int> fds = std::move(listen_fds_);
    std::vector<std::string> names = std::move(listen_names_);
    listen_fds_.clear();
    listen_names_.clear();
    if (!fds.empty()) // LISTEN_PID must be the daemon's own pid: the shell execs into it
        argv.insert(argv.begin(), {"sh", "-c", "LISTEN_PID=$$ exec \"$@\"", "sh"});
    daemon_pid_ = fork();
    if (daemon_pid_ == 0) {
        if (notify_socket_.empty())
            unsetenv("NOTIFY_SOCKET");
        else
            setenv("NOTIFY_SOCKET", notify_socket_.c_str(), 1);
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        unsetenv("LISTEN_PID");
        if (!fds.empty()) {
            // Out of the way first, then into place at 3, 4, ...
            std::vector<int> high;
            for (int fd : fds)
                high.push_back(fcntl(fd, F_DUPFD_CLOEXEC, 1000));
            std::string joined;
            for (std::size_t i = 0; i < high.size(); ++i) {
                dup2(high[i], 3 + static_cast<int>(i)); // dup2 clears FD_CLOEXEC
                joined += (i ? ":" : "") + names[i];
            }
            setenv("LISTEN_FDS", std::to_string(fds.size()).c_str(), 1);
            setenv("LISTEN_FDNAMES", joined.c_str(), 1);
        }
        int log = open((dir_ + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log >= 0) dup2(log, 2);
        exec_argv(argv);
    }
    // A daemon that exits (an option it refuses, a driver that cannot start) ends the wait at
    // once: nothing would answer later.
    bool exited = false;
    bool up = eventually(
        [&] {
            int status = 0;
            if (waitpid(daemon_pid_, &status, WNOHANG) == daemon_pid_) {
                exited = true;
                daemon_pid_ = -1;
                return true;
            }
            auto c = client::Client::connect(address());
            return c && c->status().ok();
        },
        5000);
    if (!up || exited)
        throw std::runtime_error(std::string("knod-policyd did not start") +
                                 (exited ? " (it exited)" : "") + ": " +
                                 slurp(dir_ + "/daemon.log"));
}

int Sandbox::stop_daemon(int sig) {
    int status = -1;
    if (daemon_pid_ <= 0) return status; // never kill(-1): none runs (it exited at its start)
    kill(daemon_pid_, sig);
    waitpid(daemon_pid_, &status, 0);
    daemon_pid_ = -1;
    return status;
}

client::Client Sandbox::client() const {
    auto c = client::Client::connect(address());
    if (!c) throw std::runtime_error(c.error().message);
    return std::move(*c);
}

Output Sandbox::run_client(const std::vector<std::string> &args, uid_t uid) const {
    return run_client_with(as_uid(uid, {}), args);
}

Output Sandbox::run_client_with(const std::vector<std::string> &prefix,
                                const std::vector<std::string> &args) const {
    std::vector<std::string> argv = prefix;
    argv.push_back(KNOD_TEST_CLIENT_BIN);
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, 0); // the prefix says who runs it
}

void Sandbox::kill_bus() {
    if (bus_pid_ <= 0) return;
    kill(bus_pid_, SIGKILL);
    waitpid(bus_pid_, nullptr, 0);
    bus_pid_ = -1;
}

int Sandbox::wait_daemon_exit(int ms) {
    int status = -1;
    if (daemon_pid_ <= 0) return status;
    bool gone =
        eventually([&] { return waitpid(daemon_pid_, &status, WNOHANG) == daemon_pid_; }, ms);
    if (!gone) return -1;
    daemon_pid_ = -1;
    return status;
}

Output Sandbox::run_program(const std::vector<std::string> &argv, uid_t uid) const {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return {};
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = spawn(as_uid(uid, argv), devnull, out[1], dir_ + "/client.log");
    close(out[1]);
    close(devnull);
    Output o;
    o.out = read_all(out[0]);
    close(out[0]);
    waitpid(pid, &o.status, 0);
    while (!o.out.empty() && o.out.back() == '\n')
        o.out.pop_back();
    return o;
}

std::string Sandbox::sql(const std::string &query) const {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return {};
    pid_t pid = spawn({"sqlite3", journal(), query}, -1, out[1]);
    close(out[1]);
    std::string s = read_all(out[0]);
    close(out[0]);
    waitpid(pid, nullptr, 0);
    while (!s.empty() && s.back() == '\n')
        s.pop_back();
    return s;
}

Holder::Holder(const Sandbox &s, const std::vector<std::string> &request, uid_t uid, bool activate)
    : Holder(s, as_uid(uid, {}), request, activate) {}

Holder::Holder(const Sandbox &s, const std::vector<std::string> &prefix,
               const std::vector<std::string> &request, bool activate) {
    std::vector<std::string> argv = prefix;
    argv.push_back(KNOD_TEST_CLIENT_BIN);
    argv.push_back(activate ? "hold-active" : "hold");
    argv.insert(argv.end(), request.begin(), request.end());
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = spawn(argv, in[0], out[1], s.dir() + "/client.log");
    close(in[0]);
    close(out[1]);
    stdin_fd_ = in[1];
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n')
        line_ += c;
    close(out[0]);
    std::istringstream fields(line_);
    std::string word;
    fields >> word >> id_ >> key_hex_;
    ok_ = word == "ok";
}

Holder::~Holder() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
}

void Holder::kill_now(int sig) {
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
}

std::string slurp(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

JournalLock::JournalLock(const Sandbox &s, int busy_timeout_ms) {
    // -bail: a BEGIN that fails ends sqlite3, so "locked" is printed only once it holds the lock.
    std::string said = s.dir() + "/journal-lock.out";
    // Emptied here, before the child starts: the child's own truncation races this wait, which
    // could otherwise read an earlier lock's "locked" (docs/testing.md, "A wait reads only what
    // its step wrote").
    std::ofstream(said, std::ios::trunc).close();
    sqlite_ = popen(("sqlite3 -bail " + s.journal() + " >" + said + " 2>&1").c_str(), "w");
    if (!sqlite_) return;
    fprintf(sqlite_, ".timeout %d\nBEGIN IMMEDIATE;\nSELECT 'locked';\n", busy_timeout_ms);
    fflush(sqlite_);
    held_ = eventually([&] { return slurp(said).find("locked") != std::string::npos; },
                       busy_timeout_ms);
    said_ = slurp(said);
}

void JournalLock::release() {
    if (!sqlite_) return;
    fputs("COMMIT;\n", sqlite_);
    pclose(sqlite_);
    sqlite_ = nullptr;
    held_ = false;
}

std::string read_all(int fd) {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        s.append(buf, static_cast<std::size_t>(n));
    return s;
}

int make_region(std::size_t size) {
    int fd = memfd_create("knod-test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        throw std::runtime_error("memfd");
    return fd;
}

TestPod::TestPod(const std::string &name, const std::string &k8s_namespace)
    : name_(name), k8s_namespace_(k8s_namespace) {
    made_ = std::system(("ip netns add " + name_ + " 2>/dev/null").c_str()) == 0;
}

TestPod::~TestPod() {
    if (made_) (void)!std::system(("ip netns del " + name_ + " 2>/dev/null").c_str());
}

std::string TestPod::register_with(const Sandbox &) const {
    if (!made_) return "ip netns add failed";
    sd_bus *bus = nullptr;
    if (sd_bus_open_system(&bus) < 0) return "cannot open the sandbox's bus";
    std::string said;
    auto call = [&](const char *member, const char *types, auto &&...args) {
        sd_bus_error e = SD_BUS_ERROR_NULL;
        sd_bus_message *reply = nullptr;
        int r = sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                   "org.knod.Policy1.Manager", member, &e, &reply, types, args...);
        if (r < 0)
            said += std::string(member) + ": " + (e.name ? e.name : "?") + ": " +
                    (e.message ? e.message : "") + "\n";
        sd_bus_error_free(&e);
        sd_bus_message_unref(reply);
    };
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        call("AttestProcess", "h", pair[0]);
        ::close(pair[0]);
        ::close(pair[1]);
    }
    int ns = ::open(path().c_str(), O_RDONLY | O_CLOEXEC);
    call("RegisterPod", "ssha{ss}a{ss}", name_.c_str(), "eth0", ns, 3, "namespace",
         k8s_namespace_.c_str(), "name", name_.c_str(), "uid", "0f0e0d0c", 0);
    if (ns >= 0) ::close(ns);
    sd_bus_flush_close_unref(bus);
    return said;
}

WatchedProcess::WatchedProcess(const std::vector<std::string> &argv) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        exec_argv(argv);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
}

WatchedProcess::~WatchedProcess() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    kill_now();
}

bool WatchedProcess::wait_for(const std::string &needle, int ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (out_.find(needle) == std::string::npos) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        end - std::chrono::steady_clock::now())
                        .count();
        if (left <= 0 || stdout_ < 0) return false;
        struct pollfd p = {stdout_, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
        char buf[4096];
        ssize_t n = read(stdout_, buf, sizeof buf);
        if (n <= 0) {
            close(stdout_);
            stdout_ = -1;
        } else {
            out_.append(buf, static_cast<std::size_t>(n));
        }
    }
    return true;
}

void WatchedProcess::kill_now() {
    if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
}

void WatchedProcess::signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
}

ForkedChild::~ForkedChild() {
    if (go >= 0) close(go);
    if (out >= 0) close(out);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
}

std::string ForkedChild::start(const std::function<bool()> &enter,
                               const std::function<void(FILE *, int)> &fn, uid_t uid) {
    int o[2], g[2];
    if (pipe2(o, O_CLOEXEC) != 0) return "pipe2";
    if (pipe2(g, O_CLOEXEC) != 0) {
        close(o[0]);
        close(o[1]);
        return "pipe2";
    }
    pid = fork();
    if (pid == 0) {
        close(o[0]);
        close(g[1]);
        FILE *w = fdopen(o[1], "w");
        setvbuf(w, nullptr, _IONBF, 0);
        if ((enter && !enter()) ||
            (uid != 0 && (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0))) {
            fprintf(w, "cannot enter\n");
            _exit(1);
        }
        fn(w, g[0]);
        _exit(0);
    }
    close(o[1]);
    close(g[0]);
    out = o[0];
    go = g[1];
    return pid > 0 ? "" : "fork";
}

bool ForkedChild::wait_for(const std::string &needle, int ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (said.find(needle) == std::string::npos) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        end - std::chrono::steady_clock::now())
                        .count();
        if (left <= 0 || out < 0) return false;
        struct pollfd p = {out, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
        char buf[4096];
        ssize_t n = read(out, buf, sizeof buf);
        if (n <= 0) {
            close(out);
            out = -1;
        } else {
            said.append(buf, static_cast<std::size_t>(n));
        }
    }
    return true;
}

void ForkedChild::proceed() {
    char b = 'g';
    (void)!write(go, &b, 1);
}

std::vector<std::string> TestPod::enter_as(uid_t uid) const {
    std::vector<std::string> argv = {"ip", "netns", "exec", name_};
    auto who = as_uid(uid, {});
    argv.insert(argv.end(), who.begin(), who.end());
    return argv;
}

std::function<bool()> TestPod::join() const {
    return [path = path()] {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        bool ok = fd >= 0 && ::setns(fd, CLONE_NEWNET) == 0;
        if (fd >= 0) ::close(fd);
        return ok;
    };
}

} // namespace knod::test
