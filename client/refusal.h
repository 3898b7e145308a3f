// What a refusal's D-Bus error says, taken apart for the C API: the D-Bus error name the client
// put in front of the daemon's message, and the rule that decided a policy refusal. The daemon
// sends the rule only inside its message (policy/engine.cc writes "denied by rule 'R'" and, for
// quotas, "...; rule 'R' allows N"); unit tests parse what the real engine writes, so a change
// of wording there fails them.
#pragma once

#include "knod/result.h"

#include <optional>
#include <string>

namespace knod::client {

struct Refusal {
    std::string dbus_name;           // empty when the error did not come over the bus
    std::string message;             // the message without the name in front
    std::optional<std::string> rule; // the deciding rule of a Denied or QuotaExceeded
};

// `message` as the client's calls return it: "org.knod.Policy1.Error.Denied: denied by rule
// 'x'; rule 'y': ..." for an answer from the bus, anything else for local failures.
Refusal parse_refusal(const std::string &message);

} // namespace knod::client
