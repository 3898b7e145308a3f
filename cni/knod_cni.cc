// knod-cni: a chained CNI plugin (spec 1.0.0; VERSION answers every version up to 1.1.0) that
// tells the node's knod-policyd which pod each sandbox is, so that the policy can name pods.
//
//   ADD    registers the sandbox: its container id and ifname, an fd of its network namespace
//          (CNI_NETNS), the pod's namespace, name and UID (CNI_ARGS: K8S_POD_NAMESPACE,
//          K8S_POD_NAME, K8S_POD_UID), and its annotations under knod.io/ (runtimeConfig
//          "io.kubernetes.cri.pod-annotations"; no other annotation leaves the plugin). A pod
//          that asks for offload (knod.io/flows) is checked against the policy at once: a denial
//          fails the sandbox, naming the deciding rule. prevResult is printed unchanged.
//   DEL    unregisters it; the daemon ends every binding of the pod's processes (pod-deleted).
//          Succeeds when there is nothing left, and when no daemon runs (nothing to end).
//   CHECK  registers again (a restarted daemon forgot its sandboxes), as ADD but printing
//          nothing.
//   STATUS succeeds: a pod that asks for nothing must never wait for the daemon.
//   GC     (CNI 1.1) unregisters every sandbox this network (the config's "name") registered
//          that "cni.dev/valid-attachments" no longer lists, ending its bindings as DEL does.
//          Without that list it collects nothing; without a daemon there is nothing to collect.
//   VERSION
//
// Errors follow the spec: exit 1 with {"cniVersion", "code", "msg", "details"} on stdout (1
// incompatible version, 4 invalid environment, 6 undecodable config, 7 invalid config, 11 try
// again later: the daemon is unreachable for a pod that asked for offload; 100 the policy
// refuses the pod; 101 the daemon refused the registration for another reason). Logs go to
// stderr. The daemon is found as every client finds it: the system bus
// (DBUS_SYSTEM_BUS_ADDRESS, or /run/dbus/system_bus_socket); see docs/kubernetes.md.
#include "knod/json.h"
#include "policy/policy.h"
#include "protocol/names.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <algorithm>
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

// The daemon's answer: nullopt for success, else (D-Bus error name, message).
struct CallResult {
    bool reached = false; // the daemon answered (success or its own error)
    std::string error_name, message;
    std::uint32_t ended = 0, collected = 0;
};

CallResult call(const char *method, const std::function<int(sd_bus_message *)> &append) {
    CallResult out;
    Bus b;
    int r = sd_bus_open_system(&b.bus);
    if (r < 0) {
        out.message = std::string("cannot connect to the system bus: ") + std::strerror(-r);
        return out;
    }
    // Prove this process to the daemon first (AttestProcess with a socketpair end: the kernel
    // names its maker): only a proven host root may register pods. A refusal is the call's to
    // report.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        sd_bus_error ae = SD_BUS_ERROR_NULL;
        sd_bus_message *ar = nullptr;
        (void)sd_bus_call_method(b.bus, knod::bus::service_name, knod::bus::manager_path,
                                 knod::bus::manager_interface, "AttestProcess", &ae, &ar, "h",
                                 pair[0]);
        sd_bus_error_free(&ae);
        sd_bus_message_unref(ar);
        ::close(pair[0]);
        ::close(pair[1]);
    }
    sd_bus_message *m = nullptr;
    r = sd_bus_message_new_method_call(b.bus, &m, knod::bus::service_name, knod::bus::manager_path,
                                       knod::bus::manager_interface, method);
    if (r >= 0) r = append(m);
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = nullptr;
    if (r >= 0) r = sd_bus_call(b.bus, m, 10'000'000, &e, &reply);
    sd_bus_message_unref(m);
    if (r < 0) {
        out.error_name = e.name ? e.name : "";
        out.message = e.message ? e.message : std::strerror(-r);
        // The daemon's own errors (and the bus refusing the call) mean it was reached.
        out.reached = out.error_name.starts_with("org.knod.Policy1.Error.") ||
                      out.error_name == "org.freedesktop.DBus.Error.AccessDenied";
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

int append_map(sd_bus_message *m, const std::map<std::string, std::string> &values) {
    int r = sd_bus_message_open_container(m, 'a', "{ss}");
    for (auto &[k, v] : values)
        if (r >= 0) r = sd_bus_message_append(m, "{ss}", k.c_str(), v.c_str());
    return r < 0 ? r : sd_bus_message_close_container(m);
}

// ADD, and CHECK (`check`: print nothing): register the sandbox. Registering again is
// harmless (the same container id and ifname replace their entry), so CHECK also restores a
// registration a restarted daemon forgot.
int add(const json &config, const std::string &version, bool check = false) {
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
    pod["namespace"] = ns;
    // The network's name, so that a GC of this network collects only its own sandboxes.
    if (!network->empty()) pod["network"] = *network;
    pod["name"] = args.count("K8S_POD_NAME") && !args["K8S_POD_NAME"].empty()
                      ? args["K8S_POD_NAME"]
                      : container.substr(0, 63);
    if (args.count("K8S_POD_UID")) pod["uid"] = args["K8S_POD_UID"];
    // O_NONBLOCK: a FIFO at the path must not hang the runtime (the daemon then refuses what is
    // no network namespace).
    int fd = ::open(netns.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return fail(version, {4, "cannot open CNI_NETNS " + netns, std::strerror(errno)});
    CallResult r = call("RegisterPod", [&](sd_bus_message *m) {
        int rr = sd_bus_message_append(m, "ssh", container.c_str(), ifname.c_str(), fd);
        if (rr >= 0) rr = append_map(m, pod);
        if (rr >= 0) rr = append_map(m, annotations);
        return rr;
    });
    ::close(fd);
    if (!r.reached) {
        if (offload)
            return fail(version,
                        {11, "knod-policyd is unreachable; the pod asks for offload", r.message});
        // A pod that asked for nothing is never blocked by the daemon being down.
        std::cerr << "knod-cni: " << r.message << " (the pod asks for no offload: started)\n";
    } else if (!r.error_name.empty()) {
        // A pod that asked for nothing starts whatever the daemon says (unregistered, its
        // processes match no allow rule: nothing is lost by letting it start).
        if (!offload) {
            std::cerr << "knod-cni: the daemon did not register the pod: " << r.message
                      << " (it asks for no offload: started)\n";
        } else {
            // The policy's verdict (check_pod's message), not a refusal of the caller.
            bool policy = r.error_name == knod::bus::error::denied &&
                          r.message.find("the policy refuses") != std::string::npos;
            return fail(version, {policy ? 100 : 101,
                                  policy ? "knod-policy refuses the pod's offload request"
                                         : "knod-policyd refused to register the pod",
                                  r.message});
        }
    }
    if (check) return 0;
    json result = config.contains("prevResult") ? config.at("prevResult") : json::object();
    result["cniVersion"] = version;
    std::cout << knod::dump_json(result) << std::endl;
    return 0;
}

int del(const std::string &version) {
    std::string container = env("CNI_CONTAINERID"), ifname = env("CNI_IFNAME");
    if (container.empty()) return fail(version, {4, "CNI_CONTAINERID is required for DEL", ""});
    CallResult r = call("UnregisterPod", [&](sd_bus_message *m) {
        return sd_bus_message_append(m, "ss", container.c_str(), ifname.c_str());
    });
    if (!r.reached)
        std::cerr << "knod-cni: " << r.message << " (no daemon: no binding to end)\n";
    else if (!r.error_name.empty())
        std::cerr << "knod-cni: DEL: " << r.message << "\n"; // DEL must not fail
    else if (r.ended)
        std::cerr << "knod-cni: ended " << r.ended << " binding(s) of sandbox " << container
                  << "\n";
    return 0;
}

// GC: the runtime lists the attachments still valid on this network; the daemon forgets the
// others this network registered.
int gc(const json &config, const std::string &version) {
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
    CallResult r = call("CollectPods", [&](sd_bus_message *m) {
        int rr = sd_bus_message_append(m, "s", network->c_str());
        if (rr >= 0) rr = sd_bus_message_open_container(m, 'a', "(ss)");
        for (auto &[id, ifname] : valid)
            if (rr >= 0) rr = sd_bus_message_append(m, "(ss)", id.c_str(), ifname.c_str());
        return rr < 0 ? rr : sd_bus_message_close_container(m);
    });
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
    if (command == "ADD") return add(config, version);
    if (command == "DEL") return del(version);
    if (command == "CHECK") return add(config, version, true);
    if (command == "GC") return gc(config, version);
    if (command == "STATUS") return 0;
    return fail(version, {4, "unknown CNI_COMMAND '" + command + "'",
                          "ADD, DEL, CHECK, STATUS, GC or VERSION"});
}
