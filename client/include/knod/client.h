/* libknod-client: the knod-policyd client API in C (SONAME libknod-client.so.1).
 *
 * What the article's `knod.register_buffer(ptr, n)` / `knod.wait_for_data(handle, 100)` do,
 * over the daemon's D-Bus API (org.knod.Policy1 on the system bus; the interface XML is
 * installed as /usr/share/dbus-1/interfaces/org.knod.Policy1.xml). A program connects, asks
 * for a binding of a netdev to a region of GPU memory (a dma-buf fd, or a sealed memfd for the
 * sim driver) for some flows, activates it with the key the grant carries, waits for data,
 * and releases it. Build with `pkg-config --cflags --libs knod-client`.
 *
 * Conventions:
 *  - Handles are opaque. A knod_binding keeps its knod_client alive (reference counted), so
 *    they may be freed in any order. One handle is used by one thread at a time, in the
 *    process that made it: in a forked child its calls fail (KNOD_ERR_INVALID_ARGUMENT, naming
 *    both processes); the child connects anew.
 *  - Every call that can fail returns a knod_errc (KNOD_OK is 0) and, when `error` is not
 *    NULL, stores a knod_error the caller frees with knod_error_free(). Outputs are written
 *    only on success.
 *  - Strings returned by accessors belong to the handle they came from and live as long as it.
 *  - Byte counts are bytes; times are microseconds since the Unix epoch; timeouts milliseconds.
 */
#ifndef KNOD_CLIENT_H
#define KNOD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KNOD_CLIENT_BUILDING)
#define KNOD_API __attribute__((visibility("default")))
#else
#define KNOD_API
#endif

/* What went wrong, to branch on. The daemon's refusals map one to one onto its D-Bus error
 * names (knod_error_dbus_name() gives the name itself). Values never change meaning. */
typedef enum knod_errc {
    KNOD_OK = 0,
    KNOD_ERR_DENIED = 1,              /* org.knod.Policy1.Error.Denied (policy, key, holder) */
    KNOD_ERR_INVALID_ARGUMENT = 2,    /* org.knod.Policy1.Error.InvalidArgument */
    KNOD_ERR_NO_SUCH_BINDING = 3,     /* org.knod.Policy1.Error.NoSuchBinding (or released) */
    KNOD_ERR_QUOTA_EXCEEDED = 4,      /* org.knod.Policy1.Error.QuotaExceeded */
    KNOD_ERR_ISOLATION_VIOLATION = 5, /* org.knod.Policy1.Error.IsolationViolation */
    KNOD_ERR_DRIVER_FAILURE = 6,      /* org.knod.Policy1.Error.DriverFailure */
    KNOD_ERR_JOURNAL_UNAVAILABLE = 7, /* org.knod.Policy1.Error.JournalUnavailable */
    KNOD_ERR_INVALID_POLICY = 8,      /* org.knod.Policy1.Error.InvalidPolicy */
    KNOD_ERR_FLOW_CONFLICT = 9,       /* org.knod.Policy1.Error.FlowConflict */
    KNOD_ERR_FAILED = 10,             /* org.knod.Policy1.Error.Failed, or another error */
    KNOD_ERR_UNAVAILABLE = 11,        /* no bus, or knod-policyd not running on it */
    KNOD_ERR_TIMEOUT = 12,            /* a wait ran out of time; nothing changed */
    KNOD_ERR_ENDED = 13,              /* the binding ended (knod_binding_end() says why) */
    KNOD_ERR_IO = 14,                 /* the bus connection failed or a reply was malformed */
    KNOD_ERR_NO_MEMORY = 15,
    KNOD_ERR_LIMITS_EXCEEDED = 16, /* org.knod.Policy1.Error.LimitsExceeded: a bound on what the
                                    * daemon keeps for callers (connections, polkit questions,
                                    * bindings in all, ...); retry later or use fewer */
    KNOD_ERR_OUT_OF_RESOURCES = 17 /* org.knod.Policy1.Error.OutOfResources: the daemon ran out
                                    * of fds, memory or disk (the message says which); nothing
                                    * changed; retry once it is back */
} knod_errc;

typedef struct knod_error knod_error;
typedef struct knod_client knod_client;
typedef struct knod_binding knod_binding;

/* "0.1.0": the library's version (not the daemon's). */
KNOD_API const char *knod_version(void);
/* A stable lower-case name for a code: "denied", "quota-exceeded", ... ("unknown" otherwise). */
KNOD_API const char *knod_errc_name(int code);

KNOD_API knod_errc knod_error_code(const knod_error *error);
/* A message a person can act on (the daemon's own text for its refusals). Never NULL. */
KNOD_API const char *knod_error_message(const knod_error *error);
/* The D-Bus error name the daemon or the bus answered with, e.g.
 * "org.knod.Policy1.Error.Denied"; NULL when the error did not come over the bus. */
KNOD_API const char *knod_error_dbus_name(const knod_error *error);
/* For a policy refusal (Denied, QuotaExceeded): the name of the rule that decided it. NULL
 * when no rule decided (a default deny, a refused key, any other error). */
KNOD_API const char *knod_error_rule(const knod_error *error);
KNOD_API void knod_error_free(knod_error *error);

/* Connects to the bus at `address` (a D-Bus address such as "unix:path=/run/dbus/x"); NULL or
 * "" means the system bus (DBUS_SYSTEM_BUS_ADDRESS is honoured). Does not check the daemon. */
KNOD_API knod_errc knod_client_connect(const char *address, knod_client **out, knod_error **error);
/* Drops the caller's reference; the connection closes when no binding holds it either. */
KNOD_API void knod_client_unref(knod_client *client);

/* RequestBinding: asks the daemon for a binding of `netdev` to bytes [offset, offset+length)
 * of `region_fd` (a dma-buf; for the sim a memfd sealed with F_SEAL_SHRINK) for `flows`
 * (flow specs such as "udp 10.99.0.0/24:* -> 10.99.0.2:5000"), mode "rx-only" when `mode` is
 * NULL. The binding is granted inactive: nothing is delivered until knod_binding_activate().
 * The fd stays the caller's. */
KNOD_API knod_errc knod_request_binding(knod_client *client, const char *netdev, const char *gpu,
                                        const char *mode, int region_fd, uint64_t offset,
                                        uint64_t length, const char *const *flows, size_t n_flows,
                                        knod_binding **out, knod_error **error);
/* The article's register_buffer: knod_request_binding() (rx-only), then
 * knod_binding_activate(); on an activation failure the grant is released again. */
KNOD_API knod_errc knod_register_buffer(knod_client *client, const char *netdev, const char *gpu,
                                        int region_fd, uint64_t offset, uint64_t length,
                                        const char *const *flows, size_t n_flows,
                                        knod_binding **out, knod_error **error);

/* Presents the binding's key (Binding.Activate): data starts to flow into the region. */
KNOD_API knod_errc knod_binding_activate(knod_binding *binding, knod_error **error);
/* Waits until the binding's RxBytes passes `seen`, at most `timeout_ms` (< 0: 0); stores the
 * new RxBytes. Byte i of the stream is at offset + (i mod length) in the region.
 * KNOD_ERR_TIMEOUT when nothing came; KNOD_ERR_ENDED when the binding ended. */
KNOD_API knod_errc knod_binding_wait_for_data(knod_binding *binding, uint64_t seen, int timeout_ms,
                                              uint64_t *rx_bytes, knod_error **error);
/* Binding.Renew: extends the key by the policy's key lifetime from now; stores the new expiry
 * (microseconds since the epoch) when `expires_us` is not NULL. */
KNOD_API knod_errc knod_binding_renew(knod_binding *binding, uint64_t *expires_us,
                                      knod_error **error);
/* Binding.SetJob: tags the binding with the job its holder serves (a torch.distributed job's
 * store address or name, 1 to 64 bytes; its group, 0 to 64 bytes, NULL for ""; both only of
 * letters, digits and . _ : @ / -) and the holder's rank (at most 65535), for the journal,
 * `knod-policy bindings` and the metrics. Once per binding: a second call, or a bad string, is
 * KNOD_ERR_INVALID_ARGUMENT and changes nothing. A label, never a policy input. */
KNOD_API knod_errc knod_binding_set_job(knod_binding *binding, const char *job, const char *group,
                                        uint32_t rank, knod_error **error);
/* Binding.Release: ends the binding (end reason "release"). Releasing twice is KNOD_OK. */
KNOD_API knod_errc knod_binding_release(knod_binding *binding, knod_error **error);
/* The daemon's counters: bytes and packets delivered, packets of its flows dropped (any of
 * the pointers may be NULL). */
KNOD_API knod_errc knod_binding_counters(knod_binding *binding, uint64_t *rx_bytes,
                                         uint64_t *rx_packets, uint64_t *dropped_packets,
                                         knod_error **error);
/* The kernel's id of the binding's dma-buf (Binding.DmabufId): what netdev bind-rx returned at
 * activation, and what the kernel puts in every fragment of it (knod_devmem_fragment's
 * dmabuf_id). A devmem holder refuses fragments that carry another id: they are another
 * binding's dma-buf (a flow steered onto another binding's queue), and reading them off its own
 * mapping would read the wrong bytes. Stores 0 when there is none: not a devmem binding (the
 * sim and knod drivers), not active yet, or a daemon older than the property. */
KNOD_API knod_errc knod_binding_dmabuf_id(const knod_binding *binding, uint32_t *out,
                                          knod_error **error);
/* Whether the binding has ended, and why, as the daemon told this connection: stores 1 and
 * the end reason ("release", "expire", "revoke: <reason>", "process-exit", "link-down", ...)
 * and whether it was revoked (ended by someone or something other than its holder), or 0
 * while it lives. Does not wait. Any output pointer may be NULL. */
KNOD_API knod_errc knod_binding_end(knod_binding *binding, int *ended, const char **reason,
                                    int *revoked, knod_error **error);

/* The binding's id ("b3"), the key id, the rule that granted it, the region bytes asked for. */
KNOD_API const char *knod_binding_id(const knod_binding *binding);
KNOD_API const char *knod_binding_key_id(const knod_binding *binding);
KNOD_API const char *knod_binding_rule(const knod_binding *binding);
KNOD_API uint64_t knod_binding_length(const knod_binding *binding);
/* Frees the handle; a binding still held is released first (errors ignored). */
KNOD_API void knod_binding_free(knod_binding *binding);

/* Receiving on a devmem binding (Linux device-memory TCP, Documentation/networking/devmem.rst):
 * the NIC writes the payload of the binding's TCP flows into the holder's dma-buf, and the
 * holder's own TCP socket (connected or accepted) says where it landed instead of handing over
 * the bytes. A receiver reads one socket through a duplicate of its own (made by
 * knod_devmem_rx_new, closed by knod_devmem_rx_free): the caller's fd stays the caller's, and
 * may be closed at any time. */
typedef struct knod_devmem_rx knod_devmem_rx; /* for one thread at a time */
/* `size` payload bytes at byte `offset` of the dma-buf; `token` is what release gives back. */
typedef struct knod_devmem_fragment {
    uint64_t offset;
    uint32_t size;
    uint32_t token;
    uint32_t dmabuf_id;
} knod_devmem_fragment;

/* KNOD_ERR_INVALID_ARGUMENT when `tcp_fd` is not a TCP socket (devmem receive is TCP only). */
KNOD_API knod_errc knod_devmem_rx_new(int tcp_fd, knod_devmem_rx **out, knod_error **error);
KNOD_API void knod_devmem_rx_free(knod_devmem_rx *rx);
/* Waits up to `timeout_ms` (< 0: for ever) until a receive will not block (fragments, linear
 * bytes, or the peer's close), on the socket alone (no daemon round trip). KNOD_ERR_TIMEOUT
 * when the time ran out. */
KNOD_API knod_errc knod_devmem_rx_wait(knod_devmem_rx *rx, int timeout_ms, knod_error **error);
/* One recvmsg(MSG_SOCK_DEVMEM): stores up to `max_fragments` fragments, in stream order, and
 * their count in *n_fragments; bytes the NIC could not place in the dma-buf (SCM_DEVMEM_LINEAR,
 * or a socket that is not devmem) are copied into `linear` (up to `linear_size`), their count
 * in *linear_bytes. Fragments beyond `max_fragments` are kept and handed out by the next calls
 * first (with no new recvmsg). Zero fragments and zero bytes: the peer closed the stream
 * (`linear_size` and `max_fragments` must be at least 1, so this is never a lack of room).
 * KNOD_ERR_TIMEOUT on a non-blocking socket with nothing to read. Fragments stay the holder's
 * until released: the NIC cannot reuse their memory. */
KNOD_API knod_errc knod_devmem_rx_receive(knod_devmem_rx *rx, uint8_t *linear, size_t linear_size,
                                          size_t *linear_bytes, knod_devmem_fragment *fragments,
                                          size_t max_fragments, size_t *n_fragments,
                                          knod_error **error);
/* Gives the fragments' buffers back to the NIC (SO_DEVMEM_DONTNEED, in batches within the
 * kernel's limits). An error names how many of them the kernel freed. */
KNOD_API knod_errc knod_devmem_rx_release(knod_devmem_rx *rx, const knod_devmem_fragment *fragments,
                                          size_t n, knod_error **error);

/* --- Chunks: knod.distributed's data path (docs/collectives.md) -----------------------------
 *
 * A message of `total` bytes from one rank to another travels as chunks, one UDP datagram of
 * KNOD_CHUNK_FRAME bytes each: a 16-byte header of little-endian uint32s (KNOD_CHUNK_MAGIC, the
 * message number, the chunk's sequence number, its payload length | the source rank << 16), then
 * up to KNOD_CHUNK_PAYLOAD payload bytes (the last chunk's are zero-padded). They land in the
 * receiver's region, a ring of whole frames. These calls are the hot path on raw pointers; the
 * flow control around them (credits) is the caller's. A frame with its IPv4 and UDP headers is
 * 3,500 bytes: the path's MTU must be at least that (the sim's veths are); a smaller one fails
 * knod_chunks_send with "Message too long" on a socket that forbids fragments
 * (IP_PMTUDISC_DO), or loses chunks, which the receiver reports. */
#define KNOD_CHUNK_HEADER 16
#define KNOD_CHUNK_PAYLOAD 3456
#define KNOD_CHUNK_FRAME 3472
#define KNOD_CHUNK_MAGIC 0x444F4E4Bu

/* Element types and operations of knod_chunks_receive. */
typedef enum knod_chunk_dtype {
    KNOD_CHUNK_U8 = 1,
    KNOD_CHUNK_I8 = 2,
    KNOD_CHUNK_I16 = 3,
    KNOD_CHUNK_I32 = 4,
    KNOD_CHUNK_I64 = 5,
    KNOD_CHUNK_F32 = 6,
    KNOD_CHUNK_F64 = 7
} knod_chunk_dtype;
typedef enum knod_chunk_op {
    KNOD_CHUNK_COPY = 0,
    KNOD_CHUNK_SUM = 1,
    KNOD_CHUNK_PRODUCT = 2,
    KNOD_CHUNK_MIN = 3,
    KNOD_CHUNK_MAX = 4
} knod_chunk_op;

/* Sends chunks [first, upto) of message `msg` (`total` bytes at `data`, from rank `source`) on
 * the UDP socket `fd` to IPv4 address `addr` (network byte order) and `port` (host byte order),
 * with sendmmsg in batches. KNOD_ERR_IO naming the error and how many were sent. */
KNOD_API knod_errc knod_chunks_send(int fd, uint32_t addr, uint16_t port, const void *data,
                                    uint64_t total, uint32_t msg, uint32_t source, uint64_t first,
                                    uint64_t upto, knod_error **error);
/* Takes chunks [first, first + n) of message `msg` (`total` bytes, from rank `source`) from
 * `ring` (`ring_frames` frames), the first at frame `slot` (wrapping): checks every header,
 * then applies the payloads to `dst` (the message's `total` bytes): KNOD_CHUNK_COPY copies, the
 * other ops reduce elementwise as `dtype` (dst = dst op chunk; integers wrap; MIN and MAX pass
 * NaN on). A chunk that is not the one expected (lost, reordered, foreign) is KNOD_ERR_FAILED
 * naming it, and nothing is applied; an unknown dtype or op, or a payload that is not whole
 * elements, KNOD_ERR_INVALID_ARGUMENT. */
KNOD_API knod_errc knod_chunks_receive(void *dst, const void *ring, uint64_t ring_frames,
                                       uint64_t slot, uint64_t n, uint64_t first, uint64_t total,
                                       uint32_t msg, uint32_t source, int dtype, int op,
                                       knod_error **error);

/* --- Streams: knod.distributed's data path on devmem (docs/collectives.md) -----------------
 *
 * On a devmem binding a message from one rank to another travels on the TCP stream the sender
 * opened to the receiver's flow: a header of KNOD_STREAM_HEADER bytes (little-endian uint32
 * KNOD_CHUNK_MAGIC, the message number, the source rank, zero; uint64 the payload's length),
 * then the payload, which the NIC places in the receiver's dma-buf. */
#define KNOD_STREAM_HEADER 24

/* Both calls take the whole message's budget, `timeout_ms` (< 0: no limit), and `cancel_fd`
 * (< 0: none): once that fd is readable (an eventfd or pipe another thread writes), the call
 * stops with KNOD_ERR_ENDED. The time running out is KNOD_ERR_TIMEOUT. After any error the
 * stream is out of step: close it. */

/* Sends message `msg` (`total` bytes at `data`, from rank `source`) on the connected TCP socket
 * `fd`, header and payload, whole. One sender per socket at a time: two would interleave their
 * bytes. KNOD_ERR_IO naming how many bytes went (the peer closed or reset the stream). */
KNOD_API knod_errc knod_stream_send(int fd, const void *data, uint64_t total, uint32_t msg,
                                    uint32_t source, int timeout_ms, int cancel_fd,
                                    knod_error **error);
/* Receives message `msg` (`total` bytes, from rank `source`) on `rx`'s socket: checks its header
 * and applies the payload to `dst` as knod_chunks_receive does (KNOD_CHUNK_COPY copies, the
 * other ops reduce as `dtype`), reading what the NIC placed in the dma-buf from `dmabuf`, the
 * CPU mapping of the binding's dma-buf (`dmabuf_size` bytes, the kernel's id `dmabuf_id`:
 * knod_binding_dmabuf_id), and giving every fragment back before it returns. It never reads past
 * the message: the next one stays in the socket. Stores the bytes that came in the dma-buf in
 * *dmabuf_bytes (may be NULL). KNOD_ERR_FAILED naming what came for a stream that carries
 * another message, and for a fragment of another dma-buf (a flow steered onto another binding's
 * queue; with `dmabuf_id` 0 no fragment is taken) or outside this one; KNOD_ERR_IO naming how far
 * it got for a stream that ends or fails first; KNOD_ERR_INVALID_ARGUMENT for fragments an
 * earlier knod_devmem_rx_receive left pending. The CPU reads the mapping as it is: on a machine
 * whose DMA is not cache-coherent the dma-buf needs DMA_BUF_IOCTL_SYNC around it. */
KNOD_API knod_errc knod_devmem_stream_receive(knod_devmem_rx *rx, const void *dmabuf,
                                              uint64_t dmabuf_size, uint32_t dmabuf_id, void *dst,
                                              uint64_t total, uint32_t msg, uint32_t source,
                                              int dtype, int op, int timeout_ms, int cancel_fd,
                                              uint64_t *dmabuf_bytes, knod_error **error);

#ifdef __cplusplus
}
#endif

#endif /* KNOD_CLIENT_H */
