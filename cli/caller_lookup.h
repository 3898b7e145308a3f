// Builds a policy Caller from a uid or user name through NSS, as the daemon does for a peer.
#pragma once

#include "knod/result.h"
#include "policy/engine.h"

#include <string>

namespace knod::cli {

Result<policy::Caller> lookup_caller(const std::string &user_or_uid);

} // namespace knod::cli
