// GetHostReport's answer, composed by the core: the driver's netdevs, GPUs and data-path
// counters, the host's inventory and isolation checks (as `knod-policy doctor --json` prints
// them), and the journal's and sinks' state. JSON text.
#pragma once

#include "daemon/binding_manager.h"

#include <string>

namespace knod::daemon {

std::string host_report_json(const BindingManager &manager);

} // namespace knod::daemon
