// Signals addressed to one connection each. A signal with a destination is delivered by the bus
// to that connection only, whatever match rules others hold (eavesdropping aside, which the
// system bus refuses to ordinary users), so details about a binding reach exactly the
// connections the daemon names.
#pragma once

#include "knod/result.h"

#include <systemd/sd-bus.h>

#include <functional>
#include <set>
#include <string>

namespace knod::bus {

// Appends a signal's arguments; returns a negative errno on failure, as sd-bus does.
using SignalBody = std::function<int(sd_bus_message *)>;

struct SignalName {
    const char *path;
    const char *interface;
    const char *member;
};

// Builds one copy of the signal per destination (a sealed message cannot be re-addressed) and
// sends each. Every destination is tried; the error names the ones that failed.
Result<void> send_unicast(sd_bus *bus, const std::set<std::string> &destinations,
                          const SignalName &name, const SignalBody &body);

// On a peer-to-peer connection (the pod socket) there is one listener and no bus to route by:
// the signal goes out without a destination.
Result<void> send_to_peer(sd_bus *peer, const SignalName &name, const SignalBody &body);

} // namespace knod::bus
