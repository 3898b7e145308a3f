// libFuzzer target: any bytes as a policy file. The parser must never crash (deep nesting and
// long dotted keys included: the corpus in tests/fuzz/corpus/policy seeds them), whatever it
// accepts must be a policy the engine can evaluate, and no accepted string holds a control
// character (a NUL would cut a glob short).
#include "knod/untrusted.h"
#include "policy/engine.h"
#include "policy/parser.h"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    auto load = knod::policy::parse_policy_text(text, "fuzz.toml");
    if (load.ok()) {
        for (auto &rule : load.policy.rules) {
            bool clean = knod::is_clean_text(rule.name);
            for (auto *globs :
                 {&rule.units, &rule.cgroups, &rule.executables, &rule.netdevs, &rule.gpus})
                for (auto &g : *globs)
                    clean = clean && knod::is_clean_text(g);
            if (!clean) __builtin_trap();
        }
        knod::policy::Request r;
        r.caller.uid = 1000;
        r.netdev = "eth2";
        r.gpu_names = {"sim0"};
        r.region_bytes = 4096;
        r.flows = {*knod::policy::parse_flow_spec("udp 10.0.0.1:1 -> 10.0.0.2:5000")};
        (void)knod::policy::decide(load.policy, r, {});
    }
    return 0;
}
