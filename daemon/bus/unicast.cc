#include "daemon/bus/unicast.h"

#include "daemon/bus/bus_ptr.h"

#include <cstring>

namespace knod::bus {

Result<void> send_unicast(sd_bus *bus, const std::set<std::string> &destinations,
                          const SignalName &name, const SignalBody &body) {
    std::string failed;
    for (const auto &to : destinations) {
        sd_bus_message *raw = nullptr;
        int r = sd_bus_message_new_signal(bus, &raw, name.path, name.interface, name.member);
        MessagePtr m(raw);
        if (r >= 0) r = sd_bus_message_set_destination(m.get(), to.c_str());
        if (r >= 0) r = sd_bus_message_set_auto_start(m.get(), 0); // never start anyone
        if (r >= 0) r = body(m.get());
        if (r >= 0) r = sd_bus_send(bus, m.get(), nullptr);
        if (r < 0) failed += (failed.empty() ? "" : ", ") + to + " (" + std::strerror(-r) + ")";
    }
    if (!failed.empty())
        return make_error(Errc::io, std::string("signal ") + name.member + " to " + failed);
    return {};
}

Result<void> send_to_peer(sd_bus *peer, const SignalName &name, const SignalBody &body) {
    sd_bus_message *raw = nullptr;
    int r = sd_bus_message_new_signal(peer, &raw, name.path, name.interface, name.member);
    MessagePtr m(raw);
    if (r >= 0) r = body(m.get());
    if (r >= 0) r = sd_bus_send(peer, m.get(), nullptr);
    if (r < 0)
        return make_error(Errc::io,
                          std::string("signal ") + name.member + ": " + std::strerror(-r));
    return {};
}

} // namespace knod::bus
