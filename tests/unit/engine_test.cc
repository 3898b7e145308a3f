#include "policy/engine.h"
#include "policy/parser.h"

#include <gtest/gtest.h>

using namespace knod::policy;

namespace {

Policy policy_of(const char *text) {
    PolicyLoad load = parse_policy_text(text, "test.toml");
    EXPECT_TRUE(load.ok()) << load.errors_text();
    return load.policy;
}

Request request(std::uint32_t uid, const char *netdev, const char *flow, std::uint64_t bytes) {
    Request r;
    r.caller.uid = uid;
    r.caller.user = uid == 1000 ? "alice" : "";
    r.caller.gids = {uid};
    r.caller.process_proven = true; // as the daemon sees an SDK client (AttestProcess)
    r.netdev = netdev;
    r.gpu_names = {"0000:c1:00.0", "/dev/dri/renderD128"};
    r.region_bytes = bytes;
    r.flows = {*parse_flow_spec(flow)};
    return r;
}

const char *two_rules = R"(
[[rule]]
name = "block-guests"
action = "deny"
groups = [2000]

[[rule]]
name = "alice-eth2"
users = ["alice"]
netdevs = ["eth2"]
gpus = ["/dev/dri/renderD*"]
max_region = "16MiB"
max_bindings_per_uid = 2
max_total_bytes_per_uid = "24MiB"
flows = ["udp 10.0.0.0/16:* -> 10.1.2.3:5000-5100"]
iommu = "passthrough-ok"
key_lifetime = "10m"
)";

} // namespace

TEST(Engine, DefaultDenyWithNoRules) {
    Decision d = decide(Policy{}, request(1000, "eth2", "udp * -> *:1", 1), {});
    EXPECT_EQ(d.verdict, Verdict::deny);
    EXPECT_EQ(d.reason, "no rule matched (default deny)");
    EXPECT_TRUE(d.rule.empty());
}

TEST(Engine, FirstMatchingRuleAllowsAndCarriesItsGrant) {
    Policy p = policy_of(two_rules);
    Decision d =
        decide(p, request(1000, "eth2", "udp 10.0.9.0/24:* -> 10.1.2.3:5050", 1 << 20), {});
    EXPECT_EQ(d.verdict, Verdict::allow);
    EXPECT_EQ(d.rule, "alice-eth2");
    EXPECT_EQ(d.iommu, IommuRequirement::passthrough_ok);
    EXPECT_EQ(d.key_lifetime, std::chrono::minutes(10));
    ASSERT_EQ(d.misses.size(), 1u);
    EXPECT_EQ(d.misses[0].rule, "block-guests");
    EXPECT_NE(d.misses[0].why_not.find("none of groups"), std::string::npos);
}

TEST(Engine, ExplicitDenyWinsWhenFirst) {
    Policy p = policy_of(two_rules);
    Request r = request(1000, "eth2", "udp 10.0.9.0/24:* -> 10.1.2.3:5050", 1 << 20);
    r.caller.group_names = {"guests"};
    r.caller.gids.push_back(2000); // supplementary groups count
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny);
    EXPECT_EQ(d.rule, "block-guests");
}

TEST(Engine, EachDimensionCanMissWithAReason) {
    Policy p = policy_of(two_rules);
    struct Case {
        Request r;
        const char *why;
    } cases[] = {
        {request(1001, "eth2", "udp 10.0.0.1:* -> 10.1.2.3:5000", 1), "is not one of users"},
        {request(1000, "eth3", "udp 10.0.0.1:* -> 10.1.2.3:5000", 1), "netdev 'eth3'"},
        {request(1000, "eth2", "udp 10.0.0.1:* -> 10.1.2.3:5101", 1), "outside the rule's flows"},
        {request(1000, "eth2", "udp 10.2.0.1:* -> 10.1.2.3:5000", 1), "outside the rule's flows"},
        {request(1000, "eth2", "tcp 10.0.0.1:* -> 10.1.2.3:5000", 1), "outside the rule's flows"},
        {request(1000, "eth2", "udp 10.0.0.1:* -> 10.1.2.3:5000", (16 << 20) + 1),
         "exceeds max_region"},
    };
    for (auto &c : cases) {
        Decision d = decide(p, c.r, {});
        EXPECT_EQ(d.verdict, Verdict::deny);
        ASSERT_EQ(d.misses.size(), 2u);
        EXPECT_NE(d.misses[1].why_not.find(c.why), std::string::npos) << d.misses[1].why_not;
    }
    Request gpu = request(1000, "eth2", "udp 10.0.0.1:* -> 10.1.2.3:5000", 1);
    gpu.gpu_names = {"0000:c1:00.0"};
    EXPECT_EQ(decide(p, gpu, {}).verdict, Verdict::deny);
}

TEST(Engine, QuotasPerUid) {
    Policy p = policy_of(two_rules);
    Request r = request(1000, "eth2", "udp 10.0.0.1:* -> 10.1.2.3:5000", 8 << 20);
    EXPECT_EQ(decide(p, r, {1, 8 << 20}).verdict, Verdict::allow);
    Decision count = decide(p, r, {2, 0});
    EXPECT_EQ(count.verdict, Verdict::quota_exceeded);
    EXPECT_EQ(count.rule, "alice-eth2");
    Decision bytes = decide(p, r, {1, 17 << 20});
    EXPECT_EQ(bytes.verdict, Verdict::quota_exceeded);
    EXPECT_NE(bytes.reason.find("region bytes"), std::string::npos);
    EXPECT_EQ(decide(p, r, {1, UINT64_MAX}).verdict, Verdict::quota_exceeded); // no wrap-around
}

TEST(Engine, TxModesAreRefusedEvenWhenGrantedOrPermissive) {
    Policy p = policy_of(R"(
[settings]
permissive = true
[[rule]]
name = "tx"
any_caller = true
modes = ["tx", "rx-only"]
max_region = 4096
flows = ["udp * -> *"]
)");
    Request r = request(1000, "eth2", "udp * -> *:1", 1);
    r.mode = Mode::tx;
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny);
    EXPECT_NE(d.reason.find("not supported"), std::string::npos);
}

TEST(Engine, PermissiveGrantsButRecordsWouldDeny) {
    Policy p = policy_of("[settings]\npermissive = true\n");
    Decision d = decide(p, request(1000, "eth2", "udp * -> *:1", 1), {});
    EXPECT_EQ(d.verdict, Verdict::allow);
    EXPECT_TRUE(d.would_deny);
    EXPECT_NE(d.reason.find("no rule matched"), std::string::npos);
}

// `units` is the system manager's unit only; a unit of the user's own manager needs
// `user_units`, which says so plainly.
TEST(Engine, UserUnitsAreNotSystemUnits) {
    Policy p = policy_of(R"(
[[rule]]
name = "system"
units = ["inference@*.service"]
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "user"
user_units = ["inference@*.service"]
max_region = 4096
flows = ["any * -> *"]
)");
    Request r = request(1000, "eth2", "udp * -> *:1", 1);
    r.caller.unit = "user@1000.service";
    r.caller.user_unit = "inference@evil.service";
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::allow);
    EXPECT_EQ(d.rule, "user");
    ASSERT_EQ(d.misses.size(), 1u);
    EXPECT_NE(d.misses[0].why_not.find("caller unit 'user@1000.service'"), std::string::npos);
    r.caller.user_unit = "other.service";
    d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny);
    EXPECT_NE(d.misses[1].why_not.find("user unit 'other.service'"), std::string::npos);
    r.caller.unit = "inference@7.service";
    r.caller.user_unit.clear();
    EXPECT_EQ(decide(p, r, {}).rule, "system");
}

TEST(Engine, GlobsOnUnitCgroupAndExecutable) {
    Policy p = policy_of(R"(
[[rule]]
name = "svc"
units = ["inference@*.service"]
cgroups = ["/system.slice/*"]
executables = ["/usr/bin/python3*"]
max_region = 4096
flows = ["any * -> *"]
)");
    Request r = request(1000, "eth2", "udp * -> *:1", 1);
    r.caller.unit = "inference@7.service";
    r.caller.cgroup = "/system.slice/inference@7.service";
    r.caller.executable = "/usr/bin/python3.11";
    EXPECT_EQ(decide(p, r, {}).verdict, Verdict::allow);
    r.caller.executable = "/tmp/python3";
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny);
    EXPECT_NE(d.misses[0].why_not.find("executable"), std::string::npos);
}

// Issue #32: a caller known only by the pid the bus took at connect(2) (dbus-daemon 1.14, a
// client that did not attest) may be another process that took that pid since. Its unit,
// cgroup and executable are then not evidence: allow rules naming them never match, deny rules
// naming them always do; users and groups (the connection's kernel credentials) still decide.
TEST(Engine, AnUnprovenProcessMatchesNoAllowRuleNamingWhatOnlyAProcessCanProve) {
    Policy p = policy_of(R"(
[[rule]]
name = "no-batch"
action = "deny"
units = ["batch@*.service"]
flows = ["any * -> *"]

[[rule]]
name = "inference"
units = ["inference@*.service"]
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "lab-users"
users = [1000]
max_region = 4096
flows = ["any * -> *"]
)");
    Request r = request(1000, "eth2", "udp * -> *:1", 1);
    r.caller.unit = "inference@7.service";
    EXPECT_EQ(decide(p, r, {}).rule, "inference");
    r.caller.process_proven = false;
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny) << "an unproven caller meets the deny rule";
    EXPECT_EQ(d.rule, "no-batch");
    p.rules.erase(p.rules.begin());
    d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::allow) << d.reason;
    EXPECT_EQ(d.rule, "lab-users") << "users still match an unproven caller";
    ASSERT_EQ(d.misses.size(), 1u);
    EXPECT_NE(d.misses[0].why_not.find("not proven"), std::string::npos) << d.misses[0].why_not;
    for (const char *cond : {"cgroups = [\"/system.slice/*\"]", "executables = [\"/usr/*\"]",
                             "user_units = [\"*\"]"}) {
        Policy q = policy_of(("[[rule]]\nname = \"r\"\n" + std::string(cond) +
                              "\nmax_region = 4096\nflows = [\"any * -> *\"]\n")
                                 .c_str());
        r.caller.cgroup = "/system.slice/x.service";
        r.caller.executable = "/usr/bin/python3";
        r.caller.user_unit = "x.service";
        EXPECT_EQ(decide(q, r, {}).verdict, Verdict::deny) << cond;
        r.caller.process_proven = true;
        EXPECT_EQ(decide(q, r, {}).verdict, Verdict::allow) << cond;
        r.caller.process_proven = false;
    }
}

// Issue #34: rules naming a pod's namespace, name or annotations match only callers in a
// registered pod, allow or deny: a host process never meets a pod's rule, and a pod meets only
// the rules its own identity fits.
TEST(Engine, PodRulesMatchOnlyCallersInARegisteredPod) {
    Policy p = policy_of(R"(
[[rule]]
name = "no-batch-pods"
action = "deny"
k8s_namespaces = ["batch-*"]

[[rule]]
name = "inference-pods"
k8s_namespaces = ["ml-*"]
k8s_pods = ["infer-*"]
k8s_annotations = { "knod.io/profile" = "rx", "knod.io/tier" = "gold" }
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "anyone-in-a-pod"
k8s_pods = ["*"]
max_region = 1
flows = ["any * -> *"]
)");
    Request r = request(0, "eth2", "udp * -> *:1", 4096);
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny) << "a host process (root, even) matches no pod rule";
    EXPECT_TRUE(d.rule.empty()) << d.rule;
    ASSERT_EQ(d.misses.size(), 3u);
    for (auto &m : d.misses)
        EXPECT_NE(m.why_not.find("no registered pod"), std::string::npos) << m.why_not;

    r.caller.pod = PodIdentity{
        "ml-prod", "infer-7", "5b7c", {{"knod.io/profile", "rx"}, {"knod.io/tier", "gold"}}};
    d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::allow) << d.reason;
    EXPECT_EQ(d.rule, "inference-pods");

    r.caller.pod->annotations["knod.io/tier"] = "silver";
    d = decide(p, r, {});
    EXPECT_EQ(d.verdict, Verdict::deny) << "an annotation with another value does not match";
    ASSERT_EQ(d.misses.size(), 3u);
    EXPECT_NE(d.misses[2].why_not.find("max_region"), std::string::npos)
        << "the pod matches the last rule's who, not its region: " << d.misses[2].why_not;
    EXPECT_NE(d.misses[1].why_not.find("knod.io/tier is 'silver'"), std::string::npos)
        << d.misses[1].why_not;

    r.caller.pod->annotations.erase("knod.io/tier");
    d = decide(p, r, {});
    EXPECT_NE(d.misses[1].why_not.find("has no annotation knod.io/tier"), std::string::npos);

    r.caller.pod->k8s_namespace = "batch-nightly";
    d = decide(p, r, {});
    EXPECT_EQ(d.rule, "no-batch-pods");
    EXPECT_EQ(d.verdict, Verdict::deny);
}

TEST(Engine, PodRuleKeysAreCheckedWhenTheyAreRead) {
    for (const char *bad :
         {"k8s_annotations = { \"profile\" = \"rx\" }",
          "k8s_annotations = { \"knod.io/\" = \"rx\" }", "k8s_annotations = { \"knod.io/p\" = 1 }",
          "k8s_annotations = {}", "k8s_annotations = [\"knod.io/p=rx\"]", "k8s_pods = [\"\"]"}) {
        PolicyLoad load = parse_policy_text(("[[rule]]\nname = \"r\"\n" + std::string(bad) +
                                             "\nmax_region = 4096\nflows = [\"any * -> *\"]\n")
                                                .c_str(),
                                            "test.toml");
        EXPECT_FALSE(load.ok()) << bad;
    }
    // A pod key names a caller: no any_caller needed, and not allowed beside it.
    EXPECT_TRUE(parse_policy_text("[[rule]]\nname = \"r\"\nk8s_namespaces = [\"ml\"]\nmax_region "
                                  "= 1\nflows = [\"any * -> *\"]\n",
                                  "t.toml")
                    .ok());
    EXPECT_FALSE(parse_policy_text("[[rule]]\nname = \"r\"\nk8s_namespaces = [\"ml\"]\nany_caller "
                                   "= true\nmax_region = 1\nflows = [\"any * -> *\"]\n",
                                   "t.toml")
                     .ok());
}

// Issue #51, failure 3: a pod's creator chooses its uid and groups (runAsUser,
// supplementalGroups), so rules written for host users and groups must never match a pod's
// process: not the container's root by `users = ["root"]`, not uid 3001 by host user 3001's
// rule, not a supplementary gid by a `groups` rule, not `any_caller`. A pod rule that also
// names users matches the pod's uid inside that pod only.
TEST(Engine, DomainsAreSeparateHostRulesNeverMatchAPod) {
    Policy p = policy_of(R"(
[[rule]]
name = "host-root"
users = ["root"]
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "host-user-3001"
users = [3001]
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "host-group-3100"
groups = [3100]
max_region = 4096
flows = ["any * -> *"]

[[rule]]
name = "host-anyone"
any_caller = true
max_region = 1
flows = ["any * -> *"]

[[rule]]
name = "ml-pods-as-3001"
k8s_namespaces = ["ml"]
users = [3001]
max_region = 4096
flows = ["any * -> *"]
)");
    for (std::uint32_t uid : {0u, 3001u}) {
        Request r = request(uid, "eth2", "udp * -> *:1", 4096);
        r.caller.user = uid == 0 ? "root" : "";
        r.caller.gids = {uid, 3100};
        r.caller.pod = PodIdentity{"nobody-names-this", "p-0", "u-1", {}};
        Decision d = decide(p, r, {});
        EXPECT_EQ(d.verdict, Verdict::deny) << "uid " << uid << ": " << d.rule << " " << d.reason;
        EXPECT_TRUE(d.rule.empty()) << "a pod matched host rule " << d.rule;
        ASSERT_EQ(d.misses.size(), 5u);
        for (std::size_t i = 0; i < 4; ++i)
            EXPECT_NE(d.misses[i].why_not.find("for host callers only"), std::string::npos)
                << d.misses[i].why_not;

        // The host's own callers still match their rules.
        r.caller.pod.reset();
        d = decide(p, r, {});
        EXPECT_EQ(d.verdict, Verdict::allow) << d.reason;
        EXPECT_EQ(d.rule, uid == 0 ? "host-root" : "host-user-3001");
    }
    Request r = request(3001, "eth2", "udp * -> *:1", 4096);
    r.caller.pod = PodIdentity{"ml", "p-0", "u-1", {}};
    Decision d = decide(p, r, {});
    EXPECT_EQ(d.rule, "ml-pods-as-3001") << "a pod rule naming users matches the pod's uid";
    EXPECT_EQ(d.verdict, Verdict::allow);
    r.caller.uid = 3002;
    EXPECT_EQ(decide(p, r, {}).verdict, Verdict::deny);
}
