// Test helper: writes sessions and events into a journal through the real writer, so that
// shell tests can tamper with a genuine file.
// Usage: journal_fill DB SESSIONS [--policy FILE] [--prune KEEP_EVENTS]
//   --policy: first a daemon-start event that loads FILE (its text stored under its digest, the
//             journal's id inside the chain), as the daemon writes it; grants name the digest.
//   --prune:  then retention keeps only the newest KEEP_EVENTS events (a checkpoint).
#include "daemon/journal/journal.h"
#include "policy/parser.h"

#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>

int main(int argc, char **argv) {
    if (argc < 3 || (argc - 3) % 2 != 0) {
        std::cerr << "usage: journal_fill DB SESSIONS [--policy FILE] [--prune KEEP_EVENTS]\n";
        return 2;
    }
    std::optional<std::string> policy_file;
    std::optional<std::int64_t> prune;
    for (int i = 3; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--policy")
            policy_file = argv[i + 1];
        else if (flag == "--prune")
            prune = std::stoll(argv[i + 1]);
        else {
            std::cerr << "journal_fill: unknown option " << flag << "\n";
            return 2;
        }
    }
    auto j = knod::journal::Journal::open(argv[1]);
    if (!j) {
        std::cerr << j.error().message << "\n";
        return 1;
    }
    std::string digest;
    if (policy_file) {
        auto load = knod::policy::load_policy_files({*policy_file});
        if (!load.ok()) {
            std::cerr << load.errors_text();
            return 1;
        }
        digest = load.policy.digest;
        knod::journal::Event start;
        start.kind = knod::journal::kind::daemon_start;
        start.uid = 0;
        start.pid = 1;
        auto &id = (*j)->identity();
        start.detail = nlohmann::json{
            {"driver", "sim"},
            {"journal_id", id.journal_id},
            {"machine_id", id.machine_id},
            {"hostname",
             id.hostname}}.dump();
        if (!(*j)->append_policy_load(start, {digest, load.policy.text})) {
            std::cerr << "journal_fill: write failed\n";
            return 1;
        }
    }
    int n = std::stoi(argv[2]);
    for (int i = 0; i < n; ++i) {
        knod::journal::Session s;
        s.id = "b" + std::to_string(i);
        s.uid = 1000 + static_cast<std::uint32_t>(i % 3);
        s.pid = 100 + i;
        s.netdev = "knodsim0";
        s.gpu = "sim0";
        s.mode = "rx-only";
        s.region_bytes = 4096;
        s.flows = {"udp * -> *:5000"};
        s.key_id = "k-" + std::to_string(i);
        s.rule = "sim-local";
        knod::journal::Event grant;
        grant.kind = knod::journal::kind::granted;
        grant.uid = s.uid;
        grant.rule = s.rule;
        grant.decision = "allow";
        if (!digest.empty()) grant.detail = nlohmann::json{{"policy", digest}}.dump();
        knod::journal::Event end;
        end.kind = knod::journal::kind::ended;
        if (!(*j)->open_session(s, grant) || !(*j)->close_session(s.id, "release", {}, end)) {
            std::cerr << "journal_fill: write failed\n";
            return 1;
        }
    }
    if (prune && !(*j)->prune(std::nullopt, *prune)) {
        std::cerr << "journal_fill: prune failed\n";
        return 1;
    }
    return 0;
}
