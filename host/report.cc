#include "host/report.h"
#include "knod/dir.h"

#include "host/devmem_readiness.h"
#include "host/sysfs_util.h"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace knod::host {
namespace {

std::string gib(std::uint64_t bytes) {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    return s;
}

class Checker {
  public:
    Checker(const HostPaths &paths, HostReport &r) : paths_(paths), r_(r), pci_(paths.sysfs) {}

    void add(std::string id, std::string subject, CheckStatus st, std::string msg,
             std::string fix = {}) {
        r_.checks.push_back(
            {std::move(id), std::move(subject), st, std::move(msg), std::move(fix)});
    }

    void iommu() {
        if (r_.iommu_groups)
            add("iommu", "host", CheckStatus::pass,
                "IOMMU on: " + std::to_string(r_.iommu_groups) + " groups");
        else
            add("iommu", "host", CheckStatus::fail,
                "no IOMMU groups: device DMA is not translated, so a NIC can write anywhere in "
                "memory",
                "enable AMD-Vi/VT-d in firmware and amd_iommu=on or intel_iommu=on on the kernel "
                "command line");
        iommu_pt();
    }

    // The default domain as the kernel set it up, from the groups' type: iommu=pt and
    // iommu.passthrough=1 both give identity domains, and no IOMMU translates nothing.
    void iommu_pt() {
        const auto &k = r_.kernel;
        std::string domains;
        for (auto &[type, n] : k.iommu_domains)
            domains += (domains.empty() ? "" : ", ") + std::to_string(n) + " " + type;
        std::string given = k.iommu_cmdline.empty() ? "" : " (" + k.iommu_cmdline + ")";
        if (!r_.iommu_groups)
            add("kernel.iommu_pt", "host", CheckStatus::warn,
                "no IOMMU: DMA is not translated at all" + given +
                    "; rules with iommu = \"translated\" or \"passthrough-ok\" refuse bindings",
                "enable the IOMMU (see the iommu check)");
        else if (k.iommu_passthrough)
            add("kernel.iommu_pt", "host", CheckStatus::warn,
                "identity (pass-through) domains" + given + ": IOMMU groups: " + domains +
                    "; DMA of the identity groups' devices is untranslated; rules with iommu = "
                    "\"translated\" will refuse bindings",
                "drop iommu=pt and iommu.passthrough=1 for translated DMA, or set iommu = "
                "\"passthrough-ok\" in the rules that may accept it");
        else
            add("kernel.iommu_pt", "host", CheckStatus::pass,
                "IOMMU groups: " + domains + ": DMA is translated");
    }

    void knod() {
        if (r_.kernel.knod_enabled)
            add("kernel.knod_enable", "host", CheckStatus::pass, "amdgpu.knod_enable=1 is set");
        else
            add("kernel.knod_enable", "host", CheckStatus::warn,
                "amdgpu.knod_enable=1 is not on the kernel command line: amdgpu offers no KNOD "
                "queues",
                "add amdgpu.knod_enable=1 to the kernel command line (only for the knod driver)");
        if (r_.kernel.knod_class)
            add("knod.class", "host", CheckStatus::pass, "/sys/class/knod exists: KNOD is loaded");
        else
            add("knod.class", "host", CheckStatus::warn,
                "no /sys/class/knod: the KNOD module is not loaded; knod-policyd uses devmem or "
                "the sim",
                "boot a kernel with the knod-v3 patch (CONFIG_AMD_KNOD=y)");
    }

    void kernel_config() {
        const auto &c = r_.config;
        std::string release = c.release.empty() ? "unknown" : c.release;
        if (c.source.empty()) {
            add("kernel.config", "host", CheckStatus::warn,
                "kernel " + release +
                    ": no configuration found (neither /proc/config.gz nor /boot/config-" +
                    release + "): cannot tell whether VRAM can be handed to a NIC",
                "load the configs module (modprobe configs) or install the kernel's config file");
            return;
        }
        struct Need {
            const char *option, *id, *without;
        };
        static const Need needs[] = {
            {"CONFIG_PCI_P2PDMA", "kernel.pci_p2pdma",
             "the kernel cannot DMA between a NIC and GPU memory: amdgpu moves an exported VRAM "
             "dma-buf to system RAM and pins it there, so packets land in CPU memory, not VRAM"},
            {"CONFIG_DMABUF_MOVE_NOTIFY", "kernel.dmabuf_move_notify",
             "importers cannot follow a moving buffer, so amdgpu pins every exported buffer, and "
             "a VRAM buffer bound to a NIC is likely pinned in system RAM, not VRAM"},
        };
        for (auto &n : needs) {
            ConfigValue v = c.get(n.option);
            if (v == ConfigValue::yes)
                add(n.id, "host", CheckStatus::pass,
                    std::string(n.option) + "=y (" + c.source + ")");
            else
                add(n.id, "host", CheckStatus::warn,
                    std::string(n.option) + " is " + to_string(v) + " in " + c.source + ": " +
                        n.without,
                    std::string("use a kernel built with ") + n.option + "=y");
        }
    }

    void rocm() {
        if (!r_.rocm)
            add("rocm", "host", CheckStatus::warn,
                "ROCm not found (" + paths_.rocm + "/.info/version)", "install ROCm 6.2 or newer");
        else if (!r_.rocm->at_least(6, 2))
            add("rocm", "host", CheckStatus::warn,
                "ROCm " + r_.rocm->text + " is older than 6.2, which KNOD needs",
                "upgrade ROCm to 6.2 or newer");
        else
            add("rocm", "host", CheckStatus::pass, "ROCm " + r_.rocm->text);
    }

    void gpus() {
        if (r_.gpus.empty())
            add("gpu", "host", CheckStatus::warn, "no GPU found (DRM devices / PCI display class)");
        for (auto &g : r_.gpus) {
            std::string what =
                (g.model.empty() ? "GPU" : g.model) + (g.driver.empty() ? "" : ", " + g.driver) +
                (g.vram_bytes ? ", " + gib(g.vram_bytes) + " VRAM" : "") + ": " + g.support_note;
            CheckStatus st =
                g.support == GpuSupport::supported ? CheckStatus::pass : CheckStatus::warn;
            std::string fix = g.support == GpuSupport::supported
                                  ? ""
                                  : "use a CDNA2-or-newer Instinct or a Radeon Pro W7900/W6800";
            if (g.support == GpuSupport::supported && g.driver != "amdgpu") {
                st = CheckStatus::warn;
                what += "; not bound to amdgpu";
                fix = "bind the device to amdgpu";
            }
            add("gpu.support", g.pci, st, what, fix);
        }
    }

    void netdevs() {
        if (!r_.netdev_error.empty())
            add("netdev", "host", CheckStatus::warn, "cannot list netdevs: " + r_.netdev_error);
        for (auto &n : r_.netdevs) {
            if (n.pci.empty()) continue; // virtual devices: nothing to offload to
            std::string queues =
                std::to_string(n.rx_queues) + " RX queue" + (n.rx_queues == 1 ? "" : "s");
            if (n.rx_queues_allocated > n.rx_queues)
                queues += " (" + std::to_string(n.rx_queues_allocated) + " allocated)";
            if (n.rx_queues_source == "allocated")
                queues += " (allocated count: neither sysfs nor ethtool gave the active one)";
            std::string what = n.driver + ", " + queues + ", " + n.state + "; " +
                               (devmem_capable_driver(n.driver) ? "devmem TCP capable driver"
                                                                : "driver without devmem TCP");
            CheckStatus st = n.state == "up" ? CheckStatus::pass : CheckStatus::warn;
            std::string fix = n.state == "up" ? "" : "bring the link up";
            // Queue 0 keeps the host's own traffic: a binding needs a queue of its own.
            if (n.rx_queues == 1) {
                what += "; one RX queue: it carries the host's own traffic, so no queue can be "
                        "isolated for a binding";
                st = CheckStatus::warn;
                fix = "give the NIC more RX queues (ethtool -L " + n.name +
                      " combined N) or use a multi-queue NIC";
            }
            add("netdev", n.name + " (" + n.pci + ")", st, what, fix);
            if (paths_.live() && n.ifindex > 0) {
                devmem(n);
                held_queues(n);
            }
        }
    }

    // Devmem-ready or why not, from the kernel's own answers (the devmem backend refuses a
    // request for the same reasons: devmem_readiness.h).
    void devmem(const Netdev &n) {
        std::string subject = n.name + " (" + n.pci + ")";
        DevmemFacts f = read_devmem_facts(n.ifindex, n.name, n.rx_queues);
        auto problems = devmem_problems(f);
        bool capable = devmem_capable_driver(n.driver);
        if (problems.empty() && capable) {
            auto free = queues_outside_rss(f);
            std::string qs;
            for (auto q : free)
                qs += (qs.empty() ? "" : ", ") + std::to_string(q);
            add("netdev.devmem", subject, CheckStatus::pass,
                "devmem-ready: header split on, no XDP program, RX queue" +
                    std::string(free.size() == 1 ? " " : "s ") + qs + " outside RSS");
            return;
        }
        std::string why, fix;
        if (!capable) why = n.driver + " has no devmem TCP queue management";
        for (auto &p : problems) {
            why += (why.empty() ? "" : "; ") + p.message;
            if (!p.fix.empty()) fix += (fix.empty() ? "" : "; ") + p.fix;
        }
        if (!capable)
            fix = "use a NIC whose driver supports devmem TCP (gve, bnxt_en, mlx5_core, "
                  "fbnic)";
        add("netdev.devmem", subject, capable ? CheckStatus::warn : CheckStatus::info,
            "not devmem-ready: " + why, fix);
    }

    // Which RX queues a dma-buf, io_uring zero-copy receive or AF_XDP already holds (queue-get):
    // the devmem backend never binds those, so they are named here.
    void held_queues(const Netdev &n) {
        std::string subject = n.name + " (" + n.pci + ")";
        auto genl = driver::NetdevGenl::open();
        auto queues = genl ? genl->queues(n.ifindex)
                           : Result<std::vector<driver::NetdevQueue>>(std::move(genl).error());
        if (!queues) {
            add("netdev.queues", subject, CheckStatus::info,
                "cannot list the RX queues' holders: " + queues.error().message);
            return;
        }
        auto held = held_rx_queues(*queues);
        std::string what;
        for (auto &h : held)
            what += (what.empty() ? "" : "; ") + h;
        if (what.empty()) what = "no RX queue is held by a dma-buf, io_uring or AF_XDP";
        add("netdev.queues", subject, CheckStatus::info, what);
    }

    // A netdev without a PCI function (veth, bridge, ifb...): asked for by name, it is reported
    // for what it is rather than as a missing NIC.
    void virtual_nic(const Netdev &n) {
        add("nic.virtual", n.name, CheckStatus::info,
            n.name + " is a virtual netdev (" + (n.kind.empty() ? "no PCI parent" : n.kind) +
                "): it has no PCI function, so no DMA into GPU memory and no NIC/GPU pair to "
                "check; the devmem and knod drivers cannot bind it (the sim driver binds veths)");
    }

    void pair(const std::string &nic, const std::string &gpu, const std::string &nic_label) {
        std::string subject = nic_label + " -> " + gpu;
        SysfsHost host(paths_.sysfs, paths_.proc);
        DeviceIsolation n = host.device(nic), g = host.device(gpu);
        for (auto req :
             {policy::IommuRequirement::translated, policy::IommuRequirement::passthrough_ok}) {
            Verdict v = check(req, n, g);
            add(std::string("pair.iommu.") + policy::to_string(req), subject,
                v.ok ? CheckStatus::pass : CheckStatus::fail,
                v.ok ? std::string("rules with iommu = \"") + policy::to_string(req) +
                           "\" can bind this pair"
                     : v.reason,
                v.fix);
        }
        P2pPath path = pci_.path(nic, gpu);
        std::string via;
        for (auto &b : path.bridges)
            via += (via.empty() ? "" : ", ") + b;
        if (path.distance == P2pDistance::unknown) {
            add("pair.p2p", subject, CheckStatus::warn,
                "cannot place both devices in the PCI tree");
            return;
        }
        add("pair.p2p", subject,
            path.distance == P2pDistance::cross_root ? CheckStatus::warn : CheckStatus::pass,
            std::string(label(path.distance)) + ": " + to_string(path.distance) +
                (via.empty() ? "" : " (via " + via + ")"),
            path.distance == P2pDistance::cross_root
                ? "peer-to-peer DMA between root complexes is slow or refused on many platforms: "
                  "put the NIC and the GPU under one root port or switch"
                : "");
        acs(subject, path);
    }

    // Peer-to-peer writes from the NIC may turn around at any bridge below the root complex;
    // only ACS redirect sends them up to the IOMMU.
    void acs(const std::string &subject, const P2pPath &path) {
        std::vector<std::string> off, unreadable, exempt;
        for (auto &b : path.bridges) {
            if (b == path.turnaround) continue;
            AcsControl a = pci_.acs(b);
            if (a.state == AcsControl::State::unreadable)
                unreadable.push_back(b);
            else if (a.state == AcsControl::State::not_applicable)
                exempt.push_back(b + " (" + a.describe() + ")");
            else if (a.state != AcsControl::State::enabled)
                off.push_back(b + " (" + a.describe() + ")");
        }
        auto join = [](const std::vector<std::string> &v) {
            std::string s;
            for (auto &x : v)
                s += (s.empty() ? "" : ", ") + x;
            return s;
        };
        // Linux turns ACS on only when an IOMMU driver asks for it (pci_request_acs()).
        if (!off.empty() && !r_.iommu_groups)
            add("pair.acs", subject, CheckStatus::fail,
                "ACS does not redirect peer-to-peer requests at " + join(off) +
                    ", and there is no IOMMU: Linux enables ACS only with an IOMMU, and without "
                    "one no NIC write is checked at all",
                "enable the IOMMU (see the iommu check); then check ACS again");
        else if (!off.empty())
            add("pair.acs", subject, CheckStatus::fail,
                "ACS does not redirect peer-to-peer requests at " + join(off) +
                    ": NIC writes can reach the GPU without passing the IOMMU",
                "enable ACS Source Validation, Request/Completion Redirect and Upstream Forwarding "
                "on those ports (firmware setting, or a switch that supports it)");
        else if (!unreadable.empty())
            add("pair.acs", subject, CheckStatus::warn,
                "cannot read ACS control of " + join(unreadable) +
                    ": config space past 64 bytes needs CAP_SYS_ADMIN",
                "run knod-policy doctor as root");
        else
            add("pair.acs", subject, CheckStatus::pass,
                path.bridges.empty()
                    ? "no bridge between them"
                    : "ACS redirects peer-to-peer requests at every port on the path that needs "
                      "it: the IOMMU sees every NIC write" +
                          (exempt.empty() ? "" : " (" + join(exempt) + ")"));
    }

    const HostPaths &paths_;
    HostReport &r_;
    PciTopology pci_;
};

std::size_t count_groups(const HostPaths &paths) {
    std::error_code ec;
    std::size_t n = 0;
    for (auto &e : knod::list_dir(fs::path(paths.sysfs) / "kernel/iommu_groups", ec)) {
        (void)e;
        ++n;
    }
    return n;
}

} // namespace

const char *to_string(CheckStatus s) {
    switch (s) {
    case CheckStatus::pass:
        return "pass";
    case CheckStatus::info:
        return "info";
    case CheckStatus::warn:
        return "warn";
    case CheckStatus::fail:
        return "fail";
    }
    return "?";
}

bool HostReport::failed() const {
    return std::any_of(checks.begin(), checks.end(),
                       [](const HostCheck &c) { return c.status == CheckStatus::fail; });
}

Result<HostReport> build_report(const HostPaths &paths, const PairSelection &sel) {
    HostReport r;
    r.gpus = list_gpus(paths);
    if (auto n = list_netdevs(paths))
        r.netdevs = std::move(*n);
    else
        r.netdev_error = n.error().message;
    r.kernel = SysfsHost(paths.sysfs, paths.proc).kernel();
    r.config = read_kernel_config(paths);
    r.rocm = rocm_version(paths);
    r.iommu_groups = count_groups(paths);

    // Resolve the pair selection before checking anything: a name that matches nothing is an
    // error naming what this host has, never an isolation verdict (a typo is not a failure to
    // fix by weakening a rule).
    auto pci_function = [&](const std::string &a) {
        std::error_code ec;
        return is_pci_address(a) && fs::exists(fs::path(paths.sysfs) / "bus/pci/devices" / a, ec);
    };
    std::vector<std::pair<std::string, std::string>> nics; // PCI address, label
    const Netdev *virtual_nic = nullptr;
    for (auto &n : r.netdevs) {
        if (!sel.nic.empty() && sel.nic != n.name && (n.pci.empty() || sel.nic != n.pci)) continue;
        if (n.pci.empty()) {
            if (!sel.nic.empty()) virtual_nic = &n;
            continue;
        }
        if (std::none_of(nics.begin(), nics.end(), [&](auto &x) { return x.first == n.pci; }))
            nics.emplace_back(n.pci, n.name + " (" + n.pci + ")");
    }
    if (!sel.nic.empty() && nics.empty() && !virtual_nic) {
        if (!pci_function(sel.nic)) {
            std::string known;
            for (auto &n : r.netdevs)
                known += (known.empty() ? "" : ", ") + n.name + " (" +
                         (n.pci.empty() ? (n.kind.empty() ? "virtual" : n.kind) : n.pci) + ")";
            return make_error(Errc::not_found, "no netdev or PCI NIC named " + sel.nic +
                                                   " on this host; netdevs here: " +
                                                   (known.empty() ? "none" : known));
        }
        nics.emplace_back(sel.nic, sel.nic); // a PCI function without a netdev
    }
    std::vector<std::string> gpus;
    if (sel.gpu.empty()) {
        for (auto &g : r.gpus)
            gpus.push_back(g.pci);
    } else if (const Gpu *chosen = find_gpu(r.gpus, sel.gpu)) {
        gpus.push_back(chosen->pci);
    } else if (pci_function(sel.gpu)) {
        gpus.push_back(sel.gpu);
    } else {
        std::string known;
        for (auto &g : r.gpus)
            known += (known.empty() ? "" : ", ") + g.pci +
                     (g.render_node.empty() ? "" : " (" + g.render_node + ")");
        return make_error(Errc::not_found,
                          "no GPU named " + sel.gpu +
                              " on this host; GPUs here: " + (known.empty() ? "none" : known));
    }

    Checker c(paths, r);
    c.iommu();
    c.knod();
    c.kernel_config();
    c.rocm();
    c.gpus();
    c.netdevs();
    if (virtual_nic) c.virtual_nic(*virtual_nic);
    for (auto &[nic, label] : nics)
        for (auto &gpu : gpus)
            c.pair(nic, gpu, label);
    return r;
}

nlohmann::json HostReport::to_json() const {
    using nlohmann::json;
    json j;
    j["gpus"] = json::array();
    for (auto &g : gpus)
        j["gpus"].push_back({{"pci", g.pci},
                             {"vendor", g.vendor},
                             {"device", g.device},
                             {"model", g.model},
                             {"family", g.family},
                             {"driver", g.driver},
                             {"render_node", g.render_node},
                             {"vram_bytes", g.vram_bytes},
                             {"support", to_string(g.support)}});
    j["netdevs"] = json::array();
    for (auto &n : netdevs)
        j["netdevs"].push_back({{"name", n.name},
                                {"ifindex", n.ifindex},
                                {"state", n.state},
                                {"admin_up", n.admin_up},
                                {"rx_queues", n.rx_queues},
                                {"rx_queues_allocated", n.rx_queues_allocated},
                                {"rx_queues_source", n.rx_queues_source},
                                {"kind", n.kind},
                                {"driver", n.driver},
                                {"pci", n.pci}});
    if (!netdev_error.empty()) j["netdev_error"] = netdev_error;
    j["kernel"] = {{"release", config.release},
                   {"iommu_pt", kernel.iommu_passthrough},
                   {"iommu_domains", kernel.iommu_domains},
                   {"amdgpu_knod_enable", kernel.knod_enabled},
                   {"sys_class_knod", kernel.knod_class},
                   {"config_source", config.source},
                   {"pci_p2pdma", to_string(config.get("CONFIG_PCI_P2PDMA"))},
                   {"dmabuf_move_notify", to_string(config.get("CONFIG_DMABUF_MOVE_NOTIFY"))}};
    j["iommu_groups"] = iommu_groups;
    j["rocm"] = rocm ? json(rocm->text) : json();
    j["checks"] = json::array();
    for (auto &c : checks)
        j["checks"].push_back({{"id", c.id},
                               {"subject", c.subject},
                               {"status", to_string(c.status)},
                               {"message", c.message},
                               {"fix", c.fix}});
    j["result"] = failed() ? "fail" : "pass";
    return j;
}

} // namespace knod::host
