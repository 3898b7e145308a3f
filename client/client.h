// The knod-policy client library: what the article's Python does (register a buffer, wait for
// data), over the daemon's D-Bus API. Request a binding for a region, activate it with the key,
// read its counters, release it. The CLI and the tests use it too.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <array>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct sd_bus;

namespace knod::client {

struct GrantedBinding {
    std::string path;
    std::string id;
    std::string key_id;
    std::vector<std::uint8_t> key; // 32 bytes, given once; keep it secret
};

struct BindingSummary {
    std::string path;
    std::string id;
    std::string netdev;
    std::string gpu;
    std::string mode;
    std::string state;
    std::uint32_t uid = 0;
    std::uint32_t pid = 0;
    std::uint64_t region_bytes = 0;
};

// What a binding's properties say beyond the listing (Get on its object).
struct BindingDetails {
    std::string rule;
    std::vector<std::string> flows;
    std::uint64_t created_us = 0; // microseconds since the Unix epoch
    std::uint64_t expires_us = 0;
    std::uint64_t rx_bytes = 0;
    std::uint64_t rx_packets = 0;
    std::uint64_t dropped_packets = 0;
    // The holder's Kubernetes pod: namespace, name, uid; empty outside a registered pod.
    std::map<std::string, std::string> pod;
    // The job its holder tagged it with (Binding.SetJob): "" untagged (or a daemon before #53).
    std::string job;
    std::string job_group;
    std::uint32_t job_rank = 0;
    // The kernel's id of the binding's dma-buf (Binding.DmabufId): 0 none (not devmem, not
    // active yet, or a daemon that does not say).
    std::uint32_t dmabuf_id = 0;
};

struct BindingCounters {
    std::uint64_t rx_bytes = 0;
    std::uint64_t rx_packets = 0;
    std::uint64_t dropped_packets = 0;
};

// Why a binding ended, as the daemon told this connection (it tells the holder's connection, and
// subscribers that may list the binding).
struct BindingEnd {
    bool revoked = false; // BindingRevoked: ended by someone or something other than its holder
    std::string reason;   // "release", "revoke: <the admin's reason>", "expire", "link-down", ...
};

struct ManagerStatus {
    std::string version;
    std::string driver;
    std::uint32_t bindings = 0;
    std::uint32_t rules = 0;
    bool permissive = false;
    bool journal_available = false;
    std::uint64_t pending_journal_records = 0;
    // "" when the journal commits and its anchor advances; otherwise what is wrong (a daemon
    // older than these properties reports "" and 0).
    std::string journal_problem;
    std::uint64_t journal_write_failures = 0; // transactions the disk refused
    std::uint64_t anchor_write_failures = 0;  // journal.db.anchor writes that failed
    // Calls refused because the daemon ran out of fds, memory or disk, and the last one's text.
    std::uint64_t resource_failures = 0;
    std::string last_resource_failure;
};

class Client {
  public:
    // An address is a bus's. An empty one: KNOD_POLICY_ADDRESS (the daemon's pod socket,
    // peer-to-peer), else the system bus if DBUS_SYSTEM_BUS_ADDRESS is set, else
    // /run/knod-policy/pod.sock if it exists and /run/dbus/system_bus_socket does not (inside a
    // pod), else the system bus (docs/client-sdk.md, "Which address").
    // `call_timeout_us`: how long each call waits for the daemon's answer (0: sd-bus's default,
    // 25 s); a collector that must not hang on a stopped daemon gives its own.
    static Result<Client> connect(const std::string &address = {},
                                  std::uint64_t call_timeout_us = 0);
    // The address connect(address) tries, by the rule above. For messages that say which bus
    // (or pod socket) was unreachable.
    static std::string address_tried(const std::string &address);
    Client(Client &&) noexcept;
    Client &operator=(Client &&) noexcept;
    ~Client();

    Result<GrantedBinding> request_binding(const std::string &netdev, const std::string &gpu,
                                           const std::string &mode, int region_fd,
                                           std::uint64_t offset, std::uint64_t length,
                                           const std::vector<std::string> &flows,
                                           bool retried = false); // retried: once, re-attested
    Result<void> activate(const std::string &id, const std::vector<std::uint8_t> &key);
    // Extends the binding's key by the policy's key lifetime from now (long jobs call it before
    // Expires); returns the new expiry in microseconds since the epoch.
    Result<std::uint64_t> renew(const std::string &id, const std::vector<std::uint8_t> &key);
    // Tags the binding with the job its holder serves (Binding.SetJob; the key proves it is the
    // holder): once per binding. The daemon checks the strings (job 1..64, group 0..64 bytes of
    // [A-Za-z0-9._:@/-], rank <= 65535). A label for people, never a policy input.
    Result<void> set_job(const std::string &id, const std::vector<std::uint8_t> &key,
                         const std::string &job, const std::string &group, std::uint32_t rank);
    Result<void> release(const std::string &id);
    Result<BindingCounters> counters(const std::string &id);
    // The kernel's id of the binding's dma-buf (Binding.DmabufId): what netdev bind-rx returned,
    // and what the kernel puts in every devmem fragment (DevmemFragment::dmabuf_id) of it, so a
    // holder can refuse fragments of another binding's dma-buf. 0: none (not a devmem binding,
    // not active yet, or a daemon older than the property).
    Result<std::uint32_t> dmabuf_id(const std::string &id);
    // Waits until the binding's RxBytes passes `seen` (the article's wait_for_data), polling the
    // daemon every few milliseconds, for at most `timeout_ms`. Returns the new RxBytes; byte i
    // of the stream is at offset + (i mod length) in the region. Times out with Errc::expired;
    // a binding that ended is Errc::revoked (or not_found after a release), saying why.
    Result<std::uint64_t> wait_for_data(const std::string &id, std::uint64_t seen, int timeout_ms);
    // The holder's data notifier (Binding.RxNotifier, the key proves it is the holder): the
    // read end of a pipe on which the daemon writes RxBytes (native-endian u64 records) after
    // each batch of delivered payloads (the sim: one drain of its receive ring), and the RxBytes
    // it starts from. Fails where the driver has none
    // (devmem: the holder receives itself) or the daemon is older.
    struct RxNotifier {
        UniqueFd fd;
        std::uint64_t rx_bytes = 0; // RxBytes as far as this notifier has counted
    };
    Result<RxNotifier> rx_notifier(const std::string &id, const std::vector<std::uint8_t> &key);
    // wait_for_data without polling: sleeps in poll() on the notifier and the bus (a binding's
    // end signal ends the wait) until `n.rx_bytes` passes `seen`; the same results. At the
    // timeout it reads RxBytes once: if the notifier lost count (the daemon restarted keeping
    // the binding), `n.fd` is closed and the caller asks for a new notifier.
    Result<std::uint64_t> wait_for_data(const std::string &id, RxNotifier &n, std::uint64_t seen,
                                        int timeout_ms);
    Result<std::string> state(const std::string &id);
    // Why the binding ended, if the daemon has said so to this connection; nullopt while it
    // lives (or if the end was never signalled here). Does not wait.
    Result<std::optional<BindingEnd>> end_of(const std::string &id);
    // Waits up to `timeout_ms` for the binding's end; Errc::expired if it is still alive.
    Result<BindingEnd> wait_for_end(const std::string &id, int timeout_ms);
    // Asks for signals about every binding this caller may list (Manager.Subscribe); without
    // it a connection hears only about the bindings it requested.
    Result<void> subscribe();
    Result<std::string> rule(const std::string &id); // the policy rule that granted it
    // Rule, flows, creation and expiry, counters: one Get per property.
    Result<BindingDetails> details(const std::string &id);
    Result<std::vector<BindingSummary>> list();
    Result<void> revoke(const std::string &id, const std::string &reason);
    // Returns (rules, revoked).
    Result<std::pair<std::uint32_t, std::uint32_t>> reload();
    Result<std::string> host_report();
    // Manager.GetMetrics: the daemon's counters as JSON (root, auditors and admins).
    Result<std::string> metrics();
    Result<ManagerStatus> status();
    // A bare round trip to the daemon (org.freedesktop.DBus.Peer.Ping): the baseline benchmarks
    // compare against.
    Result<void> ping();
    // Proves to the daemon that this process is the one that made the connection
    // (Manager.AttestProcess with one end of a fresh socketpair), so that rules naming units,
    // cgroups or executables can match it on a bus that sends no ProcessFD (dbus-daemon 1.14).
    // Asked once per connection, before the first call whose answer depends on who calls
    // (request, activate, renew, notifier); the answer is kept: "bus-pidfd" (the bus already
    // proved it), "attested", or "pid-only" once the daemon refused or does not know the call.
    // A failure to reach the daemon is returned and asked again next time.
    Result<std::string> attest();

  private:
    struct Ends; // the end signals received so far
    // `peer`: a peer-to-peer connection to the daemon (the pod socket): no bus driver to ask
    // for matches, and the daemon is the only sender.
    Client(sd_bus *bus, bool peer);
    // Dispatches what has arrived (end signals among it) without waiting.
    Result<void> drain();
    // sd-bus refuses a connection in any process but the one that made it (ECHILD, "No child
    // processes"): each call checks first and says what happened.
    Result<void> same_process() const;
    // same_process(), and on the pod socket a connection that closed (the daemon restarted) is
    // made again, once: no pod connection outlives the daemon that accepted it.
    Result<void> ready();
    // Connects to the pod socket again, trying until `until` (the daemon may be starting): the
    // restarted daemon gives back this process's bindings on the new connection and tells it
    // of those that ended meanwhile (docs/kubernetes.md, "Restarts").
    // `retry`: keep trying until `until`; otherwise one try, its handshake bounded by `until`.
    Result<void> reconnect(std::chrono::steady_clock::time_point until, bool retry);
    bool lost() const; // on the pod socket, and its connection closed
    // The call timeout for calls that must end by `until` (at most the connection's own).
    std::uint64_t bounded_timeout(std::chrono::steady_clock::time_point until) const;
    sd_bus *bus_ = nullptr;
    pid_t pid_ = 0; // the process that made the connection
    std::unique_ptr<Ends> ends_;
    std::string peer_address_;          // the pod socket's address; empty on a bus
    std::uint64_t call_timeout_us_ = 0; // connect()'s, for a connection made again
    bool subscribed_ = false;           // Subscribe succeeded: asked again on a new connection
    bool served_ = false;               // the daemon answered on this client's connection
    std::string proof_;                 // attest()'s answer; empty until the daemon gave one
};

} // namespace knod::client
