// Test helper: writes sessions and events into a journal through the real writer, so that
// shell tests can tamper with a genuine file. Usage: journal_fill DB SESSIONS
#include "daemon/journal/journal.h"
#include "knod/json.h"

#include <iostream>

int main(int argc, char **argv) {
    if (argc != 3) {
        std::cerr << "usage: journal_fill DB SESSIONS\n";
        return 2;
    }
    auto j = knod::journal::Journal::open(argv[1]);
    if (!j) {
        std::cerr << j.error().message << "\n";
        return 1;
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
        // As the daemon writes it; odd sessions as a daemon before #16 did, with the flows
        // double-encoded (a JSON string holding the array), which exports must decode.
        nlohmann::json flows = s.flows;
        grant.detail =
            knod::dump_json({{"netdev", s.netdev},
                             {"gpu", s.gpu},
                             {"mode", s.mode},
                             {"region_bytes", s.region_bytes},
                             {"flows", i % 2 ? nlohmann::json(knod::dump_json(flows)) : flows}});
        knod::journal::Event end;
        end.kind = knod::journal::kind::ended;
        if (!(*j)->open_session(s, grant) || !(*j)->close_session(s.id, "release", {}, end)) {
            std::cerr << "journal_fill: write failed\n";
            return 1;
        }
    }
    return 0;
}
