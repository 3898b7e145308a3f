// knod-cni: a chained CNI plugin (spec 1.0.0; VERSION answers every version up to 1.1.0) that
// tells the node's knod-policyd which pod each sandbox is, so that the policy can name pods.
//
//   ADD    registers the sandbox: its container id and ifname, an fd of its network namespace
//          (CNI_NETNS), the pod's namespace, name and UID (CNI_ARGS: K8S_POD_NAMESPACE,
//          K8S_POD_NAME, K8S_POD_UID), and its annotations under knod.io/ (runtimeConfig
//          "io.kubernetes.cri.pod-annotations"; no other annotation leaves the plugin). A pod
//          that asks for offload (knod.io/flows) is checked against the policy at once: a denial
//          fails the sandbox, naming the deciding rule. prevResult is printed unchanged.
//          The pod's name is K8S_POD_NAME (Kubernetes' pod name, or podman's container name:
//          [A-Za-z0-9][A-Za-z0-9_.-]*, at most 253 bytes), else the container id; a name that
//          is neither fails the ADD (error 4), as does any refusal of the registration by the
//          daemon: never a pod that starts unregistered.
//   DEL    unregisters it; the daemon ends every binding of the pod's processes (pod-deleted).
//   CHECK  registers again (a restarted daemon forgot its sandboxes), as ADD but printing
//          nothing.
//   STATUS succeeds: a pod that asks for nothing must never wait for the daemon.
//   GC     (CNI 1.1) unregisters every sandbox this network (the config's "name") registered
//          that "cni.dev/valid-attachments" no longer lists, ending its bindings as DEL does.
//          Without that list it collects nothing; without a daemon there is nothing to collect.
//   VERSION
//
// Nothing waits on the daemon without a deadline (issue 52): each command has a budget
// ("budgetMs" in the network configuration, default 2500 ms) that its D-Bus calls share. When
// the daemon does not answer in it (stopped, hung, not started yet), ADD and CHECK of a pod
// that asks for no offload, and DEL, leave the work in a root-only spool ("spoolDir", default
// /run/knod-cni; protocol/pod_spool.h) and succeed: the daemon carries it out when it answers,
// so the pod is that pod from then on. A pod that asks for offload gets 11 (try again later):
// its request cannot be decided in time, and the runtime retries the sandbox. A GC is 11 too
// unless the bus says no daemon runs (the runtime's next GC does it). Should the spool not take the
// entry, ADD and DEL are 11 as well: never success for work nobody will do.
//
// Errors follow the spec: exit 1 with {"cniVersion", "code", "msg", "details"} on stdout (1
// incompatible version, 4 invalid environment, 6 undecodable config, 7 invalid config, 11 try
// again later: the daemon is unreachable for a pod that asked for offload; 100 the policy
// refuses the pod; 101 the daemon refused the registration for another reason). Logs go to
// stderr. The daemon is found as every client finds it: the system bus
// (DBUS_SYSTEM_BUS_ADDRESS, or /run/dbus/system_bus_socket); see docs/kubernetes.md.
#include "knod/json.h"
#include "knod/untrusted.h"
#include "policy/policy.h"
#include "protocol/names.h"
#include "protocol/pod_spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

const std::vector<std::string> supported = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"};

struct CniError {
    int code;
    std::string msg, details;
};

std::string env(const char *name) {
    const char *v = std::getenv(name);
    return v ? v : "";
}

int fail(const std::string &version, const CniError &e) {
    std::cout << knod::dump_json(json{{"cniVersion", version.empty() ? "1.0.0" : version},
                                      {"code", e.code},
                                      {"msg", e.msg},
                                      {"details", e.details}})
              << std::endl;
    std::cerr << "knod-cni: " << e.msg << (e.details.empty() ? "" : ": " + e.details) << "\n";
    return 1;
}

// CNI_ARGS: "K=V;K=V".
std::map<std::string, std::string> cni_args(const std::string &text) {
    std::map<std::string, std::string> out;
    std::size_t at = 0;
    while (at <= text.size()) {
        std::size_t end = std::min(text.find(';', at), text.size());
        std::string pair = text.substr(at, end - at);
        if (auto eq = pair.find('='); eq != std::string::npos)
            out[pair.substr(0, eq)] = pair.substr(eq + 1);
        at = end + 1;
    }
    return out;
}

// The pod's annotations under the project's prefix, from the CRI runtime's runtimeConfig.
std::map<std::string, std::string> annotations_of(const json &config) {
    std::map<std::string, std::string> out;
    auto rc = config.find("runtimeConfig");
    if (rc == config.end() || !rc->is_object()) return out;
    auto ann = rc->find("io.kubernetes.cri.pod-annotations");
    if (ann == rc->end() || !ann->is_object()) return out;
    for (auto &[k, v] : ann->items())
        if (k.starts_with(knod::policy::pod_annotation_prefix) && v.is_string())
            out[k] = v.get<std::string>();
    return out;
}

// A string member of the network configuration: `fallback` when absent, nullopt when it is
// there but no string (the config is the admin's, but a wrong type must be an error, not a
// crash).
std::optional<std::string> string_field(const json &config, const char *key,
                                        const std::string &fallback = "") {
    auto it = config.find(key);
    if (it == config.end()) return fallback;
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
}

bool asks_for_offload(const std::map<std::string, std::string> &annotations) {
    return annotations.count(std::string(knod::policy::pod_annotation_prefix) + "flows") > 0;
}

struct Bus {
    sd_bus *bus = nullptr;
    ~Bus() { sd_bus_flush_close_unref(bus); }
};

// The command's budget: every call to the daemon gets what is left of it, never sd-bus's 25 s.
struct Budget {
    std::chrono::steady_clock::time_point deadline;
    std::uint64_t total_ms = 0;
    // Microseconds left (at least 1: sd-bus reads 0 as "its default").
    std::uint64_t left_us() const {
        auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        return left > 0 ? static_cast<std::uint64_t>(left) : 1;
    }
};

// The daemon's answer.
struct CallResult {
    bool reached = false; // the daemon answered (success or its own error)
    // Not reached because nothing serves the name (no daemon running, no bus): the call went
    // nowhere. Otherwise (a timeout) it may still be served when the daemon runs again.
    bool not_running = false;
    bool no_bus = false; // of those, the bus itself took no connection (it may be full)
    bool timed_out = false;
    std::string error_name, message;
    std::uint32_t ended = 0, collected = 0;
};

bool is_timeout(int r, const sd_bus_error &e) {
    return r == -ETIMEDOUT || sd_bus_error_has_name(&e, SD_BUS_ERROR_TIMEOUT) ||
           sd_bus_error_has_name(&e, SD_BUS_ERROR_NO_REPLY) ||
           sd_bus_error_has_name(&e, "org.freedesktop.DBus.Error.TimedOut");
}

bool is_not_running(const sd_bus_error &e) {
    return sd_bus_error_has_name(&e, SD_BUS_ERROR_SERVICE_UNKNOWN) ||
           sd_bus_error_has_name(&e, SD_BUS_ERROR_NAME_HAS_NO_OWNER);
}

CallResult call(const char *method, const std::function<int(sd_bus_message *)> &append,
                const Budget &budget) {
    CallResult out;
    Bus b;
    int r = sd_bus_open_system(&b.bus);
    if (r < 0) {
        out.not_running = out.no_bus = true;
        out.message = std::string("cannot connect to the system bus: ") + std::strerror(-r);
        return out;
    }
    // The bus's own Hello too waits at most what is left.
    (void)sd_bus_set_method_call_timeout(b.bus, budget.left_us());
    auto timed_out = [&] {
        out.timed_out = true;
        out.message = "knod-policyd did not answer within the budget of " +
                      std::to_string(budget.total_ms) + " ms";
        return out;
    };
    // Prove this process to the daemon first (AttestProcess with a socketpair end: the kernel
    // names its maker): only a proven host root may register pods. A refusal is the call's to
    // report; no answer in time, or no daemon, is the command's.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        sd_bus_error ae = SD_BUS_ERROR_NULL;
        sd_bus_message *am = nullptr, *ar = nullptr;
        int ar_r = sd_bus_message_new_method_call(b.bus, &am, knod::bus::service_name,
                                                  knod::bus::manager_path,
                                                  knod::bus::manager_interface, "AttestProcess");
        if (ar_r >= 0) ar_r = sd_bus_message_append(am, "h", pair[0]);
        if (ar_r >= 0) ar_r = sd_bus_call(b.bus, am, budget.left_us(), &ae, &ar);
        bool late = ar_r < 0 && is_timeout(ar_r, ae);
        bool nobody = ar_r < 0 && is_not_running(ae);
        std::string why = ae.message ? ae.message : "";
        sd_bus_error_free(&ae);
        sd_bus_message_unref(am);
        sd_bus_message_unref(ar);
        ::close(pair[0]);
        ::close(pair[1]);
        if (late) return timed_out();
        if (nobody) {
            out.not_running = true;
            out.message = "knod-policyd is not running: " + why;
            return out;
        }
    }
    sd_bus_message *m = nullptr;
    r = sd_bus_message_new_method_call(b.bus, &m, knod::bus::service_name, knod::bus::manager_path,
                                       knod::bus::manager_interface, method);
    if (r >= 0) r = append(m);
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = nullptr;
    if (r >= 0) r = sd_bus_call(b.bus, m, budget.left_us(), &e, &reply);
    sd_bus_message_unref(m);
    if (r < 0) {
        out.error_name = e.name ? e.name : "";
        out.message = e.message ? e.message : std::strerror(-r);
        // The daemon's own errors (and the bus refusing the call) mean it was reached.
        out.reached = out.error_name.starts_with("org.knod.Policy1.Error.") ||
                      out.error_name == "org.freedesktop.DBus.Error.AccessDenied";
        if (!out.reached) {
            out.not_running = is_not_running(e);
            if (is_timeout(r, e)) {
                sd_bus_error_free(&e);
                return timed_out();
            }
        }
    } else {
        out.reached = true;
        if (std::strcmp(method, "UnregisterPod") == 0) sd_bus_message_read(reply, "u", &out.ended);
        if (std::strcmp(method, "CollectPods") == 0)
            sd_bus_message_read(reply, "uu", &out.collected, &out.ended);
    }
    sd_bus_error_free(&e);
    sd_bus_message_unref(reply);
    return out;
}

// --- the spool (protocol/pod_spool.h) -------------------------------------------------------

struct Spool {
    std::string dir;
};

// The spool directory, made on first use: root's, 2770 with the daemon's group where the
// package made its account (the daemon runs as knod-policy and must read and remove entries),
// else 0700. An existing one must be root's and closed to others, as the daemon checks.
std::optional<std::string> spool_dir_ready(const std::string &dir) {
    if (::mkdir(dir.c_str(), 0700) == 0) {
        if (const struct group *g = ::getgrnam("knod-policy")) {
            if (::chown(dir.c_str(), 0, g->gr_gid) != 0 || ::chmod(dir.c_str(), 02770) != 0)
                return std::string("cannot give ") + dir +
                       " to the daemon's group: " + std::strerror(errno);
        }
    } else if (errno != EEXIST) {
        return "cannot make " + dir + ": " + std::strerror(errno);
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) return "cannot stat " + dir + ": " + std::strerror(errno);
    if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & S_IRWXO) != 0)
        return dir + " is not root's directory closed to others";
    return std::nullopt;
}

std::optional<json> read_entry(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() <= knod::pod_spool::max_entry_bytes)
        text.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    json j = knod::parse_json(text);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    return j;
}

// Leaves `entry` for the daemon (replacing an earlier entry of the same attachment). Returns
// why it could not.
std::optional<std::string> spool_write(const Spool &spool, const std::string &container,
                                       const std::string &ifname, const json &entry) {
    auto name = knod::pod_spool::entry_name(container, ifname);
    if (!name)
        return "the container id or ifname cannot name a spool entry (at most 128 and 15 "
               "bytes of [A-Za-z0-9_.-])";
    if (auto bad = spool_dir_ready(spool.dir)) return bad;
    std::string path = spool.dir + "/" + *name;
    // Bounded: a node's pods, far above; an entry replacing its own is no new one.
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        std::size_t n = 0;
        if (DIR *d = ::opendir(spool.dir.c_str())) {
            while (dirent *e = ::readdir(d))
                if (e->d_name[0] != '.') ++n;
            ::closedir(d);
        }
        if (n >= knod::pod_spool::max_entries)
            return spool.dir + " already holds " + std::to_string(n) +
                   " entries the daemon has not taken";
    }
    std::string text = knod::dump_json(entry);
    if (text.size() > knod::pod_spool::max_entry_bytes)
        return "the entry would exceed " + std::to_string(knod::pod_spool::max_entry_bytes) +
               " bytes";
    std::string tmp = spool.dir + "/.tmp-" + *name + "-" + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
              ::fsync(fd) == 0;
    int saved = errno;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        if (ok) saved = errno;
        ::unlink(tmp.c_str());
        return "cannot write " + path + ": " + std::strerror(saved);
    }
    return std::nullopt;
}

int append_map(sd_bus_message *m, const std::map<std::string, std::string> &values) {
    int r = sd_bus_message_open_container(m, 'a', "{ss}");
    for (auto &[k, v] : values)
        if (r >= 0) r = sd_bus_message_append(m, "{ss}", k.c_str(), v.c_str());
    return r < 0 ? r : sd_bus_message_close_container(m);
}

// The name the pod is known by, or why there is none: K8S_POD_NAME (a Kubernetes pod name,
// or podman's container name: `nifty_pasteur`, `MyInference`), else the container id.
std::optional<std::string> bad_pod_name(const std::string &name) {
    bool ok = !name.empty() && name.size() <= 253 &&
              std::isalnum(static_cast<unsigned char>(name[0])) &&
              std::all_of(name.begin(), name.end(), knod::pod_spool::name_char);
    if (ok) return std::nullopt;
    return knod::quote_untrusted(name, 64) +
           " is no pod name (1 to 253 bytes: a letter or digit, then letters, digits, '_', "
           "'.' and '-')";
}

std::optional<std::string> bad_namespace(const std::string &ns) {
    bool ok = !ns.empty() && ns.size() <= 63 && std::all_of(ns.begin(), ns.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    });
    if (ok) return std::nullopt;
    return knod::quote_untrusted(ns, 64) +
           " is no pod namespace (1 to 63 bytes of lowercase letters, digits, '-' and '.')";
}

// ADD, and CHECK (`check`: print nothing): register the sandbox. Registering again is
// harmless (the same container id and ifname replace their entry), so CHECK also restores a
// registration a restarted daemon forgot.
int add(const json &config, const std::string &version, const Budget &budget, const Spool &spool,
        bool check = false) {
    std::string container = env("CNI_CONTAINERID"), netns = env("CNI_NETNS"),
                ifname = env("CNI_IFNAME");
    if (container.empty() || netns.empty() || ifname.empty())
        return fail(version,
                    {4, "CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME are required for ADD", ""});
    if (auto prev = config.find("prevResult"); prev != config.end() && !prev->is_object())
        return fail(version, {7, "invalid network configuration", "prevResult must be an object"});
    auto args = cni_args(env("CNI_ARGS"));
    auto annotations = annotations_of(config);
    bool offload = asks_for_offload(annotations);
    std::map<std::string, std::string> pod;
    // Kubernetes names the pod; a runtime without it (podman) names only the container: the
    // conflist's "namespace" (default "default") stands for its namespace.
    std::string ns = args.count("K8S_POD_NAMESPACE") ? args["K8S_POD_NAMESPACE"] : "";
    auto configured = string_field(config, "namespace", "default");
    auto network = string_field(config, "name");
    if (!configured || !network)
        return fail(version, {7, "invalid network configuration",
                              "\"namespace\" and \"name\" must be strings"});
    if (ns.empty()) ns = *configured;
    if (auto bad = bad_namespace(ns))
        return fail(version, {4,
                              "invalid pod namespace (K8S_POD_NAMESPACE or the network "
                              "configuration's \"namespace\")",
                              *bad});
    pod["namespace"] = ns;
    // The network's name, so that a GC of this network collects only its own sandboxes.
    if (!network->empty()) pod["network"] = *network;
    bool named = args.count("K8S_POD_NAME") && !args["K8S_POD_NAME"].empty();
    pod["name"] = named ? args["K8S_POD_NAME"] : container;
    if (auto bad = bad_pod_name(pod["name"]))
        return fail(version, {4,
                              named ? "invalid K8S_POD_NAME in CNI_ARGS"
                                    : "no K8S_POD_NAME, and CNI_CONTAINERID cannot name the pod",
                              *bad});
    if (args.count("K8S_POD_UID")) pod["uid"] = args["K8S_POD_UID"];
    // O_NONBLOCK: a FIFO at the path must not hang the runtime (the daemon then refuses what is
    // no network namespace).
    int fd = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return fail(version, {4, "cannot open CNI_NETNS " + netns, std::strerror(errno)});
    struct stat ns_st {};
    bool stated = ::fstat(fd, &ns_st) == 0;
    CallResult r = call(
        "RegisterPod",
        [&](sd_bus_message *m) {
            int rr = sd_bus_message_append(m, "ssh", container.c_str(), ifname.c_str(), fd);
            if (rr >= 0) rr = append_map(m, pod);
            if (rr >= 0) rr = append_map(m, annotations);
            return rr;
        },
        budget);
    ::close(fd);
    if (!r.reached) {
        // A pod that asks for offload waits for its decision: the runtime tries it again.
        if (offload)
            return fail(version,
                        {11, "knod-policyd is unreachable; the pod asks for offload", r.message});
        // A pod that asked for nothing is never blocked by the daemon being down: its
        // registration waits in the spool, and the daemon makes it that pod when it answers.
        json entry{{"op", "add"},
                   {"container_id", container},
                   {"ifname", ifname},
                   {"netns", netns},
                   {"netns_dev", stated ? static_cast<std::uint64_t>(ns_st.st_dev) : 0},
                   {"netns_ino", stated ? static_cast<std::uint64_t>(ns_st.st_ino) : 0},
                   {"pod", pod},
                   {"annotations", annotations},
                   {"delivered", r.not_running ? "no" : "unknown"},
                   {"written_us", std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count()}};
        if (!stated)
            return fail(version, {11, "knod-policyd is unreachable and CNI_NETNS cannot be read",
                                  r.message});
        if (auto why = spool_write(spool, container, ifname, entry))
            return fail(version, {11,
                                  "knod-policyd is unreachable and the registration cannot be "
                                  "queued",
                                  r.message + "; " + *why});
        std::cerr << "knod-cni: " << r.message << ": the registration of sandbox " << container
                  << " is queued in " << spool.dir
                  << "; knod-policyd registers the pod when it answers (the pod asks for no "
                     "offload: started)\n";
    } else if (!r.error_name.empty()) {
        // Any refusal fails the sandbox, loudly, whatever the pod asks for: a pod that started
        // unregistered would match no pod rule for its whole life, and nobody reads a note.
        bool policy = r.error_name == knod::bus::error::denied &&
                      r.message.find("the policy refuses") != std::string::npos;
        bool invalid = r.error_name == knod::bus::error::invalid_argument;
        return fail(version, {policy ? 100 : 101,
                              policy    ? "knod-policy refuses the pod's offload request"
                              : invalid ? "knod-policyd refused to register the pod: invalid "
                                          "sandbox"
                                        : "knod-policyd refused to register the pod",
                              r.message});
    }
    if (check) return 0;
    json result = config.contains("prevResult") ? config.at("prevResult") : json::object();
    result["cniVersion"] = version;
    std::cout << knod::dump_json(result) << std::endl;
    return 0;
}

int del(const std::string &version, const Budget &budget, const Spool &spool) {
    std::string container = env("CNI_CONTAINERID"), ifname = env("CNI_IFNAME");
    if (container.empty()) return fail(version, {4, "CNI_CONTAINERID is required for DEL", ""});
    CallResult r = call(
        "UnregisterPod",
        [&](sd_bus_message *m) {
            return sd_bus_message_append(m, "ss", container.c_str(), ifname.c_str());
        },
        budget);
    if (!r.reached) {
        // Success only for work that will be done: the deletion waits in the spool and the
        // daemon ends the pod's bindings when it answers (or finds none). An ADD that was
        // queued while no daemon ran reached nobody: it simply goes.
        auto name = knod::pod_spool::entry_name(container, ifname);
        if (name && r.not_running) {
            std::string path = spool.dir + "/" + *name;
            auto queued = read_entry(path);
            if (queued && queued->value("op", "") == "add" &&
                queued->value("delivered", "") == "no" && ::unlink(path.c_str()) == 0) {
                std::cerr << "knod-cni: " << r.message << ": the queued registration of sandbox "
                          << container << " is withdrawn (it never reached a daemon)\n";
                return 0;
            }
        }
        json entry{{"op", "del"},
                   {"container_id", container},
                   {"ifname", ifname},
                   {"delivered", r.not_running ? "no" : "unknown"},
                   {"written_us", std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count()}};
        if (auto why = spool_write(spool, container, ifname, entry))
            return fail(version, {11,
                                  "knod-policyd is unreachable and the deletion cannot be queued "
                                  "(the runtime must retry the DEL)",
                                  r.message + "; " + *why});
        std::cerr << "knod-cni: " << r.message << ": the deletion of sandbox " << container
                  << " is queued in " << spool.dir
                  << "; knod-policyd ends the pod's bindings when it answers\n";
    } else if (r.error_name == knod::bus::error::invalid_argument) {
        // Arguments no registration can have: there is nothing of theirs to delete.
        std::cerr << "knod-cni: DEL: " << r.message << "\n";
    } else if (!r.error_name.empty()) {
        // The daemon answered and did not delete (refused, out of resources): a success would
        // leave the pod registered and its bindings alive for good (issue 51). 11: the runtime
        // retries the DEL, as it does every failing one.
        return fail(version, {11,
                              "knod-policyd did not delete the pod (the runtime must retry "
                              "the DEL)",
                              r.message});
    } else if (r.ended) {
        std::cerr << "knod-cni: ended " << r.ended << " binding(s) of sandbox " << container
                  << "\n";
    }
    return 0;
}

// GC: the runtime lists the attachments still valid on this network; the daemon forgets the
// others this network registered.
int gc(const json &config, const std::string &version, const Budget &budget) {
    auto network = string_field(config, "name");
    if (!network || network->empty())
        return fail(version, {7, "invalid network configuration", "GC needs the network's name"});
    auto listed = config.find("cni.dev/valid-attachments");
    if (listed == config.end()) {
        std::cerr << "knod-cni: GC without cni.dev/valid-attachments: nothing collected\n";
        return 0;
    }
    if (!listed->is_array())
        return fail(version, {7, "invalid network configuration",
                              "cni.dev/valid-attachments must be an array"});
    std::vector<std::pair<std::string, std::string>> valid;
    for (auto &a : *listed) {
        // Both required: an entry without its ifname must not collect the attachment it lists.
        bool whole = a.is_object() && a.contains("containerID") && a.contains("ifname");
        auto id = whole ? string_field(a, "containerID") : std::nullopt;
        auto ifname = whole ? string_field(a, "ifname") : std::nullopt;
        if (!id || !ifname || id->empty())
            return fail(version, {7, "invalid network configuration",
                                  "each cni.dev/valid-attachments entry needs string containerID "
                                  "and ifname"});
        valid.emplace_back(*id, *ifname);
    }
    CallResult r = call(
        "CollectPods",
        [&](sd_bus_message *m) {
            int rr = sd_bus_message_append(m, "s", network->c_str());
            if (rr >= 0) rr = sd_bus_message_open_container(m, 'a', "(ss)");
            for (auto &[id, ifname] : valid)
                if (rr >= 0) rr = sd_bus_message_append(m, "(ss)", id.c_str(), ifname.c_str());
            return rr < 0 ? rr : sd_bus_message_close_container(m);
        },
        budget);
    // Success only when the bus says no daemon runs (nothing is registered then); a daemon
    // that did not answer, or a bus that took no connection, leaves the work undone.
    if (!r.reached && (!r.not_running || r.no_bus))
        return fail(version, {11,
                              "knod-policyd did not collect the sandboxes (the runtime's next "
                              "GC does)",
                              r.message});
    if (!r.reached) {
        std::cerr << "knod-cni: " << r.message << " (no daemon: nothing registered to collect)\n";
        return 0;
    }
    if (!r.error_name.empty())
        return fail(version, {101, "knod-policyd refused the garbage collection", r.message});
    if (r.collected)
        std::cerr << "knod-cni: GC of " << *network << ": " << r.collected << " sandbox(es) gone, "
                  << r.ended << " binding(s) ended\n";
    return 0;
}

} // namespace

int main() {
    std::string command = env("CNI_COMMAND");
    if (command == "VERSION") {
        std::cout << knod::dump_json(
                         json{{"cniVersion", "1.1.0"}, {"supportedVersions", supported}})
                  << std::endl;
        return 0;
    }
    // The network configuration: bounded before it is parsed (a runtime sends a few KiB).
    std::string text;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(0, buf, sizeof buf)) > 0 && text.size() <= (4u << 20))
        text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > (4u << 20))
        return fail("", {7, "the network configuration exceeds 4 MiB", ""});
    json config = knod::parse_json(text);
    if (config.is_discarded() || !config.is_object())
        return fail("", {6, "cannot decode the network configuration", "not a JSON object"});
    std::string version = string_field(config, "cniVersion").value_or("");
    if (std::find(supported.begin(), supported.end(), version) == supported.end())
        return fail(version,
                    {1, "incompatible CNI version " + version, "knod-cni supports 0.3.0 to 1.1.0"});
    // The budget every call to the daemon shares, and the spool (both the admin's, in the
    // network configuration; see the top of this file).
    std::uint64_t budget_ms = 2500;
    if (auto it = config.find("budgetMs"); it != config.end()) {
        if (!it->is_number_unsigned() || it->get<std::uint64_t>() < 100 ||
            it->get<std::uint64_t>() > 60000)
            return fail(version, {7, "invalid network configuration",
                                  "budgetMs: milliseconds from 100 to 60000"});
        budget_ms = it->get<std::uint64_t>();
    }
    Budget budget{std::chrono::steady_clock::now() + std::chrono::milliseconds(budget_ms),
                  budget_ms};
    auto spool_dir = string_field(config, "spoolDir", knod::pod_spool::default_dir);
    if (!spool_dir || spool_dir->empty() || (*spool_dir)[0] != '/')
        return fail(version, {7, "invalid network configuration", "spoolDir: an absolute path"});
    Spool spool{*spool_dir};
    if (command == "ADD") return add(config, version, budget, spool);
    if (command == "DEL") return del(version, budget, spool);
    if (command == "CHECK") return add(config, version, budget, spool, true);
    if (command == "GC") return gc(config, version, budget);
    if (command == "STATUS") return 0;
    return fail(version, {4, "unknown CNI_COMMAND '" + command + "'",
                          "ADD, DEL, CHECK, STATUS, GC or VERSION"});
}
