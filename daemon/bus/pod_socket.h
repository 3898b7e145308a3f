// The pod socket: how a pod's processes reach knod-policyd, and nothing else (issue #51).
// Peer-to-peer D-Bus (sd-bus in server mode) with no bus daemon in between: the same objects,
// interfaces and errors as on the system bus (BusService serves its tables on each connection),
// and no other service to call, since there is no bus to route to one.
//
// Nothing the caller says identifies it. The kernel does, at accept: SO_PEERCRED's uid and pid,
// SO_PEERPIDFD's pidfd of the process that connected, and that process's network namespace,
// which must be a registered pod sandbox's, or the connection is closed (journaled pod-refused);
// at each call BusService checks that the process still runs and its sandbox is still
// registered. The SASL handshake identifies nobody, so any is accepted (EXTERNAL's uid check
// would refuse pods in a user namespace of their own, whose uid inside is not the kernel's).
//
// Bounded per pod sandbox and in all: reaching a bound refuses that caller only (closed,
// journaled as a limit refusal); no pod can use up what another pod needs, and host callers use
// the system bus, which no pod reaches. A connection ends when its peer closes it or its maker
// exits (its pidfd polls readable); its bindings then end as on a disconnect from the bus.
#pragma once

#include "daemon/bus/bus_ptr.h"
#include "daemon/bus/bus_service.h"
#include "knod/result.h"
#include "knod/unique_fd.h"

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace knod::bus {

struct PodSocketLimits {
    // A node runs ~110 pods by default; 32 each is more than an SDK user opens (one per
    // process), and 110 x 32 stays below the total.
    std::size_t per_sandbox = 32;
    std::size_t total = 4096;
};

class PodSocket {
  public:
    // Binds a socket at `path` (a socket file left there by an earlier daemon is replaced;
    // mode 0666, as the network namespace, not the file's mode, is the gate), listens and
    // serves on `event`.
    static Result<std::unique_ptr<PodSocket>> listen(const std::string &path, sd_event *event,
                                                     BusService &service,
                                                     PodSocketLimits limits = {});
    ~PodSocket();
    PodSocket(const PodSocket &) = delete;
    PodSocket &operator=(const PodSocket &) = delete;

    std::size_t connections() const { return conns_.size(); }

  private:
    // sd-bus closes without flushing: a peer that stops reading must not stall the daemon.
    struct CloseUnref {
        void operator()(sd_bus *b) const { sd_bus_close_unref(b); }
    };
    struct Connection {
        PodSocket *owner = nullptr;
        std::string name;
        std::string sandbox;
        std::unique_ptr<sd_bus, CloseUnref> bus;
        std::vector<SlotPtr> objects; // released before the bus (declared after it)
        SlotPtr disconnected;
        std::shared_ptr<UniqueFd> maker; // its pidfd: watched, so closed after the source
        SourcePtr maker_exit;
    };

    PodSocket(UniqueFd listener, std::string path, sd_event *event, BusService &service,
              PodSocketLimits limits);
    static int on_accept(sd_event_source *, int, uint32_t, void *self);
    static int on_disconnected(sd_bus_message *, void *conn, sd_bus_error *);
    static int on_maker_exit(sd_event_source *, int, uint32_t, void *conn);
    static int on_close_later(sd_event_source *, void *self);
    static int on_resume(sd_event_source *, uint64_t, void *self);
    // Identifies and serves one accepted connection; an error refuses it (closed).
    Result<void> serve(UniqueFd fd);
    // Drops a connection once the current dispatch is over (sd-bus must not be freed from
    // inside its own callback).
    void close_later(const std::string &name);

    UniqueFd listener_;
    std::string path_;
    sd_event *event_;
    BusService &service_;
    PodSocketLimits limits_;
    std::uint64_t serial_ = 0;
    std::map<std::string, std::unique_ptr<Connection>> conns_;
    std::map<std::string, std::size_t> per_sandbox_;
    std::set<std::string> closing_;
    SourcePtr accept_source_;
    SourcePtr closer_;
    SourcePtr resume_; // accepting again after the fd table was full
    dev_t dev_ = 0;    // the socket file this daemon bound, removed when it goes
    ino_t ino_ = 0;
};

} // namespace knod::bus
