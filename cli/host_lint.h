// `knod-policy check --host`: what a valid policy means on this host. Warnings, never errors:
// names that resolve to nothing here (users, groups, netdevs, GPUs, the auditor and admin
// groups), rules no hardware driver here can ever serve (an IOMMU requirement on a host without
// an IOMMU; the parser already warns about tx modes), and policies that can grant nothing at
// all (no rules, or only deny rules).
#pragma once

#include "host/paths.h"
#include "policy/parser.h"

#include <vector>

namespace knod::cli {

// Warnings about the policy itself, wherever it runs: no rules, or no allow rule.
std::vector<policy::Diagnostic> grant_warnings(const policy::Policy &p);

// Warnings about the policy on the host `paths` describes (users and groups from NSS).
std::vector<policy::Diagnostic> host_warnings(const policy::Policy &p,
                                              const host::HostPaths &paths);

} // namespace knod::cli
