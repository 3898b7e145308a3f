// What the journal stores: sessions and chained events.
#pragma once

#include "knod/result.h"

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace knod::journal {

using Hash = std::array<std::uint8_t, 32>;

// Event kinds written by the daemon. Free text is allowed, but these are the ones tools know.
namespace kind {
inline constexpr const char *granted = "request-granted";
inline constexpr const char *denied = "request-denied";
inline constexpr const char *ended = "session-ended";
inline constexpr const char *revoked = "revoke";
inline constexpr const char *reload = "policy-reload";
inline constexpr const char *daemon_start = "daemon-start";
inline constexpr const char *daemon_stop = "daemon-stop";
inline constexpr const char *prune = "retention-prune";
inline constexpr const char *activate_refused = "activate-refused";
// Privileged actions refused; decision says why (not-authorized: the caller may not;
// invalid-policy: the policy would not load). Coalesced per uid and kind like every refusal.
inline constexpr const char *reload_refused = "reload-refused";
inline constexpr const char *revoke_refused = "revoke-refused";
// AttestProcess refused (decision not-proven): the socket did not prove the caller's process.
inline constexpr const char *attest_refused = "attest-refused";
// A pod sandbox whose declared offload request (its knod.io/ annotations) the policy denies,
// refused at the CNI plugin's ADD: the pod fails to start. detail: pod, sandbox, request.
inline constexpr const char *pod_refused = "pod-refused";
inline constexpr const char *rate_limited = "rate-limited"; // a call over the per-uid rate limit
// How many refusals of one uid and kind were counted, not journaled one by one, in a window.
inline constexpr const char *coalesced = "refusals-coalesced";
// A binding the previous daemon handed over (systemd's fd store) was taken back at start, or
// could not be (the reason says why; its session then ends as daemon-restart).
inline constexpr const char *adopted = "adopted";
inline constexpr const char *not_adopted = "not-adopted";
// A pod-socket holder connected again after a restart and holds its binding on the new
// connection (its process proven: the same pid and start time).
inline constexpr const char *holder_returned = "holder-returned";
// The holder tagged its binding with the job it serves (Binding.SetJob, issue #53): detail
// {job, group, rank}, the holder's claim (never decided on). Once per binding.
inline constexpr const char *job_tagged = "job-tagged";
inline constexpr const char *anchor =
    "journal-anchor"; // sinks only: the chain head, never in the chain
// A copy sink (journald, linux-audit) started refusing records, or takes them again; `rule`
// names the sink, `reason` the error. Once per change (and at most one per sink per 10 s).
inline constexpr const char *sink_failing = "sink-failing";
inline constexpr const char *sink_recovered = "sink-recovered";
} // namespace kind

struct Event {
    std::int64_t at_us = 0; // 0: the journal stamps it
    std::string kind;
    std::optional<std::string> session_id;
    std::optional<std::int64_t> uid;
    std::optional<std::int64_t> pid;
    std::optional<std::string> rule;
    std::optional<std::string> decision;
    std::optional<std::string> reason;
    std::optional<std::string> detail; // JSON object
};

struct StoredEvent {
    std::int64_t seq = 0;
    Event event;
    Hash prev_hash{};
    Hash hash{};
};

// A policy as the journal keeps it: its canonical text once per SHA-256 digest (policies table).
struct PolicyText {
    std::string digest; // 64 lowercase hex digits
    std::string text;
};

struct Counters {
    std::uint64_t rx_bytes = 0;
    std::uint64_t rx_packets = 0;
    std::uint64_t dropped_packets = 0;
};

struct Session {
    std::string id;
    std::uint32_t uid = 0;
    std::int64_t pid = 0;
    std::string exe;
    std::string unit;
    std::string netdev;
    std::string gpu;
    std::string mode;
    std::uint64_t region_bytes = 0;
    std::vector<std::string> flows;
    std::string key_id;
    std::string rule;
    std::int64_t started_us = 0; // 0: the journal stamps it
    std::optional<std::int64_t> ended_us;
    std::optional<std::string> end_reason;
    Counters counters;
};

// The canonical byte encoding the chain hashes: each field as a tag, a big-endian u64 length
// and its bytes; absent fields have their own tag. Changing it breaks every existing journal.
std::string canonical_encoding(std::int64_t seq, const Event &e);
Hash chain_hash(const Hash &prev, std::int64_t seq, const Event &e);
std::string to_hex(const Hash &h);

std::int64_t now_us();

// Where the chain head is kept outside the database, so that a truncated tail shows.
std::string anchor_path(const std::string &journal_path);
// Writes an anchor file (`text`, the whole JSON) at `path` with `mode`: to a temporary file of
// a fresh name made with O_EXCL (nothing planted is followed or truncated), then renamed over
// (a link is replaced, never its target). Not synced: a crash can only leave it behind the
// database, which verify accepts. A short write is ENOSPC.
Result<void> write_anchor_file(const std::string &path, const std::string &text, mode_t mode);

// A journal's write figures (Journal::stats()).
struct JournalStats {
    std::uint64_t operations = 0;      // calls answered
    std::uint64_t transactions = 0;    // commits that reached the disk
    std::uint64_t failures = 0;        // calls answered with an error
    std::uint64_t commit_failures = 0; // transactions the disk refused (a full disk, I/O)
    std::string last_error;            // of the last batch with a failed call; "" after a commit
    std::uint64_t anchor_writes = 0;   // anchor files written (journal.db.anchor)
    std::uint64_t anchor_failures = 0; // anchor writes that failed (journal.db.anchor)
    std::string anchor_failing;        // why the last anchor write failed; "" once one succeeds
    // At the last look (every 64 commits): frames in the WAL, and those a reader's open
    // snapshot keeps from being checkpointed (a long read transaction: the WAL grows by them).
    std::uint64_t wal_frames = 0;
    std::uint64_t wal_frames_held = 0;
    bool checkpoint_blocked = false; // the last look's checkpoint could not take its lock
    std::uint64_t wal_bytes = 0;     // the -wal file's size at the last look
};

} // namespace knod::journal
