#include "client/client.h"

#include "knod/untrusted.h"
#include "protocol/names.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>

namespace knod::client {
namespace {

using bus::binding_interface;
using bus::manager_interface;
using bus::manager_path;
using bus::service_name;

struct Reply {
    sd_bus_message *m = nullptr;
    sd_bus_error e = SD_BUS_ERROR_NULL;
    ~Reply() {
        sd_bus_message_unref(m);
        sd_bus_error_free(&e);
    }
};

// What a forked child is told when it uses its parent's client (sd-bus says only ECHILD).
Error forked_error(std::optional<pid_t> creator) {
    return make_error(
        Errc::invalid_argument,
        "this knod client was created in " +
            (creator ? "process " + std::to_string(*creator) : std::string("another process")) +
            " and this is process " + std::to_string(::getpid()) +
            ": a forked child must create its own knod client (a D-Bus connection "
            "belongs to the process that opened it)");
}

Error bus_failure(const sd_bus_error &e, int r, const char *what) {
    if (sd_bus_error_is_set(&e) && sd_bus_error_has_name(&e, "System.Error.ECHILD"))
        return forked_error(std::nullopt);
    if (sd_bus_error_is_set(&e)) {
        std::string name = e.name;
        // The bus answered for a daemon that is not there: not a refusal by the daemon.
        if (name == "org.freedesktop.DBus.Error.ServiceUnknown" ||
            name == "org.freedesktop.DBus.Error.NameHasNoOwner")
            return make_error(Errc::unavailable,
                              name + ": knod-policyd is not running on this bus (nobody owns " +
                                  bus::service_name +
                                  "); start it (systemctl start knod-policyd) or give "
                                  "--bus-address of the bus it serves");
        // The bus's own answers: a daemon that stopped answering is unreachable, a call the
        // bus policy refused is a denial.
        Errc code = bus::error_code(name);
        if (name == "org.freedesktop.DBus.Error.NoReply" ||
            name == "org.freedesktop.DBus.Error.Disconnected" ||
            name == "org.freedesktop.DBus.Error.Timeout")
            code = Errc::unavailable;
        else if (name == "org.freedesktop.DBus.Error.AccessDenied")
            code = Errc::denied;
        return make_error(code, name + ": " + (e.message ? e.message : ""));
    }
    if (r == -ECHILD) return forked_error(std::nullopt);
    bool gone = r == -ENOTCONN || r == -ECONNRESET || r == -EPIPE || r == -ETIMEDOUT;
    return make_error(gone ? Errc::unavailable : Errc::io,
                      std::string(what) + ": " + std::strerror(-r));
}

std::string path_of(const std::string &id) {
    return std::string(bus::bindings_prefix) + "/" + id;
}

// Calls a Binding method whose one argument is the key (Activate, Renew, RxNotifier); the reply
// is left in `reply`.
Result<void> call_with_key(sd_bus *bus, const std::string &id, const char *method,
                           const std::vector<std::uint8_t> &key, Reply &reply) {
    sd_bus_message *call = nullptr;
    int r = sd_bus_message_new_method_call(bus, &call, service_name, path_of(id).c_str(),
                                           binding_interface, method);
    if (r < 0) return make_error(Errc::io, std::string(method) + ": cannot build the call");
    if ((r = sd_bus_message_append_array(call, 'y', key.data(), key.size())) >= 0)
        r = sd_bus_call(bus, call, 0, &reply.e, &reply.m);
    sd_bus_message_unref(call);
    if (r < 0) return bus_failure(reply.e, r, method);
    return {};
}

template <typename T>
Result<T> property(sd_bus *bus, const std::string &path, const char *iface, const char *name,
                   char type) {
    Reply r;
    int rc = sd_bus_get_property(bus, service_name, path.c_str(), iface, name, &r.e, &r.m,
                                 std::string(1, type).c_str());
    if (rc < 0) return bus_failure(r.e, rc, name);
    T value{};
    if constexpr (std::is_same_v<T, std::string>) {
        const char *s = nullptr;
        if ((rc = sd_bus_message_read(r.m, "s", &s)) < 0) return bus_failure(r.e, rc, name);
        value = s;
    } else if constexpr (std::is_same_v<T, bool>) {
        int b = 0;
        if ((rc = sd_bus_message_read(r.m, "b", &b)) < 0) return bus_failure(r.e, rc, name);
        value = b != 0;
    } else {
        const char sig[2] = {type, 0};
        if ((rc = sd_bus_message_read(r.m, sig, &value)) < 0) return bus_failure(r.e, rc, name);
    }
    return value;
}

} // namespace

// The daemon unicasts BindingReleased/BindingRevoked to the holder's connection; a filter (no
// match rule on the bus is needed for a unicast signal) records them as sd_bus_process meets
// them. Only signals from the connection that answered our calls as org.knod.Policy1 count, or
// from the one the bus itself announces as its new owner (NameOwnerChanged): a restarted daemon
// tells a holder whose binding it did not take back before the holder calls it (#52). sd-bus
// cannot match a well-known sender name, and anyone may send us a signal.
struct Client::Ends {
    static constexpr std::size_t max_kept = 4096; // bounded for long-lived subscribers
    sd_bus_slot *slot = nullptr;
    sd_bus_slot *owner_slot = nullptr;
    // One name per daemon start this connection saw: only the name's owner (the bus policy's
    // daemon account) adds one.
    std::set<std::string> daemons;
    // On the pod socket only the daemon is at the other end, and its signals name no sender.
    bool peer = false;
    std::map<std::string, BindingEnd> ended;
    std::deque<std::string> order;

    ~Ends() {
        sd_bus_slot_unref(owner_slot);
        sd_bus_slot_unref(slot);
    }

    // NameOwnerChanged comes from the bus driver only: no connection can send as it.
    void note_owner(sd_bus_message *m) {
        const char *sender = sd_bus_message_get_sender(m);
        if (!sender || std::strcmp(sender, "org.freedesktop.DBus") != 0) return;
        const char *name = nullptr, *old_owner = nullptr, *new_owner = nullptr;
        if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return;
        if (std::strcmp(name, service_name) == 0 && *new_owner) daemons.insert(new_owner);
    }

    void trust_sender_of(sd_bus_message *reply) {
        if (const char *sender = reply ? sd_bus_message_get_sender(reply) : nullptr)
            daemons.insert(sender);
    }

    static int on_message(sd_bus_message *m, void *self, sd_bus_error *) {
        auto *e = static_cast<Ends *>(self);
        if (sd_bus_message_is_signal(m, "org.freedesktop.DBus", "NameOwnerChanged") > 0) {
            e->note_owner(m);
            return 0;
        }
        bool revoked = sd_bus_message_is_signal(m, manager_interface, "BindingRevoked") > 0;
        if (!revoked && sd_bus_message_is_signal(m, manager_interface, "BindingReleased") <= 0)
            return 0;
        const char *sender = sd_bus_message_get_sender(m);
        if (!e->peer && (!sender || !e->daemons.count(sender))) return 0;
        const char *path = nullptr, *id = nullptr, *reason = nullptr;
        if (sd_bus_message_read(m, "oss", &path, &id, &reason) < 0) return 0;
        if (e->ended.emplace(id, BindingEnd{revoked, reason}).second) e->order.emplace_back(id);
        if (e->order.size() > max_kept) {
            e->ended.erase(e->order.front());
            e->order.pop_front();
        }
        return 0; // others may want it too
    }
};

Client::Client(sd_bus *bus, bool peer)
    : bus_(bus), pid_(::getpid()), ends_(std::make_unique<Ends>()) {
    ends_->peer = peer;
    // Without the filter the client still works; it only cannot say why a binding ended.
    sd_bus_add_filter(bus_, &ends_->slot, Ends::on_message, ends_.get());
    if (peer) return; // no bus driver: no match to ask for, no NameOwnerChanged to hear
    // Asynchronous: nothing waits for the bus here; the rule is in place before any reply to a
    // later call arrives (the bus handles a connection's messages in order).
    std::string rule = std::string("type='signal',sender='org.freedesktop.DBus',"
                                   "interface='org.freedesktop.DBus',member='NameOwnerChanged',"
                                   "arg0='") +
                       service_name + "'";
    // The filter above reads the signal; the match only asks the bus to route it here.
    auto routed = [](sd_bus_message *, void *, sd_bus_error *) { return 0; };
    sd_bus_add_match_async(bus_, &ends_->owner_slot, rule.c_str(), routed, nullptr, nullptr);
}

namespace {

std::string env(const char *name) {
    const char *v = std::getenv(name);
    return v ? v : "";
}

bool is_socket(const char *path) {
    struct stat st {};
    return ::stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

// The pod socket's address when the rule picks it (Client::connect), else "".
std::string pod_address() {
    if (std::string a = env(bus::pod_address_env); !a.empty()) return a;
    if (!env("DBUS_SYSTEM_BUS_ADDRESS").empty()) return "";
    if (is_socket(bus::pod_socket_path) && !is_socket(bus::system_bus_socket))
        return std::string("unix:path=") + bus::pod_socket_path;
    return "";
}

} // namespace

Result<Client> Client::connect(const std::string &address, std::uint64_t call_timeout_us) {
    sd_bus *bus = nullptr;
    int r = 0;
    std::string pod = address.empty() ? pod_address() : "";
    if (!pod.empty()) {
        // Peer-to-peer: not a bus client (no Hello, no bus driver); EXTERNAL authentication.
        if ((r = sd_bus_new(&bus)) >= 0 && (r = sd_bus_set_address(bus, pod.c_str())) >= 0 &&
            (r = sd_bus_negotiate_fds(bus, 1)) >= 0)
            r = sd_bus_start(bus);
    } else if (address.empty()) {
        r = sd_bus_open_system(&bus);
    } else {
        if ((r = sd_bus_new(&bus)) >= 0 && (r = sd_bus_set_address(bus, address.c_str())) >= 0 &&
            (r = sd_bus_set_bus_client(bus, 1)) >= 0)
            r = sd_bus_start(bus);
    }
    if (r < 0) {
        sd_bus_unref(bus);
        if (!pod.empty())
            return make_error(Errc::unavailable,
                              "cannot reach knod-policyd's pod socket at " + address_tried({}) +
                                  ": " + std::strerror(-r) +
                                  " (it serves the processes of registered pods only)");
        return make_error(Errc::unavailable, "cannot connect to the bus at " +
                                                 address_tried(address) + ": " + std::strerror(-r) +
                                                 " (is dbus running? or give --bus-address)");
    }
    // Every call that passes 0 (all of this client's) waits at most this long, attest too.
    if (call_timeout_us) (void)sd_bus_set_method_call_timeout(bus, call_timeout_us);
    Client c(bus, !pod.empty());
    c.peer_address_ = pod;
    c.call_timeout_us_ = call_timeout_us;
    // Proven from the start: root's rights (auditor, admin) and rules naming units need it.
    // No daemon yet, or one that refuses: each call says so itself, and asks again.
    (void)c.attest();
    return c;
}

std::string Client::address_tried(const std::string &address) {
    // From an option or the environment: any bytes, any length; escaped and cut for messages.
    auto shown = [](std::string_view a) {
        return a.size() <= 256 && is_clean_text(a) ? std::string(a) : quote_untrusted(a, 256);
    };
    if (!address.empty()) return shown(address);
    if (std::string pod = pod_address(); !pod.empty()) return shown(pod);
    std::string system = env("DBUS_SYSTEM_BUS_ADDRESS");
    return !system.empty() ? shown(system) : std::string("unix:path=") + bus::system_bus_socket;
}

Client::Client(Client &&o) noexcept
    : bus_(std::exchange(o.bus_, nullptr)), pid_(o.pid_), ends_(std::move(o.ends_)),
      peer_address_(std::move(o.peer_address_)), call_timeout_us_(o.call_timeout_us_),
      subscribed_(o.subscribed_), served_(o.served_), proof_(std::move(o.proof_)) {}
Client &Client::operator=(Client &&o) noexcept {
    std::swap(bus_, o.bus_);
    std::swap(pid_, o.pid_);
    std::swap(ends_, o.ends_);
    std::swap(peer_address_, o.peer_address_);
    std::swap(call_timeout_us_, o.call_timeout_us_);
    std::swap(subscribed_, o.subscribed_);
    std::swap(served_, o.served_);
    std::swap(proof_, o.proof_);
    return *this;
}

Result<void> Client::same_process() const {
    if (::getpid() != pid_) return forked_error(pid_);
    return {};
}

bool Client::lost() const {
    // Only a connection the daemon once served: one it refused at accept is not made again.
    return !peer_address_.empty() && served_ && sd_bus_is_open(bus_) <= 0;
}

Result<void> Client::ready() {
    if (auto here = same_process(); !here) return here;
    if (peer_address_.empty()) return {};
    // A daemon that went while this client was idle left an end of file unread: read it now,
    // rather than fail the call on a connection known to be gone.
    while (sd_bus_process(bus_, nullptr) > 0) {
    }
    if (!lost()) return {};
    // One try, as long as a call may take (sd-bus's 25 s unless connect() was given less).
    auto budget = std::chrono::microseconds(call_timeout_us_ ? call_timeout_us_ : 25'000'000);
    return reconnect(std::chrono::steady_clock::now() + budget, false);
}

namespace {

// sd-bus waits up to 90 s for a peer's handshake whatever the call timeout: a daemon that
// accepted and hangs (stopped, still starting) must not hold the caller past `until`.
int wait_until_ready(sd_bus *bus, std::chrono::steady_clock::time_point until) {
    int r;
    while ((r = sd_bus_is_ready(bus)) == 0) {
        auto left = std::chrono::duration_cast<std::chrono::microseconds>(
            until - std::chrono::steady_clock::now());
        if (left.count() <= 0) return -ETIMEDOUT;
        if ((r = sd_bus_process(bus, nullptr)) < 0) return r;
        if (r > 0) continue;
        if ((r = sd_bus_wait(bus, static_cast<std::uint64_t>(left.count()))) < 0) return r;
    }
    return r < 0 ? r : 0;
}

} // namespace

std::uint64_t Client::bounded_timeout(std::chrono::steady_clock::time_point until) const {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(
                    until - std::chrono::steady_clock::now())
                    .count();
    std::uint64_t own = call_timeout_us_ ? call_timeout_us_ : 25'000'000;
    return std::clamp<std::uint64_t>(left > 0 ? static_cast<std::uint64_t>(left) : 1, 1, own);
}

Result<void> Client::reconnect(std::chrono::steady_clock::time_point until, bool retry) {
    auto pause = std::chrono::milliseconds(20);
    for (;;) {
        sd_bus *bus = nullptr;
        int r = sd_bus_new(&bus);
        if (r >= 0) r = sd_bus_set_address(bus, peer_address_.c_str());
        if (r >= 0) r = sd_bus_negotiate_fds(bus, 1);
        if (r >= 0) r = sd_bus_start(bus);
        if (r >= 0) r = wait_until_ready(bus, until);
        if (r >= 0) {
            // Its first calls end by `until` too (then the connection's own timeout again).
            (void)sd_bus_set_method_call_timeout(bus, bounded_timeout(until));
            // The end signals' filter moves to the new connection; what it recorded stays.
            sd_bus_slot_unref(std::exchange(ends_->slot, nullptr));
            sd_bus_add_filter(bus, &ends_->slot, Ends::on_message, ends_.get());
            sd_bus_close_unref(std::exchange(bus_, bus));
            bus = nullptr;
            proof_.clear(); // a new connection is proven again
            // Any answer, a refusal too, is the daemon's; a connection it closed at once (a
            // daemon still starting, or one that does not serve this process) is tried again.
            auto proven = attest();
            if (sd_bus_is_open(bus_) > 0 && (proven || proven.error().code != Errc::unavailable)) {
                // A subscriber stays one (signals about others' bindings it may see); asked
                // here, not through subscribe(), which could connect again itself.
                if (subscribed_) {
                    Reply reply;
                    if (sd_bus_call_method(bus_, service_name, manager_path, manager_interface,
                                           "Subscribe", &reply.e, &reply.m, "") >= 0)
                        ends_->trust_sender_of(reply.m);
                }
                (void)sd_bus_set_method_call_timeout(bus_, call_timeout_us_);
                return {};
            }
            r = -ECONNRESET;
        }
        sd_bus_close_unref(bus);
        auto now = std::chrono::steady_clock::now();
        if (!retry || now >= until)
            return make_error(Errc::unavailable,
                              "the connection to knod-policyd's pod socket closed (the daemon "
                              "stopped or restarted) and it cannot be reached again at " +
                                  peer_address_ + ": " + std::strerror(-r));
        // The daemon is starting: its socket refuses or is not there yet.
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(pause, until - now));
        pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
}

Result<std::string> Client::attest() {
    if (auto here = same_process(); !here) return std::move(here).error();
    if (!proof_.empty()) return proof_;
    // The kernel stamps both ends with this process's credentials and pidfd (unix(7)); the
    // daemon checks that it is the process the bus names and that it still runs. The pair is
    // closed on return: only its credentials travel.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return make_error(Errc::io,
                          std::string("AttestProcess: socketpair: ") + std::strerror(errno));
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "AttestProcess",
                               &reply.e, &reply.m, "h", pair[0]);
    ::close(pair[0]);
    ::close(pair[1]);
    // The daemon's answer, a refusal in its own words too: this connection was served.
    if (r >= 0 || (reply.e.name && (std::strncmp(reply.e.name, "org.knod.", 9) == 0 ||
                                    sd_bus_error_has_name(&reply.e, SD_BUS_ERROR_UNKNOWN_METHOD))))
        served_ = true;
    if (r < 0) {
        Error e = bus_failure(reply.e, r, "AttestProcess");
        // An answer for this daemon's life, not an outage: an older daemon, or a kernel
        // without SO_PEERPIDFD. A refusal is asked again next time (a restarted daemon may
        // say otherwise).
        if (sd_bus_error_has_name(&reply.e, SD_BUS_ERROR_UNKNOWN_METHOD) ||
            e.code == Errc::unsupported)
            proof_ = "pid-only";
        return e;
    }
    const char *proof = nullptr;
    if (sd_bus_message_read(reply.m, "s", &proof) < 0 || !proof || !*proof)
        return make_error(Errc::io, "AttestProcess: unexpected reply");
    proof_ = proof;
    return proof_;
}
Client::~Client() {
    ends_.reset(); // the filter's slot holds a reference on the bus: drop it first
    sd_bus_flush_close_unref(bus_);
}

Result<void> Client::drain() {
    int r;
    while ((r = sd_bus_process(bus_, nullptr)) > 0) {
    }
    if (r < 0) return make_error(Errc::io, std::string("reading the bus: ") + std::strerror(-r));
    return {};
}

Result<std::optional<BindingEnd>> Client::end_of(const std::string &id) {
    if (auto here = same_process(); !here) return std::move(here).error();
    if (auto r = drain(); !r) return r.error();
    auto it = ends_->ended.find(id);
    if (it == ends_->ended.end()) return std::optional<BindingEnd>();
    return std::optional<BindingEnd>(it->second);
}

Result<BindingEnd> Client::wait_for_end(const std::string &id, int timeout_ms) {
    if (auto here = same_process(); !here) return std::move(here).error();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        auto end = end_of(id);
        if (end && *end) return **end;
        auto left = std::chrono::duration_cast<std::chrono::microseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return make_error(Errc::expired, "binding " + id + " still alive after " +
                                                 std::to_string(timeout_ms) + " ms");
        if (lost()) {
            // The daemon restarted under a pod-socket holder: connect again and ask about the
            // binding, which takes it back (docs/kubernetes.md); one that ended meanwhile is
            // told before the answer, and one the new daemon did not take back at all (a stop
            // that kept nothing) is not there any more.
            if (auto r = reconnect(deadline, true); !r) return r.error();
            (void)sd_bus_set_method_call_timeout(bus_, bounded_timeout(deadline));
            auto st = state(id);
            (void)sd_bus_set_method_call_timeout(bus_, call_timeout_us_);
            if (auto told = end_of(id); told && *told) return **told;
            if (!st && st.error().message.find("UnknownObject") != std::string::npos)
                return BindingEnd{false, "daemon-restart: the daemon restarted and did not "
                                         "take this binding back"};
            continue;
        }
        if (!end) return end.error();
        int r = sd_bus_wait(bus_, static_cast<std::uint64_t>(left.count()));
        if (r < 0 && !lost())
            return make_error(Errc::io, std::string("waiting on the bus: ") + std::strerror(-r));
    }
}

Result<void> Client::subscribe() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "Subscribe",
                               &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "Subscribe");
    subscribed_ = true;
    ends_->trust_sender_of(reply.m);
    return {};
}

Result<GrantedBinding> Client::request_binding(const std::string &netdev, const std::string &gpu,
                                               const std::string &mode, int region_fd,
                                               std::uint64_t offset, std::uint64_t length,
                                               const std::vector<std::string> &flows,
                                               bool retried) {
    if (auto here = ready(); !here) return std::move(here).error();
    (void)attest(); // refused or unreachable: the request says so itself
    sd_bus_message *call = nullptr;
    int r = sd_bus_message_new_method_call(bus_, &call, service_name, manager_path,
                                           manager_interface, "RequestBinding");
    if (r < 0) return make_error(Errc::io, "RequestBinding: cannot build the call");
    std::vector<const char *> strv;
    for (auto &f : flows)
        strv.push_back(f.c_str());
    strv.push_back(nullptr);
    Reply reply;
    if ((r = sd_bus_message_append(call, "ssshtt", netdev.c_str(), gpu.c_str(), mode.c_str(),
                                   region_fd, offset, length)) >= 0 &&
        (r = sd_bus_message_append_strv(call, const_cast<char **>(strv.data()))) >= 0)
        r = sd_bus_call(bus_, call, 0, &reply.e, &reply.m);
    sd_bus_message_unref(call);
    // A daemon that restarted since this connection attested has forgotten it: attest again
    // and ask once more.
    if (r < 0 && !retried && sd_bus_error_has_name(&reply.e, bus::error::denied) &&
        reply.e.message && std::strstr(reply.e.message, "process is not proven")) {
        proof_.clear();
        return request_binding(netdev, gpu, mode, region_fd, offset, length, flows, true);
    }
    if (r < 0) return bus_failure(reply.e, r, "RequestBinding");
    ends_->trust_sender_of(reply.m);
    const char *path = nullptr, *key_id = nullptr;
    const void *key = nullptr;
    size_t size = 0;
    if ((r = sd_bus_message_read(reply.m, "os", &path, &key_id)) < 0 ||
        (r = sd_bus_message_read_array(reply.m, 'y', &key, &size)) < 0)
        return bus_failure(reply.e, r, "RequestBinding reply");
    GrantedBinding g;
    g.path = path;
    g.id = g.path.substr(g.path.rfind('/') + 1);
    g.key_id = key_id;
    g.key.assign(static_cast<const std::uint8_t *>(key),
                 static_cast<const std::uint8_t *>(key) + size);
    return g;
}

Result<void> Client::activate(const std::string &id, const std::vector<std::uint8_t> &key) {
    if (auto here = ready(); !here) return std::move(here).error();
    (void)attest();
    Reply reply;
    return call_with_key(bus_, id, "Activate", key, reply);
}

Result<void> Client::set_job(const std::string &id, const std::vector<std::uint8_t> &key,
                             const std::string &job, const std::string &group, std::uint32_t rank) {
    if (auto here = ready(); !here) return std::move(here).error();
    (void)attest();
    sd_bus_message *call = nullptr;
    int r = sd_bus_message_new_method_call(bus_, &call, service_name, path_of(id).c_str(),
                                           binding_interface, "SetJob");
    if (r < 0) return make_error(Errc::io, "SetJob: cannot build the call");
    Reply reply;
    if ((r = sd_bus_message_append_array(call, 'y', key.data(), key.size())) >= 0 &&
        (r = sd_bus_message_append(call, "ssu", job.c_str(), group.c_str(), rank)) >= 0)
        r = sd_bus_call(bus_, call, 0, &reply.e, &reply.m);
    sd_bus_message_unref(call);
    if (r < 0) return bus_failure(reply.e, r, "SetJob");
    return {};
}

Result<std::uint64_t> Client::renew(const std::string &id, const std::vector<std::uint8_t> &key) {
    if (auto here = ready(); !here) return std::move(here).error();
    (void)attest();
    Reply reply;
    if (auto r = call_with_key(bus_, id, "Renew", key, reply); !r) return r.error();
    std::uint64_t until = 0;
    if (sd_bus_message_read(reply.m, "t", &until) < 0)
        return make_error(Errc::io, "Renew: unexpected reply");
    return until;
}

Result<void> Client::release(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, path_of(id).c_str(), binding_interface,
                               "Release", &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "Release");
    return {};
}

Result<BindingCounters> Client::counters(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    BindingCounters c;
    auto get = [&](const char *name, std::uint64_t &out) -> Result<void> {
        auto v = property<std::uint64_t>(bus_, path_of(id), binding_interface, name, 't');
        if (!v) return v.error();
        out = *v;
        return {};
    };
    for (auto [name, field] :
         {std::pair{"RxBytes", &c.rx_bytes}, std::pair{"RxPackets", &c.rx_packets},
          std::pair{"DroppedPackets", &c.dropped_packets}})
        if (auto r = get(name, *field); !r) return r.error();
    return c;
}

Result<std::uint32_t> Client::dmabuf_id(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply r;
    int rc = sd_bus_get_property(bus_, service_name, path_of(id).c_str(), binding_interface,
                                 "DmabufId", &r.e, &r.m, "u");
    // A daemon older than the property: it names no dma-buf, so none.
    if (rc < 0 && sd_bus_error_has_name(&r.e, SD_BUS_ERROR_UNKNOWN_PROPERTY)) return 0u;
    if (rc < 0) return bus_failure(r.e, rc, "DmabufId");
    std::uint32_t value = 0;
    if ((rc = sd_bus_message_read(r.m, "u", &value)) < 0) return bus_failure(r.e, rc, "DmabufId");
    return value;
}

Result<std::uint64_t> Client::wait_for_data(const std::string &id, std::uint64_t seen,
                                            int timeout_ms) {
    if (auto here = ready(); !here) return std::move(here).error();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        auto rx = property<std::uint64_t>(bus_, path_of(id), binding_interface, "RxBytes", 't');
        if (!rx) {
            // Gone: the end signal came before this reply, so it is here to be read.
            auto end = end_of(id);
            if (end && *end)
                return make_error((*end)->revoked ? Errc::revoked : Errc::not_found,
                                  "binding " + id + " ended: " + (*end)->reason);
            return rx.error();
        }
        if (*rx > seen) return *rx;
        if (std::chrono::steady_clock::now() >= deadline)
            return make_error(Errc::expired,
                              "no data within " + std::to_string(timeout_ms) + " ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

Result<Client::RxNotifier> Client::rx_notifier(const std::string &id,
                                               const std::vector<std::uint8_t> &key) {
    if (auto here = ready(); !here) return std::move(here).error();
    (void)attest();
    Reply reply;
    if (auto r = call_with_key(bus_, id, "RxNotifier", key, reply); !r) return r.error();
    int fd = -1;
    RxNotifier n;
    if (sd_bus_message_read(reply.m, "ht", &fd, &n.rx_bytes) < 0)
        return make_error(Errc::io, "RxNotifier: unexpected reply");
    // The message owns `fd`; ours is a nonblocking dup (the read end of a pipe whose write end
    // only the daemon has).
    n.fd.reset(fcntl(fd, F_DUPFD_CLOEXEC, 3));
    if (!n.fd.valid() || fcntl(n.fd.get(), F_SETFL, O_NONBLOCK) != 0)
        return make_error(Errc::io, std::string("RxNotifier: ") + std::strerror(errno));
    return n;
}

Result<std::uint64_t> Client::wait_for_data(const std::string &id, RxNotifier &n,
                                            std::uint64_t seen, int timeout_ms) {
    if (auto here = ready(); !here) return std::move(here).error();
    using namespace std::chrono;
    auto deadline = steady_clock::now() + milliseconds(timeout_ms);
    for (;;) {
        // Each record is the binding's RxBytes total; the daemon writes 8 bytes at once (atomic
        // on a pipe), so a read of 8 gets whole records.
        std::uint64_t total = 0;
        ssize_t got;
        while ((got = read(n.fd.get(), &total, sizeof total)) == sizeof total)
            n.rx_bytes = std::max(n.rx_bytes, total);
        if (n.rx_bytes > seen) return n.rx_bytes;
        if (got == 0) {
            // EOF: the daemon writes this pipe no more (it restarted, or a newer notifier took
            // its place). Drop it, so the caller asks for a new one, and poll for the rest.
            n.fd.reset();
            auto left = duration_cast<milliseconds>(deadline - steady_clock::now()).count();
            return wait_for_data(id, seen, static_cast<int>(std::max<std::int64_t>(left, 0)));
        }
        auto end = end_of(id); // reads what the bus has (an end signal among it)
        if (!end) return end.error();
        if (*end)
            return make_error((*end)->revoked ? Errc::revoked : Errc::not_found,
                              "binding " + id + " ended: " + (*end)->reason);
        auto left = duration_cast<microseconds>(deadline - steady_clock::now()).count();
        if (left <= 0) {
            // One look at RxBytes at the end: a daemon restarted with the binding kept (systemd's
            // fd store) no longer writes this eventfd. Then the notifier is dropped (invalid fd)
            // and the count taken from the daemon, so the caller can ask for a new one.
            auto rx = property<std::uint64_t>(bus_, path_of(id), binding_interface, "RxBytes", 't');
            if (rx && *rx != n.rx_bytes) {
                n.fd.reset();
                n.rx_bytes = *rx;
                if (*rx > seen) return *rx;
            }
            return make_error(Errc::expired,
                              "no data within " + std::to_string(timeout_ms) + " ms");
        }
        std::uint64_t bus_timeout = 0; // absolute, CLOCK_MONOTONIC us; UINT64_MAX: none
        if (sd_bus_get_timeout(bus_, &bus_timeout) > 0 && bus_timeout != UINT64_MAX) {
            std::uint64_t now = static_cast<std::uint64_t>(
                duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count());
            left = std::min<std::int64_t>(
                left, bus_timeout > now ? static_cast<std::int64_t>(bus_timeout - now) : 0);
        }
        pollfd fds[2] = {{n.fd.get(), POLLIN, 0},
                         {sd_bus_get_fd(bus_), static_cast<short>(sd_bus_get_events(bus_)), 0}};
        int ms = static_cast<int>((left + 999) / 1000);
        if (poll(fds, 2, ms) < 0 && errno != EINTR)
            return make_error(Errc::io, std::string("waiting for data: ") + std::strerror(errno));
    }
}

Result<std::string> Client::rule(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    return property<std::string>(bus_, path_of(id), binding_interface, "Rule", 's');
}

Result<BindingDetails> Client::details(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    BindingDetails d;
    auto rule_name = rule(id);
    if (!rule_name) return rule_name.error();
    d.rule = *rule_name;
    for (auto [name, field] :
         {std::pair{"Created", &d.created_us}, std::pair{"Expires", &d.expires_us}}) {
        auto v = property<std::uint64_t>(bus_, path_of(id), binding_interface, name, 't');
        if (!v) return v.error();
        *field = *v;
    }
    auto c = counters(id);
    if (!c) return c.error();
    d.rx_bytes = c->rx_bytes;
    d.rx_packets = c->rx_packets;
    d.dropped_packets = c->dropped_packets;
    Reply r;
    int rc = sd_bus_get_property(bus_, service_name, path_of(id).c_str(), binding_interface,
                                 "Flows", &r.e, &r.m, "as");
    if (rc < 0) return bus_failure(r.e, rc, "Flows");
    char **flows = nullptr;
    if ((rc = sd_bus_message_read_strv(r.m, &flows)) < 0) return bus_failure(r.e, rc, "Flows");
    for (char **f = flows; f && *f; ++f) {
        d.flows.emplace_back(*f);
        free(*f);
    }
    free(flows);
    Reply pod;
    // A daemon from before #34 has no Pod property: no pod.
    if (sd_bus_get_property(bus_, service_name, path_of(id).c_str(), binding_interface, "Pod",
                            &pod.e, &pod.m, "a{ss}") >= 0 &&
        sd_bus_message_enter_container(pod.m, 'a', "{ss}") >= 0) {
        const char *k = nullptr, *v = nullptr;
        while (sd_bus_message_read(pod.m, "{ss}", &k, &v) > 0)
            d.pod[k] = v;
    }
    // A daemon from before #53 has no Job properties: untagged.
    if (auto job = property<std::string>(bus_, path_of(id), binding_interface, "Job", 's')) {
        d.job = *job;
        if (auto g = property<std::string>(bus_, path_of(id), binding_interface, "JobGroup", 's'))
            d.job_group = *g;
        if (auto n = property<std::uint32_t>(bus_, path_of(id), binding_interface, "JobRank", 'u'))
            d.job_rank = *n;
    }
    auto dmabuf = dmabuf_id(id);
    if (!dmabuf) return dmabuf.error();
    d.dmabuf_id = *dmabuf;
    return d;
}

Result<std::string> Client::state(const std::string &id) {
    if (auto here = ready(); !here) return std::move(here).error();
    return property<std::string>(bus_, path_of(id), binding_interface, "State", 's');
}

Result<std::vector<BindingSummary>> Client::list() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "ListBindings",
                               &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "ListBindings");
    if ((r = sd_bus_message_enter_container(reply.m, 'a', "(osssssuut)")) < 0)
        return bus_failure(reply.e, r, "ListBindings reply");
    std::vector<BindingSummary> out;
    for (;;) {
        const char *path, *id, *netdev, *gpu, *mode, *state;
        BindingSummary b;
        r = sd_bus_message_read(reply.m, "(osssssuut)", &path, &id, &netdev, &gpu, &mode, &state,
                                &b.uid, &b.pid, &b.region_bytes);
        if (r < 0) return bus_failure(reply.e, r, "ListBindings reply");
        if (r == 0) break;
        b.path = path;
        b.id = id;
        b.netdev = netdev;
        b.gpu = gpu;
        b.mode = mode;
        b.state = state;
        out.push_back(std::move(b));
    }
    return out;
}

Result<void> Client::revoke(const std::string &id, const std::string &reason) {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "RevokeBinding",
                               &reply.e, &reply.m, "ss", id.c_str(), reason.c_str());
    if (r < 0) return bus_failure(reply.e, r, "RevokeBinding");
    return {};
}

Result<std::pair<std::uint32_t, std::uint32_t>> Client::reload() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "ReloadPolicy",
                               &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "ReloadPolicy");
    std::uint32_t rules = 0, revoked = 0;
    if ((r = sd_bus_message_read(reply.m, "uu", &rules, &revoked)) < 0)
        return bus_failure(reply.e, r, "ReloadPolicy reply");
    return std::pair{rules, revoked};
}

Result<std::string> Client::host_report() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "GetHostReport",
                               &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "GetHostReport");
    const char *s = nullptr;
    if ((r = sd_bus_message_read(reply.m, "s", &s)) < 0)
        return bus_failure(reply.e, r, "GetHostReport");
    return std::string(s);
}

Result<std::string> Client::metrics() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, manager_interface, "GetMetrics",
                               &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "GetMetrics");
    const char *s = nullptr;
    if ((r = sd_bus_message_read(reply.m, "s", &s)) < 0)
        return bus_failure(reply.e, r, "GetMetrics");
    return std::string(s);
}

Result<void> Client::ping() {
    if (auto here = ready(); !here) return std::move(here).error();
    Reply reply;
    int r = sd_bus_call_method(bus_, service_name, manager_path, "org.freedesktop.DBus.Peer",
                               "Ping", &reply.e, &reply.m, "");
    if (r < 0) return bus_failure(reply.e, r, "Ping");
    return {};
}

Result<ManagerStatus> Client::status() {
    if (auto here = ready(); !here) return std::move(here).error();
    ManagerStatus st;
    auto version = property<std::string>(bus_, manager_path, manager_interface, "Version", 's');
    if (!version) return version.error();
    st.version = *version;
    auto driver = property<std::string>(bus_, manager_path, manager_interface, "Driver", 's');
    auto count =
        property<std::uint32_t>(bus_, manager_path, manager_interface, "BindingCount", 'u');
    auto rules = property<std::uint32_t>(bus_, manager_path, manager_interface, "Rules", 'u');
    auto perm = property<bool>(bus_, manager_path, manager_interface, "Permissive", 'b');
    auto journal = property<bool>(bus_, manager_path, manager_interface, "JournalAvailable", 'b');
    auto pending = property<std::uint64_t>(bus_, manager_path, manager_interface,
                                           "PendingJournalRecords", 't');
    if (!driver || !count || !rules || !perm || !journal || !pending)
        return make_error(Errc::io, "cannot read the daemon's status properties");
    st.driver = *driver;
    st.bindings = *count;
    st.rules = *rules;
    st.permissive = *perm;
    st.journal_available = *journal;
    st.pending_journal_records = *pending;
    if (auto p =
            property<std::string>(bus_, manager_path, manager_interface, "JournalProblem", 's'))
        st.journal_problem = *p;
    if (auto n = property<std::uint64_t>(bus_, manager_path, manager_interface,
                                         "JournalWriteFailures", 't'))
        st.journal_write_failures = *n;
    if (auto n = property<std::uint64_t>(bus_, manager_path, manager_interface,
                                         "AnchorWriteFailures", 't'))
        st.anchor_write_failures = *n;
    if (auto n =
            property<std::uint64_t>(bus_, manager_path, manager_interface, "ResourceFailures", 't'))
        st.resource_failures = *n;
    if (auto p = property<std::string>(bus_, manager_path, manager_interface, "LastResourceFailure",
                                       's'))
        st.last_resource_failure = *p;
    return st;
}

} // namespace knod::client
