// Test helper: writes sessions and events into a journal through the real writer, so that
// shell tests can tamper with a genuine file.
// Usage: journal_fill DB SESSIONS [--policy FILE] [--prune KEEP_EVENTS] [--days-ago DAYS]
//   --policy: first a daemon-start event that loads FILE (its text stored under its digest, the
//             journal's id inside the chain), as the daemon writes it; grants name the digest.
//   --prune:  then retention keeps only the newest KEEP_EVENTS events (a checkpoint).
//   --days-ago: the start and the sessions are written DAYS ago (two seconds apart), for
//             retention checks that need old events; default now.
#include "journal/journal.h"
#include "knod/json.h"
#include "policy/parser.h"

#include <nlohmann/json.hpp>

#include <ctime>
#include <iostream>
#include <optional>

namespace {

namespace j = knod::journal;

// What `audit report` must tell apart, written as the daemon writes it (binding_manager.cc),
// over four hours from 2026-11-29T10:00Z (12:00 has nothing):
//   10:00  grants: uid 0 r0 (knodsim0, sim0), uid 0 r1 (knodsim0, sim0), uid 1000 a0
//          (knodsim0, sim1); default denials (no rule): uid 1001 x3 (NETDEV1, sim1);
//          rule DENY_RULE denies uid 3999999 x1 (knodsim0, sim0); quota refusals under
//          ALLOW_RULE: uid 1000 x2 (knodsim0, sim0)
//   11:00  r0 ends (1000 bytes); a0 revoked by uid 0, ends (500 bytes); isolation-violation
//          uid 1000 (NETDEV1, GPU2); flow-conflict uid 1001 (knodsim0, sim0); grant uid 1001
//          b0 (NETDEV1, GPU2); 4 refusals of uid 1001 only counted (refusals-coalesced)
//   13:00  r1 ends (3000 bytes), b0 ends (250 bytes); default denial uid 0 (knodsim0, sim0)
// --hostile swaps DENY_RULE, NETDEV1 and GPU2 (and a decision) for markup, quotes, control
// characters and invalid UTF-8; otherwise they are block-guests, knodsim1, gpu-2.
int fill_report(j::Journal &journal, bool hostile) {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 10;
    tm.tm_mday = 29;
    tm.tm_hour = 10;
    const std::int64_t t0 = static_cast<std::int64_t>(timegm(&tm)) * 1000000;
    const std::int64_t minute = 60LL * 1000000, hour = 60 * minute;
    const std::string deny_rule =
        hostile ? "<script>alert(1)</script>\"'&\x1b[31m\xff" : "block-guests";
    const std::string netdev1 = hostile ? "\"><img src=x onerror=alert(1)>" : "knodsim1";
    const std::string gpu2 = hostile ? "</svg><script>alert(2)</script>\x07" : "gpu-2";
    const std::string allow_rule = "sim-local";
    bool ok = true;
    auto detail = [](const std::string &netdev, const std::string &gpu) {
        return knod::dump_json({{"netdev", netdev}, {"gpu", gpu}});
    };
    auto grant = [&](const std::string &id, std::uint32_t uid, const std::string &netdev,
                     const std::string &gpu, std::int64_t at) {
        j::Session s;
        s.id = id;
        s.uid = uid;
        s.pid = 100;
        s.netdev = netdev;
        s.gpu = gpu;
        s.mode = "rx-only";
        s.region_bytes = 4096;
        s.flows = {"udp * -> *:5000"};
        s.key_id = "k-" + id;
        s.rule = allow_rule;
        s.started_us = at;
        j::Event e;
        e.kind = j::kind::granted;
        e.uid = uid;
        e.rule = allow_rule;
        e.decision = "allow";
        e.detail = detail(netdev, gpu);
        ok = ok && journal.open_session(s, e).ok();
    };
    auto end = [&](const std::string &id, std::uint32_t uid, const char *why, std::uint64_t bytes,
                   std::int64_t at) {
        j::Event e;
        e.kind = j::kind::ended;
        e.at_us = at;
        e.uid = uid;
        e.reason = why;
        e.detail =
            nlohmann::json{{"rx_bytes", bytes}, {"rx_packets", 1}, {"dropped_packets", 0}}.dump();
        ok = ok && journal.close_session(id, why, {bytes, 1, 0}, e).ok();
    };
    auto refuse = [&](std::uint32_t uid, std::optional<std::string> rule, const std::string &why,
                      const std::string &netdev, const std::string &gpu, std::int64_t at) {
        j::Event e;
        e.kind = j::kind::denied;
        e.at_us = at;
        e.uid = uid;
        e.rule = rule;
        e.decision = why;
        e.reason = why == "deny" && !rule ? "no rule matched (default deny)" : why;
        e.detail = detail(netdev, gpu);
        ok = ok && journal.append(e).ok();
    };
    grant("r0", 0, "knodsim0", "sim0", t0 + 1 * minute);
    grant("r1", 0, "knodsim0", "sim0", t0 + 2 * minute);
    grant("a0", 1000, "knodsim0", "sim1", t0 + 3 * minute);
    for (int i = 0; i < 3; ++i)
        refuse(1001, std::nullopt, "deny", netdev1, "sim1", t0 + (10 + i) * minute);
    refuse(3999999, deny_rule, "deny", "knodsim0", "sim0", t0 + 20 * minute);
    refuse(1000, allow_rule, "quota-exceeded", "knodsim0", "sim0", t0 + 30 * minute);
    refuse(1000, allow_rule, "quota-exceeded", "knodsim0", "sim0", t0 + 31 * minute);

    end("r0", 0, "release", 1000, t0 + hour + 5 * minute);
    j::Event revoke;
    revoke.kind = j::kind::revoked;
    revoke.at_us = t0 + hour + 10 * minute;
    revoke.uid = 0;
    revoke.session_id = "a0";
    revoke.reason = "audit finding";
    ok = ok && journal.append(revoke).ok();
    end("a0", 1000, "revoke", 500, t0 + hour + 10 * minute);
    refuse(1000, allow_rule, "isolation-violation", netdev1, gpu2, t0 + hour + 20 * minute);
    refuse(1001, allow_rule, hostile ? "flow-conflict<b>" : "flow-conflict", "knodsim0", "sim0",
           t0 + hour + 21 * minute);
    grant("b0", 1001, netdev1, gpu2, t0 + hour + 30 * minute);
    j::Event coalesced;
    coalesced.kind = j::kind::coalesced;
    coalesced.at_us = t0 + hour + 40 * minute;
    coalesced.uid = 1001;
    coalesced.decision = j::kind::denied;
    coalesced.reason = "4 more request-denied refusals of uid 1001, journaled as this count only";
    coalesced.detail = knod::dump_json({{"kind", j::kind::denied},
                                        {"count", 4},
                                        {"since_us", t0 + hour},
                                        {"until_us", t0 + hour + 40 * minute}});
    ok = ok && journal.append(coalesced).ok();

    end("r1", 0, "release", 3000, t0 + 3 * hour + 5 * minute);
    end("b0", 1001, "release", 250, t0 + 3 * hour + 6 * minute);
    refuse(0, std::nullopt, "deny", "knodsim0", "sim0", t0 + 3 * hour + 7 * minute);
    if (!ok) std::cerr << "journal_fill: write failed\n";
    return ok ? 0 : 1;
}

// journal_fill --report DB [--hostile]: the scenario above.
int report_main(int argc, char **argv) {
    bool hostile = argc == 4 && std::string(argv[3]) == "--hostile";
    if (argc != 3 && !hostile) {
        std::cerr << "usage: journal_fill --report DB [--hostile]\n";
        return 2;
    }
    auto journal = j::Journal::open(argv[2]);
    if (!journal) {
        std::cerr << journal.error().message << "\n";
        return 1;
    }
    return fill_report(**journal, hostile);
}

} // namespace

int main(int argc, char **argv) {
    if (argc >= 3 && std::string(argv[1]) == "--report") return report_main(argc, argv);
    if (argc < 3 || (argc - 3) % 2 != 0) {
        std::cerr << "usage: journal_fill DB SESSIONS [--policy FILE] [--prune KEEP_EVENTS] "
                     "[--days-ago DAYS] | "
                     "--report DB [--hostile]\n";
        return 2;
    }
    std::optional<std::string> policy_file;
    std::optional<std::int64_t> prune;
    std::int64_t base = 0; // 0: now, as the journal stamps it
    for (int i = 3; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--policy")
            policy_file = argv[i + 1];
        else if (flag == "--prune")
            prune = std::stoll(argv[i + 1]);
        else if (flag == "--days-ago")
            base = knod::journal::now_us() - std::stoll(argv[i + 1]) * 86400LL * 1000000;
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
        start.at_us = base;
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
        if (base) s.started_us = base + (2 * i + 1) * 1000000LL;
        knod::journal::Event grant;
        grant.kind = knod::journal::kind::granted;
        grant.uid = s.uid;
        grant.rule = s.rule;
        grant.decision = "allow";
        // As the daemon writes it; odd sessions as a daemon before #16 did, with the flows
        // double-encoded (a JSON string holding the array), which exports must decode.
        nlohmann::json flows = s.flows;
        grant.detail =
            knod::dump_json({{"netdev", s.netdev},
                             {"gpu", s.gpu},
                             {"mode", s.mode},
                             {"region_bytes", s.region_bytes},
                             {"flows", i % 2 ? nlohmann::json(knod::dump_json(flows)) : flows}});
        if (!digest.empty()) { // a policy the daemon ran with, named like the daemon does
            auto d = nlohmann::json::parse(*grant.detail);
            d["policy"] = digest;
            grant.detail = knod::dump_json(d);
        }
        knod::journal::Event end;
        end.kind = knod::journal::kind::ended;
        if (base) end.at_us = s.started_us + 1000000;
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
