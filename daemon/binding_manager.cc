#include "daemon/binding_manager.h"

#include "daemon/request_limits.h"
#include "journal/journal.h"
#include "journal/retention.h"
#include "knod/hex.h"
#include "knod/untrusted.h"

#include "knod/json.h"
#include <fcntl.h>
#include <linux/nsfs.h>
#include <nlohmann/json.hpp>
#include <openssl/rand.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>

namespace knod::daemon {
namespace {

// Random, so one caller cannot guess another's id; without randomness nothing is granted (an id
// of zeros would collide at the second request).
Result<std::string> new_binding_id() {
    std::array<std::uint8_t, 8> bytes{};
    if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1)
        return make_error(Errc::unavailable, "OpenSSL RAND_bytes failed: no binding id");
    return "b" + to_hex(bytes); // a valid D-Bus object path element
}

// The files a policy was read from and the SHA-256 of each, for the policy-load events: an
// auditor can tell which file changed between two loads without diffing the whole text.
nlohmann::json policy_files(const policy::Policy &p) {
    nlohmann::json out = nlohmann::json::array();
    for (std::size_t i = 0; i < p.files.size(); ++i)
        out.push_back({{"path", escape_untrusted(p.files[i])},
                       {"sha256", i < p.file_digests.size() ? p.file_digests[i] : ""}});
    return out;
}

// The wall time a binding's key expires, from its deadline: what a handoff carries, right
// even if the wall clock stepped since the key was issued.
std::int64_t wall_expiry(const Binding &b) {
    return journal::now_us() + (b.deadline - BootClock::now()).count();
}

journal::Event event_for(const char *kind, const Peer &p) {
    journal::Event e;
    e.kind = kind;
    e.uid = p.uid;
    e.pid = p.pid;
    return e;
}

Error journal_error(const Error &e) {
    return make_error(Errc::journal_unavailable,
                      "the session journal cannot record this, so nothing is granted (" +
                          e.message + ")");
}

// The pod a caller is in, as grant and end events name it (strings the registry checked).
nlohmann::json pod_json(const policy::PodIdentity &p) {
    return {{"namespace", p.k8s_namespace}, {"name", p.name}, {"uid", p.uid}};
}

// An array of flow specs: exports show it as is (daemons before #16 stored a JSON-encoded string).
nlohmann::json flows_json(const std::vector<policy::FlowSpec> &flows) {
    nlohmann::json j = nlohmann::json::array();
    for (auto &f : flows)
        j.push_back(f.to_string());
    return j;
}

// The restart handoff (#31): format 2 carries a MAC under the state dir's secret over the whole
// record. Format 1 (MAC over the key only, every other field taken as written) is refused.
constexpr int handoff_version = 2;
constexpr std::string_view handoff_purpose = "knod-policyd restart handoff 2";

// The text the MAC covers: the record without its "mac" member as knod::dump_json writes it
// (compact, members in key order: nlohmann's objects are sorted maps, so one value has exactly
// one text). Computed over what was parsed, so what the MAC vouches for is exactly what
// adoption reads: an edit of any member, a number turned into a float, a member added or
// removed changes this text.
constexpr std::string_view pods_handoff_purpose = "knod-policyd pod registrations 1";
constexpr const char *pods_handoff_name = "pods.handoff";

std::string handoff_canonical(nlohmann::json record) {
    record.erase("mac");
    return knod::dump_json(record);
}

} // namespace

BindingManager::~BindingManager() {
    audit_.close();
}

void BindingManager::set_event_loop(driver::EventLoop *loop) {
    holders_.reset();
    if (loop)
        holders_ = std::make_unique<HolderWatch>(
            *loop, [this](const std::string &id) { holder_gone(id, EndReason::process_exit); });
}

const char *to_string(BindingState s) {
    return s == BindingState::active ? "active" : "granted";
}

namespace {

// A job or group name's bytes: what an IPv4 store address ("10.0.0.1:29500"; a bracketed IPv6
// one is not) or a scheduler's job name ("job-123", "team/run@3") is made of, and nothing a
// journal reader, a terminal or a Prometheus label could take for syntax.
bool job_byte(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           std::strchr("._:@/-", c) != nullptr;
}

Result<void> check_job_name(const char *what, const std::string &v, std::size_t min) {
    auto bad = [&](const std::string &why) {
        return make_error(Errc::invalid_argument,
                          std::string(what) + " " + quote_untrusted(v) + ": " + why);
    };
    if (v.size() < min || v.size() > JobTag::max_name)
        return bad(std::to_string(min) + " to " + std::to_string(JobTag::max_name) +
                   " bytes, not " + std::to_string(v.size()));
    for (char c : v)
        if (c == '\0' || !job_byte(c)) return bad("only letters, digits and . _ : @ / -");
    // Never an option to the tools that print it back (`knod-policy bindings --job -x`).
    if (!v.empty() && v[0] == '-') return bad("must not start with '-'");
    return {};
}

} // namespace

Result<void> check_job_tag(const JobTag &tag) {
    if (auto r = check_job_name("job", tag.job, 1); !r) return r;
    if (auto r = check_job_name("group", tag.group, 0); !r) return r;
    if (tag.rank > JobTag::max_rank)
        return make_error(Errc::invalid_argument, "rank " + std::to_string(tag.rank) +
                                                      ": at most " +
                                                      std::to_string(JobTag::max_rank));
    return {};
}

BindingManager::BindingManager(ManagerConfig config, driver::Driver &driver,
                               keys::KeyAuthority keys, policy::Policy policy,
                               BindingEvents &events, Post post)
    : config_(std::move(config)), driver_(driver), keys_(std::move(keys)),
      policy_(std::move(policy)), events_(events), post_(post),
      audit_({config_.journal_path, config_.refusal_window, config_.retain_age,
              config_.retain_events, config_.snapshot_interval, config_.snapshot_mode},
             policy_, std::move(post)),
      limiter_(config_.requests_per_second, config_.request_burst),
      domain_limiter_(4 * config_.requests_per_second, 4 * config_.request_burst),
      host_(config_.host.sysfs, config_.host.proc) {
    // A policy built without the parser still gets the digest of the text it carries.
    if (policy_.digest.empty()) policy_.digest = policy::policy_digest(policy_.text);
    audit_.set_metrics(&metrics_);
}

Result<void> BindingManager::apply_settings(const policy::Settings &settings) {
    bool drop = settings.unmatched_traffic == policy::UnmatchedTraffic::drop;
    if (auto r = driver_.set_unmatched_drop(drop); !r)
        return make_error(Errc::invalid_policy, "settings.unmatched_traffic: " + r.error().message);
    return {};
}

void BindingManager::start() {
    std::map<std::string, std::string> handoffs;
    journal::Journal *journal = audit_.journal();
    if (journal)
        if (auto taken = journal->take_handoffs()) handoffs = std::move(*taken);
    // The pods first: the bindings taken back below are decided as their pods' (issue #51).
    std::size_t pods_restored = journal ? restore_pods() : 0;
    // The daemon loads the policy it starts with: its own uid and pid are the actor's.
    Peer self;
    self.uid = ::getuid();
    self.pid = ::getpid();
    journal::Event e = event_for(journal::kind::daemon_start, self);
    nlohmann::json detail{{"driver", driver_.name()},       {"rules", policy_.rules.size()},
                          {"handed_over", handoffs.size()}, {"pods_restored", pods_restored},
                          {"policy", policy_.digest},       {"files", policy_files(policy_)}};
    // The retention in force, inside the chain: verify then knows a prune event that records
    // none (written to look like an older build's) is not this daemon's.
    std::optional<std::int64_t> age;
    if (config_.retain_age)
        age = std::chrono::duration_cast<std::chrono::microseconds>(*config_.retain_age).count();
    detail["retention"] = journal::retention_json(age, config_.retain_events);
    if (journal) { // where this journal lives, inside the chain (meta may be edited)
        auto &id = journal->identity();
        detail["journal_id"] = id.journal_id;
        detail["machine_id"] = id.machine_id;
        detail["hostname"] = escape_untrusted(id.hostname);
    }
    e.detail = knod::dump_json(detail);
    audit_.record_load(std::move(e));
    if (!journal) return;
    // Bindings the previous daemon handed over come back if their handles did and their
    // holders live; every other open session (a crash, a stop that discarded the fd store, a
    // holder gone meanwhile) ends now: its binding did not survive.
    std::set<std::string> kept;
    // Holders of authentic records not taken back, told once their sessions are closed (#52).
    std::vector<std::pair<Binding, std::string>> to_tell;
    for (auto &[id, text] : handoffs) {
        auto record = open_handoff(id, text);
        auto adopted = record ? adopt(id, *record) : Result<void>(record.error());
        if (adopted) {
            kept.insert(id);
            continue;
        }
        if (record) {
            try { // what the driver left behind besides the handles (devmem: ntuple rules)
                driver_.abandon(record->at("netdev").get<std::string>(),
                                record->at("driver").get<std::string>());
            } catch (const std::exception &) {
            }
            if (auto told = holder_to_tell(id, *record))
                to_tell.emplace_back(std::move(*told), adopted.error().message);
        } else {
            // Not the record this daemon's secret vouches for: nothing in it is acted on (its
            // netdev and driver state could name another binding's rules).
            std::cerr << "knod-policyd: binding " << escape_untrusted(id, Escape::value, 128)
                      << " not taken back: " << adopted.error().message << "\n";
        }
        journal::Event no = event_for(journal::kind::not_adopted, {});
        no.uid.reset();
        no.pid.reset();
        no.session_id = id;
        no.reason = adopted.error().message;
        audit_.record(std::move(no));
    }
    auto closed = journal->close_open_sessions(to_string(EndReason::daemon_restart), kept);
    // The holder waits on BindingReleased: it learns here that its binding did not survive
    // the restart, and why (the not-adopted reason).
    for (auto &[b, why] : to_tell)
        if (closed && std::find(closed->begin(), closed->end(), b.id) != closed->end())
            events_.binding_ended(b, EndReason::daemon_restart, why);
    // A restart may bring a new policy: what it no longer grants ends as on a reload.
    for (auto &id : kept)
        if (auto it = bindings_.find(id);
            it != bindings_.end() && !decide_again(it->second).granted())
            end_binding(id, EndReason::policy_reload);
}

void BindingManager::store_handles(Binding &b) {
    if (!store_) return;
    auto keep = [&](const std::string &name, int fd) {
        if (std::find(b.stored.begin(), b.stored.end(), name) != b.stored.end()) return;
        if (store_->store(name, fd)) b.stored.push_back(name);
    };
    if (b.region) keep(b.id + ".region", b.region->get());
    for (auto &[role, fd] : driver_.handles(b.id))
        keep(b.id + "." + role, fd);
}

std::string BindingManager::handoff_of(const Binding &b, const std::string &driver_state) {
    auto carried = keys_.carry(b.key_id);
    journal::Journal *journal = audit_.journal();
    if (!carried || !journal) return {};
    const std::string &journal_id = journal->identity().journal_id;
    auto hex = [](const std::string &s) {
        return to_hex({reinterpret_cast<const std::uint8_t *>(s.data()), s.size()});
    };
    nlohmann::json flows = nlohmann::json::array();
    for (auto &f : b.flows)
        flows.push_back(f.to_string());
    nlohmann::json roles = nlohmann::json::array();
    for (auto &name : b.stored)
        if (name != b.id + ".region") roles.push_back(name.substr(b.id.size() + 1));
    // Untrusted strings from /proc travel as hex: the next start gets back the exact bytes.
    nlohmann::json owner{{"uid", b.owner.uid},
                         {"pid", b.owner.pid},
                         {"start_time", b.owner.start_time},
                         {"bus_name", hex(b.owner.bus_name)},
                         {"gids", b.owner.gids},
                         {"gids_from_bus", b.owner.gids_from_bus},
                         {"exe", hex(b.owner.executable)},
                         {"cgroup", hex(b.owner.cgroup)},
                         {"unit", hex(b.owner.unit)},
                         {"user_unit", hex(b.owner.user_unit)},
                         {"process_proof", to_string(b.owner.process_proof)},
                         {"host_namespaces", b.owner.host_namespaces},
                         {"host_netns", b.owner.host_netns},
                         {"namespaces", b.owner.namespaces}};
    // Its pod (issue #51): the sandbox that placed it and the identity the policy decided on,
    // as the pod registrations themselves are kept (keep_pods).
    if (!b.owner.pod_sandbox.empty()) owner["pod_sandbox"] = b.owner.pod_sandbox;
    if (b.owner.pod) {
        nlohmann::json annotations = nlohmann::json::object();
        for (auto &[k, v] : b.owner.pod->annotations)
            annotations[k] = hex(v);
        owner["pod"] = {{"namespace", b.owner.pod->k8s_namespace},
                        {"name", b.owner.pod->name},
                        {"uid", b.owner.pod->uid},
                        {"annotations", annotations}};
    }
    nlohmann::json region{{"device", b.region_id.device},
                          {"inode", b.region_id.inode},
                          {"offset", b.region_id.offset},
                          {"length", b.region_id.length}};
    nlohmann::json record{{"version", handoff_version},
                          {"binding", b.id},
                          {"journal_id", journal_id},
                          {"netdev", b.netdev},
                          {"gpu", b.gpu},
                          {"gpu_names", b.gpu_names},
                          {"mode", policy::to_string(b.mode)},
                          {"flows", flows},
                          {"queues", b.queues},
                          {"owner", owner},
                          {"region", region},
                          {"key_id", b.key_id},
                          {"key_mac", to_hex(carried->mac)},
                          {"rule", b.rule},
                          {"created_us", b.created_us},
                          {"expires_us", wall_expiry(b)},
                          {"state", to_string(b.state)},
                          {"handles", roles},
                          {"driver", driver_state}};
    // Its job tag (SetJob) comes back with it, under the same MAC: the tag is set once, and a
    // holder that kept its binding across the restart would not be asked again.
    if (b.job)
        record["job"] = {{"job", b.job->job}, {"group", b.job->group}, {"rank", b.job->rank}};
    // Through text and back, so the MAC is over what the next start will parse (dump_json
    // replaces invalid UTF-8).
    record = knod::parse_json(knod::dump_json(record));
    if (!record.is_object()) return {};
    record["mac"] = to_hex(keys_.seal(handoff_purpose, handoff_canonical(record)));
    return knod::dump_json(record);
}

Result<nlohmann::json> BindingManager::open_handoff(const std::string &id,
                                                    const std::string &text) {
    auto j = knod::parse_json(text);
    if (!j.is_object())
        return make_error(Errc::corrupt, "its handoff record is unreadable: not a JSON object");
    auto version = j.find("version");
    if (version == j.end() || !version->is_number_integer())
        return make_error(Errc::corrupt, "its handoff record is unreadable: no integer version");
    if (*version == 1)
        return make_error(Errc::corrupt,
                          "its handoff record is format 1, written by an older build, whose MAC "
                          "covers only the key: not trusted");
    if (*version != handoff_version)
        return make_error(Errc::corrupt,
                          "its handoff record is of unknown format " + knod::dump_json(*version));
    auto mac = j.find("mac");
    auto mac_bytes = mac != j.end() && mac->is_string()
                         ? from_hex(mac->get<std::string>())
                         : std::optional<std::vector<std::uint8_t>>();
    if (!mac_bytes || !keys_.sealed(handoff_purpose, handoff_canonical(j), *mac_bytes))
        return make_error(Errc::corrupt,
                          "its handoff record does not match its MAC (edited, or written under "
                          "another key secret)");
    // Authentic, but written for another row or another journal: moved, not taken back.
    journal::Journal *journal = audit_.journal();
    auto binding = j.find("binding");
    if (binding == j.end() || *binding != id)
        return make_error(Errc::corrupt,
                          "its handoff record was written for another binding (moved)");
    auto journal_id = j.find("journal_id");
    if (!journal || journal_id == j.end() || *journal_id != journal->identity().journal_id)
        return make_error(Errc::corrupt,
                          "its handoff record was written for another journal (moved)");
    return j;
}

std::optional<Binding> BindingManager::holder_to_tell(const std::string &id,
                                                      const nlohmann::json &record) {
    // Only from a record the MAC vouched for (open_handoff), and only while the same process
    // (pid and start time) lives: its bus name is then still its connection's, as the bus never
    // gives a unique name twice. Nobody else learns of the binding.
    Binding b;
    b.id = id;
    try {
        auto &o = record.at("owner");
        auto name = from_hex(o.at("bus_name").get<std::string>());
        if (!name || name->empty()) return std::nullopt;
        b.owner.bus_name.assign(name->begin(), name->end());
        b.owner.uid = o.at("uid").get<uid_t>();
        b.owner.pid = o.at("pid").get<pid_t>();
        b.owner.start_time = o.at("start_time").get<std::uint64_t>();
    } catch (const std::exception &) {
        return std::nullopt;
    }
    if (!pin_process(b.owner.pid, b.owner.start_time)) return std::nullopt;
    return b;
}

Result<void> BindingManager::adopt(const std::string &id, const nlohmann::json &j) {
    Binding b;
    b.id = id;
    keys::KeyAuthority::Carried carried{};
    std::string driver_state;
    std::vector<std::string> roles;
    bool active = false;
    try {
        auto unhex = [](const nlohmann::json &v) {
            auto bytes = from_hex(v.get<std::string>());
            if (!bytes) throw std::runtime_error("bad hex text");
            return std::string(bytes->begin(), bytes->end());
        };
        b.netdev = j.at("netdev").get<std::string>();
        b.gpu = j.at("gpu").get<std::string>();
        b.gpu_names = j.at("gpu_names").get<std::vector<std::string>>();
        auto mode = policy::parse_mode(j.at("mode").get<std::string>());
        if (!mode) throw std::runtime_error("bad mode");
        b.mode = *mode;
        for (auto &f : j.at("flows")) {
            auto spec = policy::parse_flow_spec(f.get<std::string>());
            if (!spec) throw std::runtime_error("bad flow: " + spec.error().message);
            b.flows.push_back(*spec);
        }
        auto &o = j.at("owner");
        b.owner.uid = o.at("uid").get<uid_t>();
        b.owner.pid = o.at("pid").get<pid_t>();
        b.owner.start_time = o.at("start_time").get<std::uint64_t>();
        b.owner.bus_name = unhex(o.at("bus_name"));
        b.owner.gids = o.at("gids").get<std::vector<gid_t>>();
        b.owner.gids_from_bus = o.at("gids_from_bus").get<bool>();
        b.owner.executable = unhex(o.at("exe"));
        b.owner.cgroup = unhex(o.at("cgroup"));
        b.owner.unit = unhex(o.at("unit"));
        b.owner.user_unit = unhex(o.at("user_unit"));
        // Absent in records of builds before #32: what they knew rested on the pid alone.
        if (auto proof = o.find("process_proof"); proof != o.end())
            b.owner.process_proof = parse_process_proof(proof->get<std::string>());
        // Where the holder ran (#34); records of earlier builds knew only host processes. Its
        // pod comes back with the registrations (restore_pods); one whose pod did not ends.
        b.owner.pod_sandbox = o.value("pod_sandbox", std::string());
        if (auto p = o.find("pod"); p != o.end()) {
            policy::PodIdentity pod;
            pod.k8s_namespace = p->at("namespace").get<std::string>();
            pod.name = p->at("name").get<std::string>();
            pod.uid = p->at("uid").get<std::string>();
            for (auto &[k, v] : p->at("annotations").items())
                pod.annotations[k] = unhex(v);
            b.owner.pod = std::move(pod);
        }
        b.owner.host_namespaces = o.value("host_namespaces", true);
        b.owner.host_netns = o.value("host_netns", true);
        b.owner.namespaces = o.value("namespaces", std::string());
        auto &r = j.at("region");
        b.region_id = {r.at("device").get<std::uint64_t>(), r.at("inode").get<std::uint64_t>(),
                       r.at("offset").get<std::uint64_t>(), r.at("length").get<std::uint64_t>()};
        b.key_id = j.at("key_id").get<std::string>();
        auto mac = from_hex(j.at("key_mac").get<std::string>());
        if (!mac || mac->size() != carried.mac.size()) throw std::runtime_error("bad key MAC");
        std::copy(mac->begin(), mac->end(), carried.mac.begin());
        b.rule = j.at("rule").get<std::string>();
        b.created_us = j.at("created_us").get<std::int64_t>();
        b.expires_us = j.at("expires_us").get<std::int64_t>();
        auto state = j.at("state").get<std::string>();
        if (state != "active" && state != "granted") throw std::runtime_error("bad state");
        active = state == "active";
        roles = j.at("handles").get<std::vector<std::string>>();
        driver_state = j.at("driver").get<std::string>();
        // Absent in records of bindings never tagged, and of builds before #53.
        if (auto t = j.find("job"); t != j.end()) {
            JobTag tag{t->at("job").get<std::string>(), t->at("group").get<std::string>(),
                       t->at("rank").get<std::uint32_t>()};
            if (auto ok = check_job_tag(tag); !ok)
                throw std::runtime_error("bad job tag: " + ok.error().message);
            b.job = std::move(tag);
        }
    } catch (const std::exception &e) {
        return make_error(Errc::corrupt,
                          std::string("its handoff record is unreadable: ") + e.what());
    }
    if (!store_)
        return make_error(Errc::unavailable, "no file-descriptor store (not under systemd)");
    // A pod's binding needs its pod: a holder that is not placed would match no rule.
    if (!b.owner.pod_sandbox.empty() && !pods_.has_container(b.owner.pod_sandbox))
        return make_error(Errc::not_found, "its pod's registration (sandbox " +
                                               escape_untrusted(b.owner.pod_sandbox) +
                                               ") did not come back");
    // A key that ran out while no daemon ran: the binding ends here, before its data path is
    // set up again (taken back, it would take packets until the first tick expired it).
    if (b.expires_us <= journal::now_us())
        return make_error(Errc::expired, "its key expired during the restart");
    // The handoff carries the wall time (CLOCK_BOOTTIME does not survive a reboot, and a
    // handoff must not be read as one); the deadline is taken back from it once.
    b.deadline = BootClock::now() + std::chrono::microseconds(b.expires_us - journal::now_us());
    auto fd = store_->take(id + ".region");
    if (!fd)
        return make_error(Errc::not_found, "its region fd did not come back (systemd discarded "
                                           "the fd store: a stop, not a restart)");
    auto region = driver::inspect_region(fd->get());
    if (!region || region->device != b.region_id.device || region->inode != b.region_id.inode)
        return make_error(Errc::corrupt, "the region fd that came back is another file");
    if (auto w = driver::check_window(*region, b.region_id.offset, b.region_id.length); !w)
        return w.error();
    auto pidfd = pin_process(b.owner.pid, b.owner.start_time);
    if (!pidfd)
        return make_error(Errc::not_found, "its holder (pid " + std::to_string(b.owner.pid) +
                                               ") exited during the restart");
    std::map<std::string, UniqueFd> handles;
    for (auto &role : roles) {
        auto h = store_->take(id + "." + role);
        if (!h) return make_error(Errc::not_found, "its " + role + " handle did not come back");
        handles.emplace(role, std::move(*h));
    }
    if (driver_.netdev(b.netdev).ok() == false)
        return make_error(Errc::not_found, "its netdev " + b.netdev + " is gone");
    b.region = std::make_shared<UniqueFd>(fd->release());
    carried.grant = {id, b.owner.holder(), b.region_id, b.deadline};
    if (auto r = keys_.restore(b.key_id, carried); !r) return r.error();
    auto queues = driver_.readopt(
        {id, b.netdev, b.gpu, b.flows, b.region->get(), b.region_id.offset, b.region_id.length},
        active, driver_state, std::move(handles));
    if (!queues) {
        keys_.revoke(b.key_id);
        return std::move(queues).error().context("the " + driver_.name() + " driver");
    }
    b.queues = *queues;
    b.state = active ? BindingState::active : BindingState::granted;
    b.owner.pidfd = std::move(*pidfd);
    count_usage(b, +1);
    claims_.claim(b.netdev, id, b.owner.uid, b.flows);
    auto [pos, inserted] = bindings_.emplace(id, std::move(b));
    Binding &kept = pos->second;
    // systemd keeps what it handed back; storing again is harmless (it drops duplicates) and
    // covers a store that was emptied meanwhile.
    store_handles(kept);
    if (holders_) holders_->add(id, kept.owner.pid, kept.owner.start_time, kept.owner.pidfd);
    events_.binding_adopted(kept);
    kept.owner.pidfd.reset();
    journal::Event e = event_for(journal::kind::adopted, kept.owner);
    e.session_id = id;
    e.rule = kept.rule;
    e.reason = "taken back after a daemon restart";
    e.detail = knod::dump_json(nlohmann::json{{"state", to_string(kept.state)},
                                              {"queues", kept.queues},
                                              {"expires_us", kept.expires_us}});
    audit_.record(std::move(e));
    return {};
}

Result<void> BindingManager::throttle(const PrincipalKey &who, pid_t pid, bool exempt,
                                      const char *method) {
    auto now = std::chrono::steady_clock::now();
    bool whole_domain = false;
    if (exempt) return {};
    if (limiter_.admit(who, now)) {
        if (who.domain == "host" ||
            domain_limiter_.admit({who.domain, static_cast<uid_t>(-1)}, now))
            return {};
        whole_domain = true;
    }
    uid_t uid = who.uid;
    metrics_.rate_limited(method);
    journal::Event e;
    e.kind = journal::kind::rate_limited;
    e.uid = uid;
    e.pid = pid;
    e.reason = std::string(method) + " refused: over the per-user rate limit";
    e.detail = knod::dump_json(nlohmann::json{{"method", method}});
    audit_.refuse(std::move(e));
    char rate[64];
    std::snprintf(rate, sizeof rate, "%g per second (bursts of %g)", limiter_.per_second(),
                  limiter_.burst());
    if (whole_domain) {
        std::snprintf(rate, sizeof rate, "%g per second (bursts of %g)",
                      domain_limiter_.per_second(), domain_limiter_.burst());
        return make_error(Errc::quota_exceeded, "too many requests from " + who.domain +
                                                    " as a whole: at most " + rate +
                                                    " over all its uids; retry later");
    }
    return make_error(Errc::quota_exceeded, "too many requests from " + who.to_string() +
                                                ": at most " + rate +
                                                " per user, over all its connections; retry later");
}

Error BindingManager::refuse_limit(uid_t uid, pid_t pid, bool exempt, const char *method,
                                   const std::string &what) {
    metrics_.rate_limited(method);
    journal::Event e;
    e.kind = journal::kind::rate_limited;
    e.uid = uid;
    e.pid = pid;
    e.reason = std::string(method) + " refused: " + what;
    e.detail = knod::dump_json(nlohmann::json{{"method", method}, {"limit", what}});
    audit_.refuse(std::move(e), exempt);
    return make_error(Errc::limits_exceeded,
                      std::string("limits exceeded: uid ") + std::to_string(uid) + ": " + what);
}

policy::Usage BindingManager::usage_of(const PrincipalKey &who,
                                       const std::string &except_id) const {
    auto it = usage_.find(who);
    policy::Usage u = it == usage_.end() ? policy::Usage{} : it->second;
    // A live binding, or one in flight (which counts from its commit on).
    for (auto *from : {&bindings_, &inflight_})
        if (auto b = from->find(except_id);
            b != from->end() && b->second.owner.principal() == who) {
            u.bindings -= 1;
            u.bytes -= b->second.region_id.length;
        }
    return u;
}

std::size_t BindingManager::caller_fds() const {
    return bindings_.size() + 2 * inflight_.size() + (holders_ ? holders_->holders() : 0) +
           notified_.size();
}

void BindingManager::count_usage(const Binding &b, int sign) {
    PrincipalKey who = b.owner.principal();
    policy::Usage &u = usage_[who];
    u.bindings += static_cast<std::uint32_t>(sign);
    u.bytes += static_cast<std::uint64_t>(sign) * b.region_id.length;
    if (u.bindings == 0) usage_.erase(who);
}

void BindingManager::request(const Peer &caller, const RequestArgs &args, GrantDone done) {
    auto started = start_grant(caller, args, done);
    if (!started) done(started.error());
}

// parse -> decide -> prepare -> commit: each step refuses (journaled where the policy or the
// host refused) before the next one takes anything.
Result<void> BindingManager::start_grant(const Peer &caller, const RequestArgs &args,
                                         GrantDone &done) {
    if (auto r = throttle(caller.principal(), caller.pid, caller.root_in_host(), "RequestBinding");
        !r)
        return r.error();
    // The daemon-wide bounds before anything is parsed or taken: a refused caller leaves nothing.
    if (bindings_.size() + inflight_.size() >= config_.max_bindings)
        return refuse_limit(caller.uid, caller.pid, caller.root_in_host(), "RequestBinding",
                            "at most " + std::to_string(config_.max_bindings) +
                                " bindings (live and in flight) in all; retry later");
    // An abandoned grant (its caller left) still waits for its commit, its reply with it.
    if (inflight_.size() + abandoned_.size() >= config_.max_grants_in_flight)
        return refuse_limit(caller.uid, caller.pid, caller.root_in_host(), "RequestBinding",
                            "at most " + std::to_string(config_.max_grants_in_flight) +
                                " grants waiting for the journal in all; retry in a moment");
    // A grant takes a region fd and, for a new holder process, a pidfd.
    if (config_.max_caller_fds && caller_fds() + 2 > config_.max_caller_fds)
        return refuse_limit(
            caller.uid, caller.pid, caller.root_in_host(), "RequestBinding",
            "at most " + std::to_string(config_.max_caller_fds) +
                " fds held for callers in all (the daemon's fd limit); retry later");
    auto parsed = parse_request(caller, args);
    if (!parsed) {
        refuse_request(caller, args, parsed.error());
        return parsed.error();
    }
    auto decided = decide_request(caller, args, *parsed);
    if (!decided) return decided.error();
    auto prepared = prepare_grant(caller, args, *parsed, *decided);
    if (!prepared) return prepared.error();
    commit_grant(args, *decided, std::move(*prepared), done);
    return {};
}

// A request refused before the policy was asked (bad arguments, an unknown netdev or GPU, a
// region that is no region, no driver): journaled like every refusal, with the arguments as the
// caller sent them, escaped and cut (they may be anything up to the bus's message size).
void BindingManager::refuse_request(const Peer &caller, const RequestArgs &args, const Error &why) {
    constexpr std::size_t cut = 256;
    journal::Event e = event_for(journal::kind::denied, caller);
    e.decision = why.code == Errc::driver_failure ? "driver-failure" : "invalid-request";
    e.reason = escape_untrusted(why.message, Escape::value, 4 * cut);
    nlohmann::json flows = nlohmann::json::array();
    for (std::size_t i = 0; i < args.flows.size() && i < 4; ++i)
        flows.push_back(escape_untrusted(args.flows[i], Escape::value, cut));
    e.detail = knod::dump_json(
        nlohmann::json{{"netdev", escape_untrusted(args.netdev, Escape::value, cut)},
                       {"gpu", escape_untrusted(args.gpu, Escape::value, cut)},
                       {"mode", escape_untrusted(args.mode, Escape::value, cut)},
                       {"flows", flows},
                       {"flow_count", args.flows.size()},
                       {"exe", escape_untrusted(caller.executable)},
                       {"policy", policy_.digest}});
    audit_.refuse(std::move(e), caller.root_in_host());
}

// The caller's arguments, checked and read: sizes, mode, flows, the netdev and GPU the driver
// knows by those names, and what the region fd really is.
Result<BindingManager::ParsedRequest> BindingManager::parse_request(const Peer &caller,
                                                                    const RequestArgs &args) {

    // Sizes first: nothing below copies, parses or quotes more than these.
    for (auto check : {limits::check_length("netdev", args.netdev, limits::netdev),
                       limits::check_length("gpu", args.gpu, limits::gpu),
                       limits::check_length("mode", args.mode, limits::mode)})
        if (!check) return check.error();
    if (args.flows.size() > config_.max_flows)
        return make_error(Errc::invalid_argument,
                          "flows: at most " + std::to_string(config_.max_flows) + " per binding");
    for (std::size_t i = 0; i < args.flows.size(); ++i)
        if (auto c = limits::check_length("flows[" + std::to_string(i) + "]", args.flows[i],
                                          limits::flow);
            !c)
            return c.error();

    ParsedRequest parsed;
    policy::Request &req = parsed.request;
    req.caller = caller.caller();
    auto mode = policy::parse_mode(args.mode);
    if (!mode) return make_error(Errc::invalid_argument, "mode: must be rx-only, tx or rx-tx");
    req.mode = *mode;
    if (args.flows.empty())
        return make_error(Errc::invalid_argument, "flows: at least one flow spec is needed");
    for (std::size_t i = 0; i < args.flows.size(); ++i) {
        auto f = policy::parse_flow_spec(args.flows[i]);
        if (!f)
            return make_error(Errc::invalid_argument,
                              "flows[" + std::to_string(i) + "]: " + f.error().message);
        req.flows.push_back(*f);
    }
    if (auto r = resolve_devices(args.netdev, args.gpu, parsed); !r) return r.error();

    auto region = driver::inspect_region(args.region_fd);
    if (!region) return region.error();
    if (region->kind != driver_.region_kind())
        return make_error(Errc::invalid_argument, std::string("region: the ") + driver_.name() +
                                                      " driver needs a " +
                                                      driver::to_string(driver_.region_kind()) +
                                                      ", not a " + driver::to_string(region->kind));
    if (auto w = driver::check_window(*region, args.offset, args.length); !w) return w.error();
    req.region_bytes = args.length;
    parsed.region = *region;
    return parsed;
}

Result<void> BindingManager::resolve_devices(const std::string &netdev, const std::string &gpu,
                                             ParsedRequest &parsed) {
    // A host with nothing to drive: refused as a driver failure (journaled by the caller).
    if (auto why = driver_.unavailable()) return make_error(Errc::driver_failure, *why);
    auto n = driver_.netdev(netdev);
    if (!n) return n.error();
    auto g = driver_.gpu(gpu);
    if (!g) return g.error();
    parsed.request.netdev = n->name;
    parsed.request.gpu_names = g->names;
    parsed.netdev = std::move(*n);
    parsed.gpu = std::move(*g);
    return {};
}

// Policy, isolation on this host, exclusive flows, a journal that takes writes: the grant's
// event (granted) or the refusal, journaled.
Result<BindingManager::Decided> BindingManager::decide_request(const Peer &caller,
                                                               const RequestArgs &args,
                                                               const ParsedRequest &parsed) {
    const policy::Request &req = parsed.request;
    const driver::GpuInfo *gpu = &parsed.gpu;
    const driver::NetdevInfo *netdev = &parsed.netdev;
    Decided decided;
    policy::Decision &d = decided.decision;
    d = policy::decide(policy_, req, usage_of(caller.principal()));
    journal::Event &decision = decided.event;
    decision = event_for(d.granted() ? journal::kind::granted : journal::kind::denied, caller);
    decision.rule = d.rule.empty() ? std::nullopt : std::optional(d.rule);
    decision.decision = d.would_deny ? "would-deny" : policy::to_string(d.verdict);
    decision.reason = d.reason;
    nlohmann::json detail{{"netdev", req.netdev},
                          {"gpu", gpu->name},
                          {"mode", args.mode},
                          {"region_bytes", args.length},
                          {"flows", flows_json(req.flows)},
                          {"exe", escape_untrusted(caller.executable)},
                          {"unit", escape_untrusted(caller.unit)},
                          {"user_unit", escape_untrusted(caller.user_unit)},
                          {"gids", caller.gids},
                          {"process_proof", to_string(caller.process_proof)},
                          {"policy", policy_.digest}};
    if (caller.pod) detail["pod"] = pod_json(*caller.pod);
    decision.detail = knod::dump_json(detail);
    if (!d.granted()) {
        audit_.refuse(std::move(decision), caller.root_in_host());
        // Say why each rule missed, so the caller can act without an admin's help.
        std::string why = d.reason;
        for (std::size_t i = 0; i < d.misses.size() && i < 5; ++i)
            why += "; rule '" + d.misses[i].rule + "': " + d.misses[i].why_not;
        return make_error(d.verdict == policy::Verdict::quota_exceeded ? Errc::quota_exceeded
                                                                       : Errc::denied,
                          why);
    }
    // The rule's isolation requirement must hold on this host, whatever permissive mode says.
    host::Verdict iso = host::check(d.iommu, host_.device(netdev->pci), host_.device(gpu->pci));
    if (!iso.ok) {
        decision.kind = journal::kind::denied;
        decision.decision = "isolation-violation";
        decision.reason = iso.reason;
        audit_.refuse(std::move(decision), caller.root_in_host());
        return make_error(Errc::isolation_violation,
                          iso.reason + " (rule '" + d.rule + "' requires iommu = \"" +
                              policy::to_string(d.iommu) + "\"); fix: " + iso.fix);
    }
    // Flows are exclusive on a device: the first claimant (live, or granted and waiting for
    // the journal) keeps its traffic, whoever asks, so no binding silently takes another's.
    if (auto c = claims_.conflict(req.netdev, req.flows)) {
        std::string mine = "flows[" + std::to_string(c->requested) + "] '" +
                           req.flows[c->requested].to_string() + "'";
        decision.kind = journal::kind::denied;
        decision.decision = "flow-conflict";
        decision.reason = mine + " overlaps flow '" + c->held.to_string() + "' of binding " +
                          c->binding + " (uid " + std::to_string(c->owner) + ")";
        detail["conflicts_with"] = c->binding;
        decision.detail = knod::dump_json(detail);
        audit_.refuse(std::move(decision), caller.root_in_host());
        // Another user's binding is not named: the caller may not see it.
        std::string theirs = c->owner == caller.uid
                                 ? "flow '" + c->held.to_string() + "' of your binding " +
                                       c->binding + " on " + req.netdev +
                                       " (release it first, or ask for flows that do not overlap)"
                                 : "a flow of another user's binding on " + req.netdev;
        return make_error(Errc::flow_conflict, mine + " overlaps " + theirs +
                                                   "; flows on a device are exclusive and the "
                                                   "first binding keeps its traffic");
    }
    // Fail closed: without a journal that can take the grant, nothing is granted. Records still
    // waiting for the disk mean it is not taking writes now: refuse at once, never wait here.
    if (!audit_.journal()) {
        metrics_.refused(journal::kind::denied, "journal-unavailable"); // cannot be journaled
        return journal_error(make_error(Errc::journal_unavailable, "the journal cannot be opened"));
    }
    if (audit_.pending()) {
        metrics_.refused(journal::kind::denied, "journal-unavailable");
        audit_.flush_pending_async();
        return journal_error(
            make_error(Errc::journal_unavailable,
                       std::to_string(audit_.pending()) +
                           " earlier record(s) are still waiting for the disk; retry in a second"));
    }
    return decided;
}

// What the grant holds, taken in order and given back if a later part fails: an id, the
// daemon's own reference to the region, the key, the driver's queues.
Result<BindingManager::Prepared> BindingManager::prepare_grant(const Peer &caller,
                                                               const RequestArgs &args,
                                                               const ParsedRequest &parsed,
                                                               Decided &decided) {
    const policy::Request &req = parsed.request;
    const driver::GpuInfo *gpu = &parsed.gpu;
    const driver::RegionInfo *region = &parsed.region;
    const policy::Decision &d = decided.decision;
    journal::Event &decision = decided.event;
    auto fresh_id = new_binding_id();
    if (!fresh_id) return fresh_id.error();
    Binding b;
    b.id = std::move(*fresh_id);
    b.netdev = req.netdev;
    b.gpu = gpu->name;
    b.gpu_names = gpu->names;
    b.mode = req.mode;
    b.flows = req.flows;
    b.owner = caller;
    // A memfd is reopened, not duplicated: the daemon's own open file description, so flags the
    // caller sets later on its own (O_APPEND would make every write land at the end and grow
    // the file) never reach the daemon's writes. A dma-buf cannot be reopened; it is duplicated.
    int dup = region->kind == driver::RegionKind::memfd
                  ? ::open(("/proc/self/fd/" + std::to_string(args.region_fd)).c_str(),
                           O_RDWR | O_CLOEXEC)
                  : fcntl(args.region_fd, F_DUPFD_CLOEXEC, 3);
    if (dup < 0) return make_error(Errc::invalid_argument, "region: cannot take a reference to it");
    b.region = std::make_shared<UniqueFd>(dup);
    b.region_id = {region->device, region->inode, args.offset, args.length};
    b.rule = d.rule;
    b.created_us = journal::now_us();
    b.policy_generation = policy_generation_;
    auto lifetime = std::chrono::duration_cast<std::chrono::microseconds>(d.key_lifetime);
    b.expires_us = b.created_us + lifetime.count();
    b.deadline = BootClock::now() + lifetime;

    auto key = keys_.issue({b.id, caller.holder(), b.region_id, b.deadline});
    if (!key) return key.error();
    b.key_id = key->key_id;

    auto queues =
        driver_.attach({b.id, b.netdev, b.gpu, b.flows, b.region->get(), args.offset, args.length});
    if (!queues) {
        keys_.revoke(b.key_id);
        decision.kind = journal::kind::denied;
        decision.decision = "driver-failure";
        decision.reason = queues.error().message;
        audit_.refuse(std::move(decision), caller.root_in_host());
        return make_error(Errc::driver_failure, queues.error().message);
    }
    b.queues = *queues;
    return Prepared{std::move(b), key->key};
}

// The session row and the grant event in one commit; the key goes to the caller only once
// they are durable (finish_grant). Meanwhile the binding counts against quotas and flows.
void BindingManager::commit_grant(const RequestArgs &args, const Decided &decided,
                                  Prepared prepared, GrantDone &done) {
    Binding &b = prepared.binding;
    const Peer &caller = b.owner;
    journal::Session s;
    s.id = b.id;
    s.uid = caller.uid;
    s.pid = caller.pid;
    s.exe = escape_untrusted(caller.executable); // bytes from /proc: kept readable, never raw
    s.unit = escape_untrusted(caller.unit);
    s.netdev = b.netdev;
    s.gpu = b.gpu;
    s.mode = args.mode;
    s.region_bytes = args.length;
    for (auto &f : b.flows)
        s.flows.push_back(f.to_string());
    s.key_id = b.key_id;
    s.rule = b.rule;
    s.started_us = b.created_us;
    Granted g{b.id, b.key_id, prepared.key, b.rule, decided.event.decision.value_or("allow")};
    std::string id = b.id;
    count_usage(b, +1); // in flight counts: concurrent requests cannot slip past a quota
    claims_.claim(b.netdev, id, b.owner.uid, b.flows);
    inflight_.emplace(id, std::move(b));
    audit_.open_session(
        s, decided.event,
        // Runs on the journal's writer thread, which then drops this closure: `done` (it holds
        // the caller's bus message) moves on to the loop, so no sd-bus reference is ever
        // released on the writer thread (sd-bus counts its references without atomics; one such
        // release once left the bus's count short, and bus_free() aborted on a live slot).
        [this, id, g = std::move(g), done = std::move(done)](Result<std::int64_t> r) mutable {
            post_([this, id, g = std::move(g), done = std::move(done), r = std::move(r)]() mutable {
                finish_grant(id, g, std::move(r), done);
            });
        });
}

void BindingManager::finish_grant(const std::string &id, Granted g, Result<std::int64_t> written,
                                  const GrantDone &done) {
    // Decided again at commit: whatever changed while the journal wrote (a reload, a pod's
    // DEL) has the last word before the key leaves (issue #51).
    if (auto it = inflight_.find(id); it != inflight_.end() && written)
        if (auto no = still_granted(it->second)) abandon_grant(id, no->why, no->note);
    if (auto gone = abandoned_.find(id); gone != abandoned_.end()) {
        // The grant was withdrawn while in flight: the data path, key, quota and flows went at
        // once (abandon_grant); here the session, if it reached the disk, is closed.
        Abandoned a = std::move(gone->second);
        abandoned_.erase(gone);
        if (written) close_session(a.binding, a.why, {}, {}, a.note);
        if (a.why == EndReason::disconnect || a.why == EndReason::process_exit)
            return done(make_error(Errc::denied, std::string("the caller went away (") +
                                                     to_string(a.why) +
                                                     ") before its grant was durable"));
        return done(make_error(Errc::denied, std::string("the grant was withdrawn before it was "
                                                         "durable (") +
                                                 to_string(a.why) + ")" +
                                                 (a.note.empty() ? "" : ": " + a.note) +
                                                 "; nothing is granted"));
    }
    auto it = inflight_.find(id);
    if (it == inflight_.end()) return done(make_error(Errc::unavailable, "the daemon is stopping"));
    Binding b = std::move(it->second);
    inflight_.erase(it);
    // The caller's process may have exited meanwhile, its connection kept by another process
    // (a child): the key is not handed out, the session ends at once.
    bool exited = written && b.owner.pidfd && !still_running(b.owner.pidfd->get());
    if (!written || exited) {
        count_usage(b, -1);
        claims_.release(b.id);
        driver_.detach(b.id);
        keys_.revoke(b.key_id);
    }
    if (exited) {
        close_session(b, EndReason::process_exit, {}, {});
        return done(make_error(Errc::denied, "the calling process exited before its grant was "
                                             "durable; nothing is granted"));
    }
    if (!written) {
        // Kept for the retry at the next tick: while it waits, every new request is refused at
        // once, so later callers do not each wait out the busy timeout.
        metrics_.refused(journal::kind::denied, "journal-unavailable");
        journal::Event e = event_for(journal::kind::denied, b.owner);
        e.decision = "journal-unavailable";
        e.reason = "granted by rule '" + b.rule + "' but not recorded: " + written.error().message;
        e.detail = knod::dump_json(
            nlohmann::json{{"netdev", b.netdev}, {"gpu", b.gpu}, {"policy", policy_.digest}});
        audit_.forward(e, b.netdev, b.gpu);
        audit_.keep(std::move(e));
        return done(journal_error(written.error()));
    }
    auto [pos, inserted] = bindings_.emplace(b.id, std::move(b));
    store_handles(pos->second);
    const Peer &holder = pos->second.owner;
    if (holders_) holders_->add(pos->first, holder.pid, holder.start_time, holder.pidfd);
    events_.binding_created(pos->second);
    // The start time names the holder from now on; the watch keeps a pidfd per process.
    pos->second.owner.pidfd.reset();
    metrics_.granted(g.decision);
    done(std::move(g));
}

Result<void> BindingManager::activate(const std::string &id, const Peer &presenter,
                                      std::span<const std::uint8_t> key) {
    if (auto r =
            throttle(presenter.principal(), presenter.pid, presenter.root_in_host(), "Activate");
        !r)
        return r.error();
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return make_error(Errc::not_found, "no binding " + quote_untrusted(id));
    Binding &b = it->second;
    auto ok = keys_.verify(b.key_id, key, presenter.holder(), b.region_id);
    if (!ok) {
        refuse_on_binding(journal::kind::activate_refused, presenter, id, "key-refused",
                          ok.error().message);
        return make_error(Errc::denied, "key refused: " + ok.error().message);
    }
    if (b.state == BindingState::active) return {};
    if (auto r = driver_.activate(id); !r) {
        // A refusal like a wrong key (same kind, coalesced per uid), told apart by decision.
        refuse_on_binding(journal::kind::activate_refused, presenter, id, "driver-failure",
                          escape_untrusted(r.error().message, Escape::message));
        return make_error(Errc::driver_failure, r.error().message);
    }
    b.state = BindingState::active;
    store_handles(b); // a driver may hold a kernel handle of its own from now on
    journal::Event e = event_for("activated", presenter);
    e.session_id = id;
    audit_.record(std::move(e));
    return {};
}

Result<BindingManager::RxNotifier> BindingManager::rx_notifier(const std::string &id,
                                                               const Peer &presenter,
                                                               std::span<const std::uint8_t> key) {
    if (auto r =
            throttle(presenter.principal(), presenter.pid, presenter.root_in_host(), "RxNotifier");
        !r)
        return r.error();
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return make_error(Errc::not_found, "no binding " + quote_untrusted(id));
    // Only the holder may learn when data lands: the same key check as Activate, not journaled
    // (it grants nothing), but rate-limited like every call.
    if (auto ok = keys_.verify(it->second.key_id, key, presenter.holder(), it->second.region_id);
        !ok)
        return make_error(Errc::denied, "key refused: " + ok.error().message);
    if (!notified_.count(id)) { // a second one replaces the first: no new pipe to bound
        std::string what;
        if (notified_.size() >= config_.max_notifiers)
            what = "at most " + std::to_string(config_.max_notifiers) +
                   " bindings with a notifier pipe in all; poll RxBytes instead, or retry later";
        else if (config_.max_caller_fds && caller_fds() + 1 > config_.max_caller_fds)
            what = "at most " + std::to_string(config_.max_caller_fds) +
                   " fds held for callers in all (the daemon's fd limit); poll RxBytes instead";
        if (!what.empty())
            return refuse_limit(presenter.uid, presenter.pid, presenter.root_in_host(),
                                "RxNotifier", what);
    }
    auto fd = driver_.rx_notifier(id);
    if (!fd) return fd.error();
    notified_.insert(id);
    // One loop thread: no payload lands between these two lines, so the starting RxBytes and
    // the totals the pipe carries from here agree.
    return RxNotifier{std::move(*fd), driver_.counters(id).rx_bytes};
}

Result<void> BindingManager::set_job(const std::string &id, const Peer &presenter,
                                     std::span<const std::uint8_t> key, const JobTag &tag) {
    if (auto r = throttle(presenter.principal(), presenter.pid, presenter.root_in_host(), "SetJob");
        !r)
        return r.error();
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return make_error(Errc::not_found, "no binding " + quote_untrusted(id));
    Binding &b = it->second;
    // Refusals are journaled and coalesced per uid like Renew's: a wrong key is someone
    // presenting bytes for a binding that is not theirs, worth an auditor's eye.
    auto refused = [&](Errc code, const char *decision, const std::string &why) -> Error {
        refuse_on_binding("job-tag-refused", presenter, id, decision, why);
        return make_error(code, why);
    };
    // Only the holder may say which job its binding serves: the same key check as Activate.
    if (auto ok = keys_.verify(b.key_id, key, presenter.holder(), b.region_id); !ok)
        return refused(Errc::denied, "key-refused", "key refused: " + ok.error().message);
    if (b.job)
        return refused(Errc::invalid_argument, "invalid-request",
                       "binding " + id + " is already tagged with job '" + b.job->job +
                           "', group '" + b.job->group + "', rank " + std::to_string(b.job->rank) +
                           " (a binding is tagged once)");
    if (auto r = check_job_tag(tag); !r)
        return refused(Errc::invalid_argument, "invalid-request", r.error().message);
    b.job = tag;
    journal::Event e = event_for(journal::kind::job_tagged, presenter);
    e.session_id = id;
    e.detail =
        knod::dump_json(nlohmann::json{{"job", tag.job}, {"group", tag.group}, {"rank", tag.rank}});
    audit_.record(std::move(e));
    return {};
}

policy::Decision BindingManager::decide_again(const Binding &b) const {
    policy::Request req;
    req.caller = b.owner.caller();
    req.netdev = b.netdev;
    req.gpu_names = b.gpu_names;
    req.mode = b.mode;
    req.region_bytes = b.region_id.length;
    req.flows = b.flows;
    return policy::decide(policy_, req, usage_of(b.owner.principal(), b.id));
}

Result<std::int64_t> BindingManager::renew(const std::string &id, const Peer &presenter,
                                           std::span<const std::uint8_t> key) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return make_error(Errc::not_found, "no binding " + id);
    Binding &b = it->second;
    // Refusals are coalesced per uid like every other kind: a holder (or an auditor, who sees
    // every binding) looping on Renew grows the journal no faster than any refused caller.
    auto refused = [&](Errc code, const std::string &why) -> Error {
        refuse_on_binding("renew-refused", presenter, id, std::nullopt, why);
        return make_error(code, why);
    };
    if (auto ok = keys_.verify(b.key_id, key, presenter.holder(), b.region_id); !ok)
        return refused(Errc::denied, "key refused: " + ok.error().message);
    policy::Decision d = decide_again(b);
    if (!d.granted())
        return refused(Errc::denied,
                       "the current policy no longer grants this binding: " + d.reason);
    auto boot_now = BootClock::now();
    auto deadline =
        std::max(boot_now + std::chrono::duration_cast<std::chrono::microseconds>(d.key_lifetime),
                 b.deadline); // renewing never shortens
    if (auto r = keys_.extend(b.key_id, deadline); !r)
        return refused(r.error().code, r.error().message);
    b.deadline = deadline;
    std::int64_t until = journal::now_us() + (deadline - boot_now).count();
    b.expires_us = until;
    journal::Event e = event_for("renewed", presenter);
    e.session_id = id;
    e.rule = d.rule;
    e.detail = knod::dump_json(nlohmann::json{{"expires_us", until}, {"policy", policy_.digest}});
    audit_.record(std::move(e));
    return until;
}

void BindingManager::close_session(const Binding &b, EndReason why, const driver::Counters &c,
                                   Done durable, const std::string &seen) {
    journal::Event e = event_for(journal::kind::ended, b.owner);
    e.reason = to_string(why);
    nlohmann::json detail{{"rx_bytes", c.rx_bytes},
                          {"rx_packets", c.rx_packets},
                          {"dropped_packets", c.dropped_packets}};
    // What the driver saw (steering drift): the daemon's own words, bounded like a reason.
    if (!seen.empty()) detail["seen"] = seen.substr(0, limits::reason);
    if (b.owner.pod) detail["pod"] = pod_json(*b.owner.pod);
    e.detail = knod::dump_json(detail);
    if (why == EndReason::policy_reload) audit_.name_policy(e); // the policy that ended it
    // The journal's own copy of the figures: the journal does not know the driver.
    journal::Counters row{c.rx_bytes, c.rx_packets, c.dropped_packets};
    audit_.close_session(b.id, to_string(why), row, std::move(e), b.netdev, b.gpu,
                         std::move(durable));
}

void BindingManager::end_binding(const std::string &id, EndReason why, Done durable,
                                 const std::string &note) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    // Stop the data path and kill the key first: security does not wait for the disk.
    driver::Counters c = driver_.counters(id);
    driver_.detach(id);
    keys_.revoke(it->second.key_id);
    close_session(it->second, why, c, std::move(durable),
                  why == EndReason::steering_drift ? note : std::string());
    metrics_.ended(why, it->second.netdev, it->second.gpu, c);
    count_usage(it->second, -1);
    claims_.release(id);
    if (store_)
        for (auto &name : it->second.stored)
            store_->remove(name);
    if (holders_) holders_->remove(id, it->second.owner.pid, it->second.owner.start_time);
    notified_.erase(id); // the driver closed its pipe in detach()
    Binding ended = std::move(it->second);
    bindings_.erase(it);
    events_.binding_ended(ended, why, note);
}

void BindingManager::release(const std::string &id, const Peer &by, bool privileged, Done done) {
    auto it = bindings_.find(id);
    if (it == bindings_.end())
        return done(make_error(Errc::not_found, "no binding " + quote_untrusted(id)));
    if (!privileged && (it->second.owner.uid != by.uid || it->second.owner.domain() != by.domain()))
        return done(make_error(Errc::denied, "binding " + id + " belongs to uid " +
                                                 std::to_string(it->second.owner.uid) +
                                                 "; only its owner or an admin may release it"));
    end_binding(id, EndReason::release, std::move(done));
}

void BindingManager::revoke(const std::string &id, const std::string &why, const Peer &by,
                            Done done) {
    bool in_flight = inflight_.count(id) != 0;
    if (!bindings_.count(id) && !in_flight)
        return done(make_error(Errc::not_found, "no binding " + quote_untrusted(id)));
    journal::Event e = event_for(journal::kind::revoked, by);
    e.session_id = id;
    e.reason = escape_untrusted(why.substr(0, limits::reason), Escape::message);
    audit_.record(std::move(e));
    if (in_flight) { // its session is closed once it is on disk (finish_grant)
        abandon_grant(id, EndReason::revoke, escape_untrusted(why, Escape::message, 256));
        return done({});
    }
    end_binding(id, EndReason::revoke, std::move(done), why);
}

void BindingManager::refuse_action(const char *kind, const Peer &by, const std::string &decision,
                                   const std::string &why,
                                   const std::optional<std::string> &binding) {
    journal::Event e = event_for(kind, by);
    e.decision = decision;
    e.reason = escape_untrusted(why.substr(0, limits::reason), Escape::message);
    // The caller's text, not necessarily a binding that exists: detail only, escaped.
    if (binding)
        e.detail = knod::dump_json(nlohmann::json{{"binding", escape_untrusted(*binding)}});
    audit_.name_policy(e); // the policy in force: it names who may administer (admin_group)
    audit_.refuse(std::move(e), by.root_in_host());
}

void BindingManager::refuse_on_binding(const char *kind, const Peer &presenter,
                                       const std::string &id, std::optional<std::string> decision,
                                       std::string reason) {
    journal::Event e = event_for(kind, presenter);
    e.session_id = id;
    e.decision = std::move(decision);
    e.reason = std::move(reason);
    audit_.name_policy(e);
    audit_.refuse(std::move(e), presenter.root_in_host());
}

Result<std::size_t> BindingManager::reload(policy::Policy next, const Peer &by,
                                           const std::string &via) {
    // Every setting takes effect now, or the reload is refused and the old policy stays.
    if (auto r = apply_settings(next.settings); !r) {
        auto err = make_error(r.error().code, r.error().message + "; the old policy stays");
        refuse_action(journal::kind::reload_refused, by, "invalid-policy",
                      via + ": " + err.message);
        return err;
    }
    policy_ = std::move(next);
    policy_generation_ += 1;
    if (policy_.digest.empty()) policy_.digest = policy::policy_digest(policy_.text);
    std::vector<std::string> doomed;
    for (auto &[id, b] : bindings_) {
        if (!decide_again(b).granted()) doomed.push_back(id);
    }
    std::vector<std::string> withdrawn; // in flight: never handed out
    for (auto &[id, b] : inflight_)
        if (!decide_again(b).granted()) withdrawn.push_back(id);
    for (auto &id : withdrawn)
        abandon_grant(id, EndReason::policy_reload);
    journal::Event e = event_for(journal::kind::reload, by);
    e.reason = "reloaded by " + via; // as before: "uid N" (D-Bus) or "SIGHUP"
    e.detail = knod::dump_json(nlohmann::json{{"rules", policy_.rules.size()},
                                              {"revoked", doomed},
                                              {"withdrawn", withdrawn},
                                              {"files", policy_files(policy_)}});
    audit_.record_load(std::move(e));
    for (auto &id : doomed)
        end_binding(id, EndReason::policy_reload);
    events_.policy_reloaded(policy_.rules.size(), doomed.size() + withdrawn.size());
    return doomed.size() + withdrawn.size();
}

Result<std::size_t> BindingManager::reload(const Peer &by, const std::string &via) {
    auto next = loader_ ? loader_()
                        : Result<policy::Policy>(
                              make_error(Errc::unsupported, "this daemon has no policy files"));
    if (!next) {
        refuse_action(journal::kind::reload_refused, by, "invalid-policy",
                      via + ": " + next.error().message);
        return next.error();
    }
    return reload(std::move(*next), by, via);
}

void BindingManager::holder_gone(const std::string &id, EndReason why) {
    end_binding(id, why);
}

template <typename Pred> std::size_t BindingManager::withdraw_grants(Pred which, EndReason why) {
    std::vector<std::string> ids;
    for (auto &[id, b] : inflight_)
        if (which(b)) ids.push_back(id);
    for (auto &id : ids)
        abandon_grant(id, why);
    return ids.size();
}

std::optional<BindingManager::Withdrawal> BindingManager::still_granted(const Binding &b) const {
    if (!b.owner.pod_sandbox.empty() && !pods_.has_container(b.owner.pod_sandbox))
        return Withdrawal{EndReason::pod_deleted, "its pod's sandbox was deleted"};
    if (b.policy_generation == policy_generation_) return std::nullopt; // decided under it
    if (policy::Decision d = decide_again(b); !d.granted())
        return Withdrawal{EndReason::policy_reload, "the policy in force refuses it: " + d.reason};
    return std::nullopt;
}

void BindingManager::abandon_grant(const std::string &id, EndReason why, const std::string &note) {
    auto it = inflight_.find(id);
    if (it == inflight_.end()) return;
    driver_.detach(id);
    keys_.revoke(it->second.key_id);
    count_usage(it->second, -1);
    claims_.release(id);
    // Its fds go now too: only the session row waits for the commit, and a caller that asks and
    // leaves in a loop must not keep regions and pidfds open while the journal is slow.
    it->second.region.reset();
    it->second.owner.pidfd.reset();
    abandoned_.emplace(id, Abandoned{std::move(it->second), why, note});
    inflight_.erase(it);
}

void BindingManager::connection_gone(const std::string &bus_name) {
    std::vector<std::string> gone;
    for (auto &[id, b] : inflight_)
        if (b.owner.bus_name == bus_name) gone.push_back(id);
    for (auto &id : gone)
        abandon_grant(id, EndReason::disconnect);
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        if (b.owner.bus_name == bus_name) ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, EndReason::disconnect);
}

void BindingManager::hold_on(const std::string &id, const std::string &bus_name) {
    auto it = bindings_.find(id);
    if (it == bindings_.end()) return;
    it->second.owner.bus_name = bus_name;
    journal::Event e = event_for(journal::kind::holder_returned, it->second.owner);
    e.session_id = id;
    e.rule = it->second.rule;
    e.reason = "its holder process connected again after a daemon restart";
    audit_.record(std::move(e));
}

void BindingManager::netdev_gone(const std::string &netdev, EndReason why) {
    withdraw_grants([&](const Binding &b) { return b.netdev == netdev; }, why);
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        if (b.netdev == netdev) ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, why);
}

Result<void> BindingManager::check_pod(const PodSandbox &sandbox, const PodOffload &wants) {
    ParsedRequest parsed;
    policy::Request &req = parsed.request;
    req.caller.pod = sandbox.pod;
    req.caller.uid_known = false;
    req.caller.process_proven = false;
    req.region_bytes = wants.region_bytes;
    if (wants.flows.empty() || wants.flows.size() > config_.max_flows)
        return make_error(Errc::invalid_argument,
                          std::string(policy::pod_annotation_prefix) + "flows: 1 to " +
                              std::to_string(config_.max_flows) + " flow specs");
    for (auto &text : wants.flows) {
        auto f = policy::parse_flow_spec(text);
        if (!f)
            return make_error(Errc::invalid_argument, std::string(policy::pod_annotation_prefix) +
                                                          "flows: " + f.error().message);
        req.flows.push_back(*f);
    }
    if (auto r = resolve_devices(wants.netdev, wants.gpu, parsed); !r) return r.error();
    policy::Decision d = policy::decide(policy_, req, {});
    if (d.granted() && !d.would_deny) return {};
    journal::Event e;
    e.kind = journal::kind::pod_refused;
    e.rule = d.rule.empty() ? std::nullopt : std::optional(d.rule);
    e.decision = d.would_deny ? "would-deny" : policy::to_string(d.verdict);
    e.reason = d.reason;
    nlohmann::json detail{{"pod", pod_json(sandbox.pod)},
                          {"sandbox", sandbox.container_id},
                          {"netdev", req.netdev},
                          {"gpu", parsed.gpu.name},
                          {"region_bytes", wants.region_bytes},
                          {"flows", flows_json(req.flows)},
                          {"policy", policy_.digest}};
    e.detail = knod::dump_json(detail);
    if (d.would_deny) { // permissive: the pod starts, the journal says it would not have
        audit_.record(std::move(e));
        return {};
    }
    audit_.refuse(std::move(e));
    std::string why = d.reason;
    for (std::size_t i = 0; i < d.misses.size() && i < 5; ++i)
        why += "; rule '" + d.misses[i].rule + "': " + d.misses[i].why_not;
    return make_error(Errc::denied, "pod " + sandbox.pod.k8s_namespace + "/" + sandbox.pod.name +
                                        " asks for offload the policy refuses: " + why);
}

std::size_t BindingManager::pod_deleted(const std::string &container_id,
                                        const std::string &ifname) {
    return end_pods_gone(pods_.remove(container_id, ifname)); // none: a repeated DEL
}

std::size_t
BindingManager::pods_collected(const std::string &network,
                               const std::set<std::pair<std::string, std::string>> &valid,
                               std::size_t &ended) {
    auto gone = pods_.collect(network, valid);
    std::size_t n = gone.size();
    ended = end_pods_gone(std::move(gone));
    return n;
}

std::size_t BindingManager::end_pods_gone(std::vector<PodSandbox> gone) {
    std::set<std::string> containers;
    for (auto &s : gone)
        containers.insert(s.container_id);
    // A pod on several networks keeps its identity until its last registration goes.
    for (auto *left : pods_.all())
        containers.erase(left->container_id);
    auto of_a_pod_gone = [&](const Binding &b) {
        return !b.owner.pod_sandbox.empty() && containers.count(b.owner.pod_sandbox);
    };
    std::size_t withdrawn = withdraw_grants(of_a_pod_gone, EndReason::pod_deleted);
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        if (of_a_pod_gone(b)) ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, EndReason::pod_deleted);
    return ids.size() + withdrawn;
}

void BindingManager::tick(std::int64_t now_us, BootClock::time_point boot_now) {
    std::vector<std::string> expired;
    for (auto &[id, b] : bindings_)
        if (b.deadline <= boot_now) expired.push_back(id);
    for (auto &id : expired)
        end_binding(id, EndReason::expire);
    for (auto &[id, seen] : driver_.drifted())
        if (bindings_.count(id)) end_binding(id, EndReason::steering_drift, {}, seen);
    keys_.expire(boot_now);
    audit_.tick(now_us);
}

void BindingManager::shutdown() {
    audit_.stop();
    std::vector<std::string> ids;
    for (auto &[id, b] : bindings_)
        ids.push_back(id);
    for (auto &id : ids)
        end_binding(id, EndReason::daemon_stop);
    journal::Event e;
    e.kind = journal::kind::daemon_stop;
    audit_.finish(std::move(e));
}

std::size_t BindingManager::keep_pods() {
    journal::Journal *journal = audit_.journal();
    if (!store_ || !journal || pods_.size() == 0) return 0;
    auto hex = [](const std::string &s) {
        return to_hex({reinterpret_cast<const std::uint8_t *>(s.data()), s.size()});
    };
    nlohmann::json pods = nlohmann::json::array();
    std::size_t n = 0;
    for (const PodSandbox *s : pods_.all()) {
        std::string handle = "pod-" + std::to_string(n) + ".netns";
        if (!s->netns_fd || !store_->store(handle, s->netns_fd->get())) continue;
        ++n;
        nlohmann::json annotations = nlohmann::json::object();
        for (auto &[k, v] : s->pod.annotations) // values are the pod spec's bytes: as hex
            annotations[k] = hex(v);
        pods.push_back({{"handle", handle},
                        {"container_id", s->container_id},
                        {"ifname", s->ifname},
                        {"network", s->network},
                        {"netns_dev", static_cast<std::uint64_t>(s->netns.dev)},
                        {"netns_ino", static_cast<std::uint64_t>(s->netns.ino)},
                        {"namespace", s->pod.k8s_namespace},
                        {"name", s->pod.name},
                        {"uid", s->pod.uid},
                        {"annotations", annotations},
                        {"registered_us", s->registered_us}});
    }
    // Unique per stop (uniqueness, not secrecy: the MAC vouches for the record).
    std::array<std::uint8_t, 16> token{};
    if (RAND_bytes(token.data(), static_cast<int>(token.size())) != 1) {
        auto t = static_cast<std::uint64_t>(journal::now_us());
        auto p = static_cast<std::uint64_t>(::getpid());
        std::memcpy(token.data(), &t, sizeof t);
        std::memcpy(token.data() + 8, &p, sizeof p);
    }
    pods_token_ = to_hex(token);
    nlohmann::json record{{"version", 1},
                          {"journal_id", journal->identity().journal_id},
                          {"stop", pods_token_},
                          {"pods", pods}};
    record = knod::parse_json(knod::dump_json(record));
    record["mac"] = to_hex(keys_.seal(pods_handoff_purpose, handoff_canonical(record)));
    std::string text = knod::dump_json(record);
    UniqueFd fd(::memfd_create("knod-pods-handoff", MFD_CLOEXEC));
    bool written = fd.valid() &&
                   ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
    if (!written || !store_->store(pods_handoff_name, fd.get())) {
        std::cerr << "knod-policyd: the pod registrations could not be kept for the next start; "
                     "running pods are unknown to it until the runtime registers them again"
                  << std::endl;
        pods_token_.clear();
        return 0;
    }
    return n;
}

std::size_t BindingManager::restore_pods() {
    if (!store_) return 0;
    auto fd = store_->take(pods_handoff_name);
    if (!fd) return 0;
    auto refuse = [](const std::string &why) {
        std::cerr << "knod-policyd: pod registrations not taken back: " << why << std::endl;
        return std::size_t{0};
    };
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0 || st.st_size <= 0 || st.st_size > (16 << 20))
        return refuse("the record is empty or too large");
    std::string text(static_cast<std::size_t>(st.st_size), '\0');
    if (::pread(fd->get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
        return refuse("the record cannot be read");
    auto record = knod::parse_json(text);
    if (!record.is_object()) return refuse("the record is not a JSON object");
    auto mac = record.find("mac");
    auto mac_bytes = mac != record.end() && mac->is_string()
                         ? from_hex(mac->get<std::string>())
                         : std::optional<std::vector<std::uint8_t>>();
    if (!mac_bytes || !keys_.sealed(pods_handoff_purpose, handoff_canonical(record), *mac_bytes))
        return refuse("the record does not match its MAC (edited, or another key secret)");
    journal::Journal *journal = audit_.journal();
    if (!journal || record.value("journal_id", nlohmann::json()) != journal->identity().journal_id)
        return refuse("the record was written for another journal");
    // Fresh: the journal's last stop wrote this very record, and nothing started since.
    auto stop = journal->last_stop_detail();
    if (!stop) return refuse("the journal's last stop cannot be read: " + stop.error().message);
    auto stop_detail = *stop ? knod::parse_json(**stop) : nlohmann::json();
    auto token = record.find("stop");
    if (token == record.end() || !token->is_string() || !stop_detail.is_object() ||
        stop_detail.value("pods_record", nlohmann::json()) != *token)
        return refuse("the record is not the journal's last stop's (an older one, replayed, or "
                      "a daemon started since)");
    std::size_t restored = 0;
    try {
        for (auto &p : record.at("pods")) {
            PodSandbox s;
            s.container_id = p.at("container_id").get<std::string>();
            s.ifname = p.at("ifname").get<std::string>();
            s.network = p.at("network").get<std::string>();
            s.netns = {static_cast<dev_t>(p.at("netns_dev").get<std::uint64_t>()),
                       static_cast<ino_t>(p.at("netns_ino").get<std::uint64_t>())};
            s.pod.k8s_namespace = p.at("namespace").get<std::string>();
            s.pod.name = p.at("name").get<std::string>();
            s.pod.uid = p.at("uid").get<std::string>();
            for (auto &[k, v] : p.at("annotations").items()) {
                auto bytes = from_hex(v.get<std::string>());
                if (!bytes) throw std::runtime_error("bad hex");
                s.pod.annotations[k] = std::string(bytes->begin(), bytes->end());
            }
            s.registered_us = p.at("registered_us").get<std::int64_t>();
            auto ns = store_->take(p.at("handle").get<std::string>());
            // The fd must still be that very namespace: it was held open, so its inode was
            // never handed to another.
            struct stat at {};
            if (!ns || ::ioctl(ns->get(), NS_GET_NSTYPE) != CLONE_NEWNET ||
                ::fstat(ns->get(), &at) != 0 || at.st_dev != s.netns.dev ||
                at.st_ino != s.netns.ino) {
                std::cerr << "knod-policyd: pod sandbox "
                          << escape_untrusted(s.container_id, Escape::value, 64)
                          << " not taken back: its network namespace did not come back"
                          << std::endl;
                continue;
            }
            s.netns_fd = std::make_shared<UniqueFd>(std::move(*ns));
            if (auto added = pods_.add(std::move(s)); added)
                ++restored;
            else
                std::cerr << "knod-policyd: a pod sandbox not taken back: " << added.error().message
                          << std::endl;
        }
    } catch (const std::exception &) {
        return refuse("the record is malformed") + restored;
    }
    return restored;
}

std::size_t BindingManager::hand_off() {
    audit_.stop();
    std::size_t pods_kept = keep_pods();
    std::map<std::string, std::string> rows;
    std::vector<std::string> ending;
    for (auto &[id, b] : bindings_) {
        auto state = driver_.handoff(id);
        bool stored = std::find(b.stored.begin(), b.stored.end(), id + ".region") != b.stored.end();
        std::string row = state && stored ? handoff_of(b, *state) : std::string();
        if (row.empty())
            ending.push_back(id);
        else
            rows.emplace(id, std::move(row));
    }
    (void)audit_.flush_pending_now();
    if (!rows.empty() && !(audit_.journal() && audit_.journal()->hand_off(rows))) {
        // Not on disk: the next start could not take them back, so they end now as before.
        for (auto &[id, row] : rows)
            ending.push_back(id);
        rows.clear();
    }
    for (auto &id : ending)
        end_binding(id, EndReason::daemon_stop);
    journal::Event e;
    e.kind = journal::kind::daemon_stop;
    e.reason = std::to_string(rows.size()) +
               " binding(s) handed to systemd's file-descriptor store for the next start";
    nlohmann::json stop_detail{
        {"handed_over", rows.size()}, {"ended", ending.size()}, {"pods_kept", pods_kept}};
    if (pods_kept > 0 && !pods_token_.empty()) stop_detail["pods_record"] = pods_token_;
    e.detail = knod::dump_json(stop_detail);
    audit_.finish(std::move(e));
    // The handed-over bindings stay as they are: no detach, no revoke, their sessions open.
    // The process exit closes the daemon's copies of their fds; systemd holds its own.
    return rows.size();
}

const Binding *BindingManager::find(const std::string &id) const {
    auto it = bindings_.find(id);
    return it == bindings_.end() ? nullptr : &it->second;
}

std::vector<const Binding *> BindingManager::bindings() const {
    std::vector<const Binding *> out;
    for (auto &[id, b] : bindings_)
        out.push_back(&b);
    return out;
}

ManagerStatus BindingManager::status() const {
    const sinks::SinkQueue *sinks = audit_.sinks();
    return {bindings_.size(),
            audit_.open() && audit_.pending() == 0,
            audit_.pending(),
            audit_.dropped(),
            sinks ? sinks->dropped() : 0,
            sinks ? sinks->names() : std::vector<std::string>{},
            sinks ? sinks->stats() : std::vector<sinks::SinkStats>{}};
}

} // namespace knod::daemon
