// The C API (include/knod/client.h) over the C++ client: handles own a Client or a granted
// binding; every entry point catches what C++ could throw, so nothing unwinds into C.
#include "knod/client.h"

#include "client/client.h"
#include "client/devmem_rx.h"
#include "client/devmem_stream.h"
#include "client/elementwise.h"
#include "client/refusal.h"
#include "knod/unique_fd.h"
#include "protocol/names.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

struct knod_error {
    knod_errc code = KNOD_ERR_FAILED;
    std::string message;
    std::string dbus_name;
    std::optional<std::string> rule;
};

struct knod_client {
    knod::client::Client client;
    unsigned refs = 1;
};

struct knod_binding {
    knod_client *owner = nullptr;
    knod::client::GrantedBinding grant;
    std::string rule;
    std::uint64_t length = 0;
    bool released = false;
    std::optional<knod::client::BindingEnd> end; // once known: signalled, or our own release
    // The daemon's data notifier, asked for at the first wait; without one (a driver that has
    // none, an older daemon) waits poll RxBytes.
    std::optional<knod::client::Client::RxNotifier> notifier;
    bool notifier_asked = false;
};

struct knod_devmem_rx {
    // A dup of the caller's socket, the receiver's own: the caller may close its fd, and the
    // number be reused by another file, while this receiver lives.
    knod::UniqueFd socket;
    knod::client::DevmemReceiver receiver;
    // Fragments of the last recvmsg the caller had no room for, handed out first.
    std::vector<knod::client::DevmemFragment> pending;
    // Linear bytes of knod_devmem_stream_receive, made at its first call and kept (a call is
    // made per message: no allocation on the data path).
    std::vector<std::uint8_t> scratch;
};

namespace {

using knod::Errc;

struct NameCode {
    const char *name;
    knod_errc code;
};

constexpr NameCode by_name[] = {
    {knod::bus::error::denied, KNOD_ERR_DENIED},
    {knod::bus::error::invalid_argument, KNOD_ERR_INVALID_ARGUMENT},
    {knod::bus::error::no_such_binding, KNOD_ERR_NO_SUCH_BINDING},
    {knod::bus::error::quota_exceeded, KNOD_ERR_QUOTA_EXCEEDED},
    {knod::bus::error::isolation_violation, KNOD_ERR_ISOLATION_VIOLATION},
    {knod::bus::error::driver_failure, KNOD_ERR_DRIVER_FAILURE},
    {knod::bus::error::journal_unavailable, KNOD_ERR_JOURNAL_UNAVAILABLE},
    {knod::bus::error::invalid_policy, KNOD_ERR_INVALID_POLICY},
    {knod::bus::error::flow_conflict, KNOD_ERR_FLOW_CONFLICT},
    {knod::bus::error::limits_exceeded, KNOD_ERR_LIMITS_EXCEEDED},
    {knod::bus::error::out_of_resources, KNOD_ERR_OUT_OF_RESOURCES},
    {knod::bus::error::failed, KNOD_ERR_FAILED},
    // The bus's own answers: no daemon, or one that stopped answering; the bus policy's no.
    {"org.freedesktop.DBus.Error.ServiceUnknown", KNOD_ERR_UNAVAILABLE},
    {"org.freedesktop.DBus.Error.NameHasNoOwner", KNOD_ERR_UNAVAILABLE},
    {"org.freedesktop.DBus.Error.NoReply", KNOD_ERR_UNAVAILABLE},
    {"org.freedesktop.DBus.Error.Disconnected", KNOD_ERR_UNAVAILABLE},
    {"org.freedesktop.DBus.Error.Timeout", KNOD_ERR_UNAVAILABLE},
    {"org.freedesktop.DBus.Error.AccessDenied", KNOD_ERR_DENIED},
    {"org.freedesktop.DBus.Error.UnknownObject", KNOD_ERR_NO_SUCH_BINDING},
};

knod_errc code_of(const knod::Error &e, const std::string &dbus_name) {
    if (!dbus_name.empty()) {
        for (auto &[name, code] : by_name)
            if (dbus_name == name) return code;
        return KNOD_ERR_FAILED;
    }
    switch (e.code) {
    case Errc::unavailable:
        return KNOD_ERR_UNAVAILABLE;
    case Errc::expired:
        return KNOD_ERR_TIMEOUT;
    case Errc::invalid_argument:
        return KNOD_ERR_INVALID_ARGUMENT;
    case Errc::io:
        return KNOD_ERR_IO;
    default:
        return KNOD_ERR_FAILED;
    }
}

knod_errc fail(knod_error **out, knod_errc code, std::string message, std::string dbus_name = {},
               std::optional<std::string> rule = std::nullopt) {
    if (out) {
        *out = new (std::nothrow)
            knod_error{code, std::move(message), std::move(dbus_name), std::move(rule)};
    }
    return code;
}

knod_errc fail(knod_error **out, const knod::Error &e) {
    knod::client::Refusal r = knod::client::parse_refusal(e.message);
    knod_errc code = code_of(e, r.dbus_name);
    return fail(out, code, r.dbus_name.empty() ? e.message : r.message, r.dbus_name, r.rule);
}

// Runs `body`, turning what C++ could throw into an error.
template <typename Body> knod_errc guarded(knod_error **error, Body body) {
    if (error) *error = nullptr;
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(error, KNOD_ERR_NO_MEMORY, "out of memory");
    } catch (...) {
        return fail(error, KNOD_ERR_FAILED, "unexpected failure inside libknod-client");
    }
}

knod_errc missing(knod_error **error, const char *what) {
    return fail(error, KNOD_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

// --- chunks (knod_chunks_*) ------------------------------------------------------------------

std::uint32_t load32(const std::uint8_t *p) {
    std::uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v; // little-endian hosts only (x86-64, arm64): the wire's order
}

// UDP GSO for knod_chunks_send, until a send says the socket or kernel cannot (then off for the
// process); KNOD_CHUNKS_GSO=0 turns it off from the start.
std::atomic<bool> chunks_gso{[] {
    const char *v = std::getenv("KNOD_CHUNKS_GSO");
    return !(v && std::strcmp(v, "0") == 0);
}()};

std::uint32_t chunk_length(std::uint64_t seq, std::uint64_t total) {
    std::uint64_t left = total - seq * KNOD_CHUNK_PAYLOAD;
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(left, KNOD_CHUNK_PAYLOAD));
}

void unref(knod_client *c) {
    if (c && --c->refs == 0) delete c;
}

// The binding ended, as the daemon told us: KNOD_ERR_ENDED naming the reason, else nullopt.
std::optional<knod_errc> ended(knod_binding *b, knod_error **error) {
    if (!b->end) {
        auto end = b->owner->client.end_of(b->grant.id);
        if (!end || !*end) return std::nullopt;
        b->end = **end;
    }
    return fail(error, KNOD_ERR_ENDED, "binding " + b->grant.id + " ended: " + b->end->reason);
}

// The C API codes of a stream call's errors (knod/client.h).
knod_errc stream_code(knod::Errc e) {
    switch (e) {
    case knod::Errc::invalid_argument:
        return KNOD_ERR_INVALID_ARGUMENT;
    case knod::Errc::corrupt:
        return KNOD_ERR_FAILED;
    case knod::Errc::unavailable:
        return KNOD_ERR_TIMEOUT;
    case knod::Errc::revoked:
        return KNOD_ERR_ENDED;
    default:
        return KNOD_ERR_IO;
    }
}

} // namespace

extern "C" {

const char *knod_version(void) {
    return KNOD_VERSION;
}

const char *knod_errc_name(int code) {
    static const char *const names[] = {"ok",
                                        "denied",
                                        "invalid-argument",
                                        "no-such-binding",
                                        "quota-exceeded",
                                        "isolation-violation",
                                        "driver-failure",
                                        "journal-unavailable",
                                        "invalid-policy",
                                        "flow-conflict",
                                        "failed",
                                        "unavailable",
                                        "timeout",
                                        "ended",
                                        "io",
                                        "no-memory",
                                        "limits-exceeded",
                                        "out-of-resources"};
    if (code < 0 || static_cast<std::size_t>(code) >= sizeof names / sizeof names[0])
        return "unknown";
    return names[code];
}

knod_errc knod_error_code(const knod_error *e) {
    return e ? e->code : KNOD_OK;
}
const char *knod_error_message(const knod_error *e) {
    return e ? e->message.c_str() : "";
}
const char *knod_error_dbus_name(const knod_error *e) {
    return e && !e->dbus_name.empty() ? e->dbus_name.c_str() : nullptr;
}
const char *knod_error_rule(const knod_error *e) {
    return e && e->rule ? e->rule->c_str() : nullptr;
}
void knod_error_free(knod_error *e) {
    delete e;
}

knod_errc knod_client_connect(const char *address, knod_client **out, knod_error **error) {
    return guarded(error, [&] {
        if (!out) return missing(error, "out");
        auto c = knod::client::Client::connect(address ? address : "");
        if (!c) return fail(error, c.error());
        *out = new knod_client{std::move(*c)};
        return KNOD_OK;
    });
}

void knod_client_unref(knod_client *client) {
    unref(client);
}

knod_errc knod_request_binding(knod_client *client, const char *netdev, const char *gpu,
                               const char *mode, int region_fd, uint64_t offset, uint64_t length,
                               const char *const *flows, size_t n_flows, knod_binding **out,
                               knod_error **error) {
    return guarded(error, [&] {
        if (!client) return missing(error, "client");
        if (!out) return missing(error, "out");
        if (!netdev) return missing(error, "netdev");
        if (!gpu) return missing(error, "gpu");
        if (n_flows && !flows) return missing(error, "flows");
        if (region_fd < 0 || fcntl(region_fd, F_GETFD) < 0)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "region_fd " + std::to_string(region_fd) + " is not an open file");
        std::vector<std::string> flow_list;
        for (size_t i = 0; i < n_flows; ++i) {
            if (!flows[i]) return missing(error, ("flows[" + std::to_string(i) + "]").c_str());
            flow_list.emplace_back(flows[i]);
        }
        auto g = client->client.request_binding(netdev, gpu, mode ? mode : "rx-only", region_fd,
                                                offset, length, flow_list);
        if (!g) return fail(error, g.error());
        auto b = std::make_unique<knod_binding>();
        b->grant = std::move(*g);
        b->length = length;
        // The deciding rule is a property of the binding, not of the grant's reply.
        if (auto rule = client->client.rule(b->grant.id)) b->rule = std::move(*rule);
        b->owner = client;
        ++client->refs;
        *out = b.release();
        return KNOD_OK;
    });
}

knod_errc knod_register_buffer(knod_client *client, const char *netdev, const char *gpu,
                               int region_fd, uint64_t offset, uint64_t length,
                               const char *const *flows, size_t n_flows, knod_binding **out,
                               knod_error **error) {
    return guarded(error, [&] {
        if (!out) return missing(error, "out");
        knod_binding *b = nullptr;
        knod_errc rc = knod_request_binding(client, netdev, gpu, "rx-only", region_fd, offset,
                                            length, flows, n_flows, &b, error);
        if (rc != KNOD_OK) return rc;
        if ((rc = knod_binding_activate(b, error)) != KNOD_OK) {
            knod_binding_free(b); // releases the grant
            return rc;
        }
        *out = b;
        return KNOD_OK;
    });
}

knod_errc knod_binding_activate(knod_binding *b, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        auto r = b->owner->client.activate(b->grant.id, b->grant.key);
        if (!r) return fail(error, r.error());
        return KNOD_OK;
    });
}

knod_errc knod_binding_wait_for_data(knod_binding *b, uint64_t seen, int timeout_ms,
                                     uint64_t *rx_bytes, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        auto &client = b->owner->client;
        if (b->notifier && !b->notifier->fd.valid()) { // lost count: a restarted daemon
            b->notifier.reset();
            b->notifier_asked = false;
        }
        if (!b->notifier_asked) {
            b->notifier_asked = true;
            if (auto n = client.rx_notifier(b->grant.id, b->grant.key)) b->notifier = std::move(*n);
        }
        int ms = timeout_ms < 0 ? 0 : timeout_ms;
        auto rx = b->notifier ? client.wait_for_data(b->grant.id, *b->notifier, seen, ms)
                              : client.wait_for_data(b->grant.id, seen, ms);
        if (!rx) {
            if (auto e = ended(b, error)) return *e;
            if (rx.error().code == Errc::expired)
                return fail(error, KNOD_ERR_TIMEOUT, rx.error().message);
            return fail(error, rx.error());
        }
        if (rx_bytes) *rx_bytes = *rx;
        return KNOD_OK;
    });
}

knod_errc knod_binding_renew(knod_binding *b, uint64_t *expires_us, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        auto until = b->owner->client.renew(b->grant.id, b->grant.key);
        if (!until) {
            if (auto e = ended(b, error)) return *e;
            return fail(error, until.error());
        }
        if (expires_us) *expires_us = *until;
        return KNOD_OK;
    });
}

knod_errc knod_binding_set_job(knod_binding *b, const char *job, const char *group, uint32_t rank,
                               knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        if (!job) return missing(error, "job");
        auto r = b->owner->client.set_job(b->grant.id, b->grant.key, job, group ? group : "", rank);
        if (!r) {
            if (auto e = ended(b, error)) return *e;
            return fail(error, r.error());
        }
        return KNOD_OK;
    });
}

knod_errc knod_binding_release(knod_binding *b, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        if (b->released) return KNOD_OK;
        auto r = b->owner->client.release(b->grant.id);
        if (!r) {
            // Already over (revoked, expired, ...): nothing is left to release.
            if (ended(b, nullptr)) {
                b->released = true;
                return KNOD_OK;
            }
            return fail(error, r.error());
        }
        b->released = true;
        if (!b->end) b->end = knod::client::BindingEnd{false, "release"};
        return KNOD_OK;
    });
}

knod_errc knod_binding_counters(knod_binding *b, uint64_t *rx_bytes, uint64_t *rx_packets,
                                uint64_t *dropped_packets, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        auto c = b->owner->client.counters(b->grant.id);
        if (!c) {
            if (auto e = ended(b, error)) return *e;
            return fail(error, c.error());
        }
        if (rx_bytes) *rx_bytes = c->rx_bytes;
        if (rx_packets) *rx_packets = c->rx_packets;
        if (dropped_packets) *dropped_packets = c->dropped_packets;
        return KNOD_OK;
    });
}

knod_errc knod_binding_dmabuf_id(const knod_binding *b, uint32_t *out, knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        if (!out) return missing(error, "out");
        auto id = b->owner->client.dmabuf_id(b->grant.id);
        if (!id) return fail(error, id.error());
        *out = *id;
        return KNOD_OK;
    });
}

knod_errc knod_binding_end(knod_binding *b, int *is_ended, const char **reason, int *revoked,
                           knod_error **error) {
    return guarded(error, [&] {
        if (!b) return missing(error, "binding");
        if (!b->end) {
            auto end = b->owner->client.end_of(b->grant.id);
            if (!end) return fail(error, end.error());
            b->end = *end;
        }
        if (is_ended) *is_ended = b->end ? 1 : 0;
        if (reason) *reason = b->end ? b->end->reason.c_str() : nullptr;
        if (revoked) *revoked = b->end && b->end->revoked ? 1 : 0;
        return KNOD_OK;
    });
}

const char *knod_binding_id(const knod_binding *b) {
    return b ? b->grant.id.c_str() : nullptr;
}
const char *knod_binding_key_id(const knod_binding *b) {
    return b ? b->grant.key_id.c_str() : nullptr;
}
const char *knod_binding_rule(const knod_binding *b) {
    return b ? b->rule.c_str() : nullptr;
}
uint64_t knod_binding_length(const knod_binding *b) {
    return b ? b->length : 0;
}

void knod_binding_free(knod_binding *b) {
    if (!b) return;
    try {
        knod_binding_release(b, nullptr);
    } catch (...) { // guarded() already catches; nothing may unwind into C
    }
    std::fill(b->grant.key.begin(), b->grant.key.end(), std::uint8_t{0});
    knod_client *owner = b->owner;
    delete b;
    unref(owner);
}

knod_errc knod_devmem_rx_new(int tcp_fd, knod_devmem_rx **out, knod_error **error) {
    return guarded(error, [&] {
        if (!out) return missing(error, "out");
        if (tcp_fd < 0)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "the TCP socket fd " + std::to_string(tcp_fd) + " is negative");
        if (auto tcp = knod::client::check_devmem_socket(tcp_fd); !tcp)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT, tcp.error().message);
        knod::UniqueFd own(fcntl(tcp_fd, F_DUPFD_CLOEXEC, 0));
        if (!own.valid())
            return fail(error, KNOD_ERR_IO,
                        "devmem receive: cannot duplicate the socket fd " + std::to_string(tcp_fd) +
                            ": " + std::strerror(errno));
        int fd = own.get();
        *out = new knod_devmem_rx{std::move(own), knod::client::DevmemReceiver(fd), {}, {}};
        return KNOD_OK;
    });
}

void knod_devmem_rx_free(knod_devmem_rx *rx) {
    delete rx;
}

knod_errc knod_devmem_rx_wait(knod_devmem_rx *rx, int timeout_ms, knod_error **error) {
    return guarded(error, [&] {
        if (!rx) return missing(error, "rx");
        if (!rx->pending.empty()) return KNOD_OK;
        auto ready = rx->receiver.wait_for_data(timeout_ms < 0 ? -1 : timeout_ms);
        if (!ready) return fail(error, KNOD_ERR_IO, ready.error().message);
        if (!*ready)
            return fail(error, KNOD_ERR_TIMEOUT,
                        "nothing to receive within " + std::to_string(timeout_ms) + " ms");
        return KNOD_OK;
    });
}

knod_errc knod_devmem_rx_receive(knod_devmem_rx *rx, uint8_t *linear, size_t linear_size,
                                 size_t *linear_bytes, knod_devmem_fragment *fragments,
                                 size_t max_fragments, size_t *n_fragments, knod_error **error) {
    return guarded(error, [&] {
        if (!rx) return missing(error, "rx");
        if (!linear_bytes) return missing(error, "linear_bytes");
        if (!n_fragments) return missing(error, "n_fragments");
        if (!linear) return missing(error, "linear");
        if (!fragments) return missing(error, "fragments");
        // With no room for either, "nothing" would read as the peer's close.
        if (linear_size == 0 || max_fragments == 0)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "linear_size and max_fragments must be at least 1");
        *linear_bytes = 0;
        *n_fragments = 0;
        if (rx->pending.empty()) {
            auto got = rx->receiver.receive(std::span<std::uint8_t>(linear, linear_size));
            if (!got) {
                knod_errc code = got.error().code == Errc::unavailable ? KNOD_ERR_TIMEOUT
                                 : got.error().code == Errc::corrupt   ? KNOD_ERR_FAILED
                                                                       : KNOD_ERR_IO;
                return fail(error, code, got.error().message);
            }
            *linear_bytes = got->linear_bytes;
            rx->pending = std::move(got->fragments);
        }
        std::size_t n = std::min(max_fragments, rx->pending.size());
        for (std::size_t i = 0; i < n; ++i) {
            const auto &f = rx->pending[i];
            fragments[i] = knod_devmem_fragment{f.offset, f.size, f.token, f.dmabuf_id};
        }
        rx->pending.erase(rx->pending.begin(),
                          rx->pending.begin() + static_cast<std::ptrdiff_t>(n));
        *n_fragments = n;
        return KNOD_OK;
    });
}

knod_errc knod_devmem_rx_release(knod_devmem_rx *rx, const knod_devmem_fragment *fragments,
                                 size_t n, knod_error **error) {
    return guarded(error, [&] {
        if (!rx) return missing(error, "rx");
        if (!fragments && n) return missing(error, "fragments");
        std::vector<knod::client::DevmemFragment> list;
        list.reserve(n);
        for (std::size_t i = 0; i < n; ++i)
            list.push_back({fragments[i].offset, fragments[i].size, fragments[i].token,
                            fragments[i].dmabuf_id});
        if (auto r = rx->receiver.release(list); !r)
            return fail(error, KNOD_ERR_IO, r.error().message);
        return KNOD_OK;
    });
}

knod_errc knod_chunks_send(int fd, uint32_t addr, uint16_t port, const void *data, uint64_t total,
                           uint32_t msg, uint32_t source, uint64_t first, uint64_t upto,
                           knod_error **error) {
    return guarded(error, [&] {
        if (!data && total) return missing(error, "data");
        std::uint64_t chunks = (total + KNOD_CHUNK_PAYLOAD - 1) / KNOD_CHUNK_PAYLOAD;
        if (first > upto || upto > chunks || source > 0xFFFF)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "chunks [" + std::to_string(first) + ", " + std::to_string(upto) +
                            ") of a " + std::to_string(chunks) + "-chunk message from rank " +
                            std::to_string(source) + " cannot be sent");
        // Frames are built in batches; each batch goes out in one sendmmsg whose messages carry
        // up to `per_gso` whole frames each, cut into one datagram per frame by the kernel (UDP
        // GSO: one trip through the stack and the sim's veths per message, not per chunk). A
        // socket or kernel without GSO (EIO, EINVAL, ENOPROTOOPT) gets one frame a message.
        constexpr std::size_t per_gso = 65507 / KNOD_CHUNK_FRAME; // IPv4's largest UDP payload
        constexpr std::size_t batch = 4 * per_gso;
        static_assert(per_gso >= 1 && per_gso <= 64); // UDP_MAX_SEGMENTS
        // Not zeroed: every byte sent is written first (a short last chunk's tail explicitly). A
        // zeroed vector cost a 250 KB memset per call, and a call is made per credit round.
        std::size_t room = static_cast<std::size_t>(std::min<std::uint64_t>(batch, upto - first));
        auto frames = std::make_unique_for_overwrite<std::uint8_t[]>(room * KNOD_CHUNK_FRAME);
        mmsghdr msgs[batch];
        iovec iov[batch];
        alignas(cmsghdr) char control[batch][CMSG_SPACE(sizeof(std::uint16_t))];
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_addr.s_addr = addr;
        to.sin_port = htons(port);
        const auto *bytes = static_cast<const std::uint8_t *>(data);
        std::uint64_t seq = first;
        while (seq < upto) {
            std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(room, upto - seq));
            for (std::size_t i = 0; i < n; ++i) {
                std::uint8_t *f = frames.get() + i * KNOD_CHUNK_FRAME;
                std::uint32_t len = chunk_length(seq + i, total);
                std::uint32_t header[4] = {KNOD_CHUNK_MAGIC, msg,
                                           static_cast<std::uint32_t>(seq + i),
                                           len | (source << 16)};
                std::memcpy(f, header, sizeof header);
                std::memcpy(f + KNOD_CHUNK_HEADER, bytes + (seq + i) * KNOD_CHUNK_PAYLOAD, len);
                if (len < KNOD_CHUNK_PAYLOAD)
                    std::memset(f + KNOD_CHUNK_HEADER + len, 0, KNOD_CHUNK_PAYLOAD - len);
            }
            std::size_t sent = 0; // frames of this batch out
            while (sent < n) {
                bool gso = chunks_gso.load(std::memory_order_relaxed);
                std::size_t each = gso ? per_gso : 1;
                std::size_t m = 0;
                for (std::size_t at = sent; at < n; at += each, ++m) {
                    std::size_t k = std::min(each, n - at);
                    iov[m] = {frames.get() + at * KNOD_CHUNK_FRAME, k * KNOD_CHUNK_FRAME};
                    msgs[m] = {};
                    msgs[m].msg_hdr.msg_name = &to;
                    msgs[m].msg_hdr.msg_namelen = sizeof to;
                    msgs[m].msg_hdr.msg_iov = &iov[m];
                    msgs[m].msg_hdr.msg_iovlen = 1;
                    if (k > 1) {
                        msgs[m].msg_hdr.msg_control = control[m];
                        msgs[m].msg_hdr.msg_controllen = sizeof control[m];
                        cmsghdr *c = CMSG_FIRSTHDR(&msgs[m].msg_hdr);
                        c->cmsg_level = SOL_UDP;
                        c->cmsg_type = UDP_SEGMENT;
                        c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
                        std::uint16_t size = KNOD_CHUNK_FRAME;
                        std::memcpy(CMSG_DATA(c), &size, sizeof size);
                    }
                }
                int r = sendmmsg(fd, msgs, static_cast<unsigned>(m), 0);
                if (r < 0) {
                    if (errno == EINTR) continue;
                    if (gso && (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT)) {
                        // Nothing of the refused message went out: the rest one by one.
                        chunks_gso.store(false, std::memory_order_relaxed);
                        continue;
                    }
                    return fail(error, KNOD_ERR_IO,
                                std::string("sendmmsg: ") + std::strerror(errno) + " after " +
                                    std::to_string(seq + sent - first) + " chunk(s)");
                }
                for (int i = 0; i < r; ++i)
                    sent += iov[i].iov_len / KNOD_CHUNK_FRAME;
            }
            seq += n;
        }
        return KNOD_OK;
    });
}

knod_errc knod_chunks_receive(void *dst, const void *ring, uint64_t ring_frames, uint64_t slot,
                              uint64_t n, uint64_t first, uint64_t total, uint32_t msg,
                              uint32_t source, int dtype, int op, knod_error **error) {
    return guarded(error, [&] {
        if (!dst && total) return missing(error, "dst");
        if (!ring) return missing(error, "ring");
        std::uint64_t chunks = (total + KNOD_CHUNK_PAYLOAD - 1) / KNOD_CHUNK_PAYLOAD;
        if (ring_frames == 0 || slot >= ring_frames || first + n > chunks || source > 0xFFFF)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "chunks [" + std::to_string(first) + ", " + std::to_string(first + n) +
                            ") of a " + std::to_string(chunks) + "-chunk message at slot " +
                            std::to_string(slot) + " of a " + std::to_string(ring_frames) +
                            "-frame ring cannot be received");
        std::size_t size = knod::client::element_size(dtype);
        if (!knod::client::valid_operation(dtype, op))
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        "unknown element type " + std::to_string(dtype) + " or operation " +
                            std::to_string(op));
        if (op != KNOD_CHUNK_COPY && total % size)
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        std::to_string(total) + " bytes are not whole elements of " +
                            std::to_string(size) + " bytes");
        const auto *base = static_cast<const std::uint8_t *>(ring);
        auto frame = [&](std::uint64_t i) {
            return base + ((slot + i) % ring_frames) * KNOD_CHUNK_FRAME;
        };
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint8_t *f = frame(i);
            std::uint64_t seq = first + i;
            std::uint32_t want = chunk_length(seq, total) | (source << 16);
            std::uint32_t got[4] = {load32(f), load32(f + 4), load32(f + 8), load32(f + 12)};
            if (got[0] != KNOD_CHUNK_MAGIC || got[1] != msg ||
                got[2] != static_cast<std::uint32_t>(seq) || got[3] != want) {
                char text[320];
                std::snprintf(text, sizeof text,
                              "chunk %llu of message %u from rank %u is not the one expected "
                              "(magic %#x, message %u, sequence %u, length/source %#x; expected "
                              "sequence %llu, length/source %#x): a chunk was lost, reordered or "
                              "foreign",
                              static_cast<unsigned long long>(seq), msg, source, got[0], got[1],
                              got[2], got[3], static_cast<unsigned long long>(seq), want);
                return fail(error, KNOD_ERR_FAILED, text);
            }
        }
        auto *out = static_cast<std::uint8_t *>(dst);
        for (std::uint64_t i = 0; i < n; ++i) {
            std::uint64_t seq = first + i;
            std::uint32_t len = chunk_length(seq, total);
            std::uint8_t *to = out + seq * KNOD_CHUNK_PAYLOAD;
            const std::uint8_t *from = frame(i) + KNOD_CHUNK_HEADER;
            knod::client::apply_elements(to, from, len, dtype, op);
        }
        return KNOD_OK;
    });
}

knod_errc knod_stream_send(int fd, const void *data, uint64_t total, uint32_t msg, uint32_t source,
                           int timeout_ms, int cancel_fd, knod_error **error) {
    return guarded(error, [&] {
        if (!data && total) return missing(error, "data");
        if (auto sent = knod::client::send_stream_message(fd, data, {msg, source, total},
                                                          {timeout_ms, cancel_fd});
            !sent)
            return fail(error, stream_code(sent.error().code), sent.error().message);
        return KNOD_OK;
    });
}

knod_errc knod_devmem_stream_receive(knod_devmem_rx *rx, const void *dmabuf, uint64_t dmabuf_size,
                                     uint32_t dmabuf_id, void *dst, uint64_t total, uint32_t msg,
                                     uint32_t source, int dtype, int op, int timeout_ms,
                                     int cancel_fd, uint64_t *dmabuf_bytes, knod_error **error) {
    return guarded(error, [&] {
        if (!rx) return missing(error, "rx");
        if (!dmabuf && dmabuf_size) return missing(error, "dmabuf");
        if (!dst && total) return missing(error, "dst");
        if (!rx->pending.empty())
            return fail(error, KNOD_ERR_INVALID_ARGUMENT,
                        std::to_string(rx->pending.size()) +
                            " fragment(s) of an earlier knod_devmem_rx_receive are pending: "
                            "take them first");
        if (rx->scratch.empty()) rx->scratch.resize(64 << 10);
        knod::client::DevmemRegion region{
            std::span<const std::uint8_t>(static_cast<const std::uint8_t *>(dmabuf),
                                          static_cast<std::size_t>(dmabuf_size)),
            dmabuf_id};
        auto got = knod::client::receive_stream_message(rx->receiver, region, rx->scratch,
                                                        {msg, source, total}, {dst, dtype, op},
                                                        {timeout_ms, cancel_fd});
        if (!got) return fail(error, stream_code(got.error().code), got.error().message);
        if (dmabuf_bytes) *dmabuf_bytes = got->dmabuf_bytes;
        return KNOD_OK;
    });
}

} // extern "C"
