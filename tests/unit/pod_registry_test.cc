// The pod registry (issue #34): what a CNI plugin may register, the bounds, and DEL's semantics.
#include "daemon/pod_registry.h"

#include <gtest/gtest.h>

using knod::Errc;
using knod::daemon::NamespaceId;
using knod::daemon::PodLimits;
using knod::daemon::PodRegistry;
using knod::daemon::PodSandbox;

namespace {

PodSandbox sandbox(const std::string &id, ino_t netns, const std::string &ifname = "eth0") {
    PodSandbox s;
    s.container_id = id;
    s.ifname = ifname;
    s.netns = NamespaceId{4, netns};
    s.pod = {"ml-prod", "infer-" + id, "6f1c2a", {{"knod.io/profile", "rx"}}};
    return s;
}

} // namespace

TEST(PodRegistry, FindsAPodByItsNetworkNamespaceAndForgetsItOnDel) {
    PodRegistry r;
    ASSERT_TRUE(r.add(sandbox("c1", 100)));
    ASSERT_TRUE(r.add(sandbox("c2", 200)));
    const PodSandbox *p = r.by_netns({4, 200});
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->pod.name, "infer-c2");
    EXPECT_EQ(r.by_netns({5, 200}), nullptr) << "another nsfs device is another namespace";
    EXPECT_EQ(r.remove("c2", "eth0").size(), 1u);
    EXPECT_EQ(r.by_netns({4, 200}), nullptr);
    EXPECT_TRUE(r.remove("c2", "eth0").empty()) << "a second DEL finds nothing, and is fine";
    EXPECT_TRUE(r.remove("c2", "").empty());
}

TEST(PodRegistry, OneNamespaceIsOnePodAndARepeatedAddReplaces) {
    PodRegistry r;
    ASSERT_TRUE(r.add(sandbox("c1", 100)));
    auto again = sandbox("c1", 100);
    again.pod.name = "renamed";
    ASSERT_TRUE(r.add(again)) << "the same sandbox and ifname: a repeated ADD";
    EXPECT_EQ(r.size(), 1u);
    EXPECT_EQ(r.by_netns({4, 100})->pod.name, "renamed");
    auto second = sandbox("c1", 100, "net1");
    second.pod.name = "renamed";
    ASSERT_TRUE(r.add(second)) << "one pod on a second network";
    auto other = r.add(sandbox("c9", 100));
    ASSERT_FALSE(other) << "another sandbox claiming a registered namespace";
    EXPECT_EQ(other.error().code, Errc::denied);
    auto renamed = sandbox("c1", 100, "net2");
    renamed.pod.k8s_namespace = "batch";
    auto twice = r.add(renamed);
    ASSERT_FALSE(twice) << "one sandbox named as another pod by a second network";
    EXPECT_EQ(twice.error().code, Errc::denied);
    EXPECT_EQ(r.remove("c1", "").size(), 2u) << "DEL without ifname: every network of it";
}

TEST(PodRegistry, RefusesWhatNoRuntimeSendsAndStaysBounded) {
    PodRegistry r(PodLimits{2, 3});
    auto bad = [&](auto edit) {
        auto s = sandbox("c1", 100);
        edit(s);
        auto added = r.add(s);
        return !added && added.error().code == Errc::invalid_argument;
    };
    EXPECT_TRUE(bad([](PodSandbox &s) { s.container_id = ""; }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.container_id = "../../etc"; }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.container_id = std::string(257, 'a'); }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.ifname = "a-very-long-ifname"; }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.pod.k8s_namespace = "<script>"; }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.pod.name = std::string(254, 'a'); }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.pod.uid = "x y"; }));
    EXPECT_TRUE(bad([](PodSandbox &s) { s.pod.annotations["other.io/x"] = "1"; }));
    EXPECT_TRUE(
        bad([](PodSandbox &s) { s.pod.annotations["knod.io/x"] = std::string(4097, 'v'); }));
    EXPECT_TRUE(bad([](PodSandbox &s) {
        for (int i = 0; i < 4; ++i)
            s.pod.annotations["knod.io/k" + std::to_string(i)] = "v";
    }));
    EXPECT_EQ(r.size(), 0u) << "nothing refused was kept";
    ASSERT_TRUE(r.add(sandbox("c1", 100)));
    ASSERT_TRUE(r.add(sandbox("c2", 200)));
    auto full = r.add(sandbox("c3", 300));
    ASSERT_FALSE(full);
    EXPECT_EQ(full.error().code, Errc::limits_exceeded);
    EXPECT_TRUE(r.add(sandbox("c2", 200))) << "a repeated ADD at the bound is no new entry";
}

TEST(PodRegistry, GcCollectsOnlyItsOwnNetworksSandboxesThatAreNoLongerValid) {
    PodRegistry r;
    auto on = [](PodSandbox s, const std::string &network) {
        s.network = network;
        return s;
    };
    ASSERT_TRUE(r.add(on(sandbox("c1", 100), "pods")));
    ASSERT_TRUE(r.add(on(sandbox("c2", 200), "pods")));
    ASSERT_TRUE(r.add(on(sandbox("c2", 200, "net1"), "rdma")));
    ASSERT_TRUE(r.add(sandbox("c3", 300))); // registered without a network
    EXPECT_TRUE(r.collect("", {}).empty()) << "no network named: nothing collected";
    auto gone = r.collect("pods", {{"c1", "eth0"}});
    ASSERT_EQ(gone.size(), 1u);
    EXPECT_EQ(gone[0].container_id, "c2");
    EXPECT_EQ(gone[0].ifname, "eth0");
    EXPECT_NE(r.by_netns({4, 100}), nullptr) << "a valid attachment stays";
    EXPECT_NE(r.by_netns({4, 200}), nullptr) << "c2 stays on the other network";
    EXPECT_NE(r.by_netns({4, 300}), nullptr) << "one registered without a network stays";
    EXPECT_TRUE(r.collect("pods", {{"c1", "eth0"}}).empty()) << "a repeated GC finds nothing";
    EXPECT_EQ(r.collect("rdma", {}).size(), 1u);
    EXPECT_FALSE(r.add(on(sandbox("c4", 400), "bad\nname"))) << "a network name is printable";
}

// Issue 52, item 2: podman passes the container's name as K8S_POD_NAME (a generated
// `nifty_pasteur`, a user's `MyInference`), and a runtime without names the container id: each
// is a pod name; anything else is refused with the reason (the plugin then fails the ADD).
TEST(PodRegistry, TakesThePodNamesRuntimesGiveAndRefusesTheRest) {
    PodRegistry r;
    ino_t ino = 100;
    auto named = [&](const std::string &name) {
        auto s = sandbox("c" + std::to_string(ino), ino);
        ++ino;
        s.pod.name = name;
        return r.add(s);
    };
    for (const char *ok : {"nifty_pasteur", "MyInference", "infer-0", "web.v2",
                           "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})
        EXPECT_TRUE(named(ok)) << ok;
    EXPECT_TRUE(named(std::string(253, 'a'))) << "253 bytes, a DNS subdomain's bound";
    for (const char *bad : {"", "-leading", ".hidden", "_x", "a b", "a/b", "a\nb", "a\x1b[31m",
                            "caf\xc3\xa9", "a:b"}) {
        auto added = named(bad);
        ASSERT_FALSE(added) << bad;
        EXPECT_EQ(added.error().code, Errc::invalid_argument);
        EXPECT_NE(added.error().message.find("pod name"), std::string::npos)
            << added.error().message;
        EXPECT_EQ(added.error().message.find('\x1b'), std::string::npos)
            << "the refusal quotes what it refuses";
    }
    EXPECT_FALSE(named(std::string(254, 'a')));
    auto ns = sandbox("c-ns", 999);
    ns.pod.k8s_namespace = "Team-A";
    EXPECT_FALSE(r.add(ns)) << "a namespace is still a DNS label (the conflist's or Kubernetes')";
}
