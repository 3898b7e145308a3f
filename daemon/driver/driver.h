// The one interface the binding manager programs: sim, devmem and knod backends implement it.
#pragma once

#include "daemon/driver/region.h"
#include "knod/result.h"
#include "knod/unique_fd.h"
#include "policy/flow_spec.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace knod::driver {

struct GpuInfo {
    std::string name;               // the name requests use: sim name, PCI address or node
    std::vector<std::string> names; // every name it goes by, for policy matching
    std::uint64_t vram_bytes = 0;
    std::string pci; // PCI address, for isolation checks; empty for a simulated GPU
};

struct NetdevInfo {
    std::string name;
    std::uint32_t rx_queues = 0;
    std::string pci; // the NIC's PCI address; empty for a simulated one
};

// A binding's data-path counters as the driver counts them; the session's end journals them.
struct Counters {
    std::uint64_t rx_bytes = 0;
    std::uint64_t rx_packets = 0;
    std::uint64_t dropped_packets = 0; // dropped on its path (filter drops, foreign packets)
};

// What the driver needs to set up one binding's data path.
struct BindingPlan {
    std::string id;
    std::string netdev;
    std::string gpu;
    std::vector<policy::FlowSpec> flows;
    int region_fd = -1; // the daemon's own dup; valid until detach()
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
};

class Driver {
  public:
    virtual ~Driver() = default;
    virtual std::string name() const = 0;
    // The region kind this driver can place data into.
    virtual RegionKind region_kind() const = 0;
    virtual Result<GpuInfo> gpu(const std::string &name) const = 0;
    virtual Result<NetdevInfo> netdev(const std::string &name) const = 0;
    virtual std::vector<GpuInfo> gpus() const = 0;
    virtual std::vector<NetdevInfo> netdevs() const = 0;

    // Reserves queues and installs the binding's flows, inactive: nothing is delivered yet.
    // Returns the RX queues it got.
    virtual Result<std::vector<std::uint32_t>> attach(const BindingPlan &plan) = 0;
    // Starts delivery; called only after the holder presented its key.
    virtual Result<void> activate(const std::string &id) = 0;
    // Stops delivery at once and frees everything attach() took. Never fails.
    virtual void detach(const std::string &id) = 0;
    virtual Counters counters(const std::string &id) const = 0;
    // The kernel's id of the dma-buf the binding is bound to (what netdev bind-rx returned, and
    // what the kernel puts in every SCM_DEVMEM_DMABUF fragment as dmabuf_id), so the holder can
    // refuse fragments of another binding's dma-buf. nullopt: none (not a devmem binding, or
    // not active yet).
    virtual std::optional<std::uint32_t> dmabuf_id(const std::string & /*id*/) const {
        return std::nullopt;
    }
    // For the holder's wait_for_data: the read end of a pipe (close-on-exec; the caller's) on
    // which the driver writes the binding's RxBytes total (a native-endian u64 per record) after
    // the payloads it places in the binding's region from now on (the sim: once per drain of its
    // receive ring, after every payload of that drain is in place), so the holder sleeps on it
    // instead of polling RxBytes. A pipe, not an eventfd: the holder must share no open file
    // with the daemon (an eventfd's one file carries O_NONBLOCK for both ends, so a holder could
    // clear it and make the loop's write block). A new one replaces the last (the old one reads
    // EOF). Drivers that place no data themselves (the holder receives: devmem) have none.
    virtual Result<UniqueFd> rx_notifier(const std::string & /*id*/) {
        return make_error(Errc::unsupported,
                          "the " + name() + " driver does not place data itself: no notifier");
    }
    // Bindings whose isolation no longer holds, each with what was seen (foreign packets on its
    // queue, RSS or another ntuple rule reaching it). The manager asks every tick and ends each
    // as steering-drift: fail closed. Cheap when nothing changed.
    virtual std::map<std::string, std::string> drifted() { return {}; }
    // Driver-wide counters for the host report (traffic no binding claimed, and so on).
    virtual std::map<std::string, std::uint64_t> stats() const { return {}; }
    // What the driver runs without or around on this kernel, and why (a refused helper and the
    // path taken instead): the daemon logs them at start and the host report carries them.
    virtual std::vector<std::string> notes() const { return {}; }
    // Whether netdevs() are real links whose going down or away ends their bindings (the sim
    // without its data path names a netdev that does not exist; a real link of the same name,
    // someone else's, is none of its business).
    virtual bool netdevs_are_links() const { return true; }
    // Why this driver has no data path at all (the host has nothing to drive): every request
    // is then refused with DriverFailure and this text, and journaled. nullopt: it has one.
    virtual std::optional<std::string> unavailable() const { return std::nullopt; }
    // A restart that keeps bindings (systemd's fd store). `handles`: the binding's own kernel
    // handles that must outlive the daemon for the binding to (role -> fd, roles of
    // [A-Za-z0-9_]; the daemon stores them, the driver keeps owning them). `handoff`: what the
    // driver needs to take the binding back (opaque text), or nullopt when it cannot; then
    // the binding ends at the stop as before. `readopt`: the next start takes it back from that
    // text and the handles that came back (already active when `active`); returns its queues.
    virtual std::map<std::string, int> handles(const std::string &) const { return {}; }
    virtual std::optional<std::string> handoff(const std::string &) const { return std::nullopt; }
    virtual Result<std::vector<std::uint32_t>>
    readopt(const BindingPlan &, bool /*active*/, const std::string & /*handoff*/,
            std::map<std::string, UniqueFd> /*handles*/) {
        return make_error(Errc::unsupported,
                          "the " + name() + " driver cannot take a binding back after a restart");
    }
    // A handed-over binding that is not taken back (its holder left, its handles were
    // discarded): whatever of it outlived the daemon besides its handles goes now.
    virtual void abandon(const std::string & /*netdev*/, const std::string & /*handoff*/) {}
    // What happens to traffic no binding claims (policy setting unmatched_traffic), applied at
    // start and on every reload. A backend without a filter of its own can only pass it to the
    // normal stack: dropping is Errc::unsupported there, never silently ignored.
    virtual Result<void> set_unmatched_drop(bool drop) {
        if (!drop) return {};
        return make_error(Errc::unsupported,
                          "unmatched_traffic = \"drop\" needs the XDP flow filter, which the " +
                              name() + " driver does not run; set unmatched_traffic = \"pass\"");
    }
};

} // namespace knod::driver
