#include "daemon/pod_registry.h"

#include "knod/untrusted.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace knod::daemon {
namespace {

Error invalid(const std::string &what) {
    return make_error(Errc::invalid_argument, what);
}

bool all_of(const std::string &s, bool (*ok)(unsigned char)) {
    return std::all_of(s.begin(), s.end(),
                       [&](char c) { return ok(static_cast<unsigned char>(c)); });
}

bool id_char(unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '-';
}
bool dns_char(unsigned char c) {
    return std::islower(c) || std::isdigit(c) || c == '-' || c == '.';
}
bool printable(unsigned char c) {
    return c >= 0x20 && c != 0x7f;
}

Result<void> check_length(const char *field, const std::string &v, std::size_t min,
                          std::size_t max) {
    if (v.size() < min || v.size() > max)
        return invalid(std::string(field) + ": " + std::to_string(min) + " to " +
                       std::to_string(max) + " bytes, not " + std::to_string(v.size()));
    return {};
}

Result<void> check(const PodSandbox &s, std::size_t max_annotations) {
    // CNI's container id: letters, digits, '_', '.', '-' (the spec's regex), not empty.
    if (auto r = check_length("container id", s.container_id, 1, 256); !r) return r;
    if (!all_of(s.container_id, id_char))
        return invalid("container id " + quote_untrusted(s.container_id, 64) +
                       ": only letters, digits, '_', '.' and '-'");
    if (auto r = check_length("ifname", s.ifname, 1, 15); !r) return r;
    if (!all_of(s.ifname, printable) || s.ifname.find('/') != std::string::npos)
        return invalid("ifname " + quote_untrusted(s.ifname, 16) + " is no interface name");
    // A namespace is a DNS label (63): Kubernetes' own, or the conflist's "namespace".
    if (auto r = check_length("pod namespace", s.pod.k8s_namespace, 1, 63); !r) return r;
    if (!all_of(s.pod.k8s_namespace, dns_char))
        return invalid("pod namespace " + quote_untrusted(s.pod.k8s_namespace, 64) +
                       ": only lowercase letters, digits, '-' and '.'");
    // A pod name as runtimes give it: Kubernetes' DNS subdomain (253), podman's container name
    // ([a-zA-Z0-9][a-zA-Z0-9_.-]*: `nifty_pasteur`, `MyInference`), or the container id when
    // there is no name. Nothing that needs quoting in a journal row, a label or a terminal.
    if (auto r = check_length("pod name", s.pod.name, 1, 253); !r) return r;
    if (!std::isalnum(static_cast<unsigned char>(s.pod.name[0])) || !all_of(s.pod.name, id_char))
        return invalid("pod name " + quote_untrusted(s.pod.name, 64) +
                       ": a letter or digit, then letters, digits, '_', '.' and '-'");
    if (auto r = check_length("network", s.network, 0, 253); !r) return r;
    if (!all_of(s.network, printable))
        return invalid("network " + quote_untrusted(s.network, 64) + " is no network name");
    if (auto r = check_length("pod uid", s.pod.uid, 0, 64); !r) return r;
    if (!all_of(s.pod.uid, id_char))
        return invalid("pod uid " + quote_untrusted(s.pod.uid, 64) + " is no UID");
    if (s.pod.annotations.size() > max_annotations)
        return invalid("at most " + std::to_string(max_annotations) + " pod annotations under " +
                       policy::pod_annotation_prefix + ", not " +
                       std::to_string(s.pod.annotations.size()));
    for (auto &[key, value] : s.pod.annotations) {
        if (!key.starts_with(policy::pod_annotation_prefix) || key.size() > 317 ||
            !all_of(key, printable))
            return invalid("annotation key " + quote_untrusted(key, 64) + ": only keys under " +
                           policy::pod_annotation_prefix + " (at most 317 bytes) are kept");
        if (value.size() > 4096) return invalid("annotation " + key + ": at most 4096 bytes");
    }
    return {};
}

} // namespace

Result<void> PodRegistry::add(PodSandbox sandbox) {
    if (auto r = check(sandbox, limits_.max_annotations); !r) return r;
    for (auto &[key, s] : sandboxes_) {
        if (s.netns == sandbox.netns && s.container_id != sandbox.container_id)
            return make_error(Errc::denied,
                              "that network namespace is already registered for sandbox " +
                                  s.container_id + " (one namespace, one pod)");
        // The same sandbox on another network (another ifname) is the same pod: two networks
        // naming it differently would make its identity depend on which registration is found,
        // and on which one a GC or DEL takes away.
        if (s.container_id == sandbox.container_id && s.ifname != sandbox.ifname &&
            (s.netns != sandbox.netns || s.pod.k8s_namespace != sandbox.pod.k8s_namespace ||
             s.pod.name != sandbox.pod.name || s.pod.uid != sandbox.pod.uid))
            return make_error(Errc::denied, "sandbox " + s.container_id + " is registered on " +
                                                "another network as pod " + s.pod.k8s_namespace +
                                                "/" + s.pod.name +
                                                " (one sandbox, one pod identity)");
    }
    auto key = std::make_pair(sandbox.container_id, sandbox.ifname);
    if (!sandboxes_.count(key) && sandboxes_.size() >= limits_.max_sandboxes)
        return make_error(Errc::limits_exceeded,
                          "at most " + std::to_string(limits_.max_sandboxes) +
                              " pod sandboxes are registered; DEL the ones gone");
    sandboxes_.insert_or_assign(std::move(key), std::move(sandbox));
    return {};
}

std::vector<PodSandbox> PodRegistry::remove(const std::string &container_id,
                                            const std::string &ifname) {
    std::vector<PodSandbox> gone;
    for (auto it = sandboxes_.begin(); it != sandboxes_.end();) {
        if (it->first.first == container_id && (ifname.empty() || it->first.second == ifname)) {
            gone.push_back(std::move(it->second));
            it = sandboxes_.erase(it);
        } else {
            ++it;
        }
    }
    return gone;
}

std::vector<PodSandbox>
PodRegistry::collect(const std::string &network,
                     const std::set<std::pair<std::string, std::string>> &valid) {
    std::vector<PodSandbox> gone;
    if (network.empty()) return gone; // no network named: nothing is this GC's to collect
    for (auto it = sandboxes_.begin(); it != sandboxes_.end();) {
        if (it->second.network == network && !valid.count(it->first)) {
            gone.push_back(std::move(it->second));
            it = sandboxes_.erase(it);
        } else {
            ++it;
        }
    }
    return gone;
}

const PodSandbox *PodRegistry::by_netns(const NamespaceId &netns) const {
    for (auto &[key, s] : sandboxes_)
        if (s.netns == netns) return &s;
    return nullptr;
}

bool PodRegistry::has_container(const std::string &container_id) const {
    auto it = sandboxes_.lower_bound({container_id, std::string()});
    return it != sandboxes_.end() && it->first.first == container_id;
}

std::vector<const PodSandbox *> PodRegistry::all() const {
    std::vector<const PodSandbox *> out;
    for (auto &[key, s] : sandboxes_)
        out.push_back(&s);
    return out;
}

} // namespace knod::daemon
