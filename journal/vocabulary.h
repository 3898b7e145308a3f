// The values the daemon writes into the journal's kind, decision and end-reason fields, so the
// audit tools can refuse a filter that would match nothing (a typo) and list what is accepted.
// A new kind, decision or end reason in the daemon belongs here too: tests/unit
// (audit_export_test) scans the daemon's sources and fails on one that is missing.
#pragma once

#include "journal/records.h"

#include <string>
#include <vector>

namespace knod::journal {

inline const std::vector<std::string> &known_kinds() {
    static const std::vector<std::string> v = {kind::granted,
                                               kind::denied,
                                               kind::ended,
                                               kind::revoked,
                                               kind::reload,
                                               kind::daemon_start,
                                               kind::daemon_stop,
                                               kind::prune,
                                               "activated",
                                               "activate-failed",
                                               kind::activate_refused,
                                               "renewed",
                                               "renew-refused",
                                               kind::reload_refused,
                                               kind::revoke_refused,
                                               kind::attest_refused,
                                               kind::pod_refused,
                                               kind::rate_limited,
                                               kind::coalesced,
                                               kind::adopted,
                                               kind::not_adopted,
                                               kind::holder_returned,
                                               kind::job_tagged,
                                               "job-tag-refused",
                                               kind::sink_failing,
                                               kind::sink_recovered};
    return v;
}

// A decision event's verdict, a refused action's cause, and, in refusals-coalesced events, the
// kind of the refusals counted.
inline const std::vector<std::string> &known_decisions() {
    static const std::vector<std::string> v = {"allow",
                                               "deny",
                                               "quota-exceeded",
                                               "would-deny",
                                               "isolation-violation",
                                               "flow-conflict",
                                               "driver-failure",
                                               "invalid-request",
                                               "key-refused",
                                               "journal-unavailable",
                                               "not-authorized",
                                               "invalid-policy",
                                               "not-proven",
                                               "connector-gone",
                                               "not-a-pod",
                                               kind::denied,
                                               kind::rate_limited,
                                               kind::activate_refused,
                                               "renew-refused",
                                               "job-tag-refused",
                                               kind::reload_refused,
                                               kind::revoke_refused,
                                               kind::attest_refused,
                                               kind::pod_refused};
    return v;
}

// Why a session ended (sessions.end_reason, and the reason of its session-ended event).
inline const std::vector<std::string> &known_end_reasons() {
    static const std::vector<std::string> v = {"release",      "revoke",         "expire",
                                               "process-exit", "disconnect",     "policy-reload",
                                               "daemon-stop",  "daemon-restart", "steering-drift",
                                               "link-down",    "link-removed",   "pod-deleted"};
    return v;
}

} // namespace knod::journal
