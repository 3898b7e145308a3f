// knod-policy doctor: the host report (GPUs, netdevs, IOMMU groups, PCIe ACS, P2P distance,
// kernel parameters and configuration, ROCm) with pass/warn/fail and the fix for each check.
// The same report as the daemon's GetHostReport; reads sysfs and /proc, no daemon needed. On this
// host it also probes the kernel features the drivers use (host/kernel_features.h): it loads
// small BPF programs and tries tc BPF in a network namespace of its own, touching nothing else.
#include "cli/commands.h"
#include "host/caller_identity.h"
#include "host/kernel_features.h"
#include "host/report.h"
#include "knod/json.h"

#include <systemd/sd-bus.h>

#include <iostream>
#include <string_view>

namespace knod::cli {
namespace {

struct Options {
    host::HostPaths paths;
    std::string host_root;
    host::PairSelection pairs;
    std::string bus_address; // empty: the system bus
    bool json = false;
};

// Whether the bus sends ProcessFD in GetConnectionCredentials, asked about this very
// connection; nullopt when the bus cannot be reached or asked.
std::optional<bool> bus_sends_pidfd(const std::string &address) {
    sd_bus *bus = nullptr;
    int r = 0;
    if (address.empty()) {
        r = sd_bus_open_system(&bus);
    } else if ((r = sd_bus_new(&bus)) >= 0 && (r = sd_bus_set_address(bus, address.c_str())) >= 0 &&
               (r = sd_bus_set_bus_client(bus, 1)) >= 0) {
        r = sd_bus_start(bus);
    }
    const char *me = nullptr;
    sd_bus_message *reply = nullptr;
    std::optional<bool> found;
    if (r >= 0 && sd_bus_get_unique_name(bus, &me) >= 0 &&
        sd_bus_call_method(bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                           "org.freedesktop.DBus", "GetConnectionCredentials", nullptr, &reply, "s",
                           me) >= 0 &&
        sd_bus_message_enter_container(reply, 'a', "{sv}") > 0) {
        found = false;
        while (sd_bus_message_enter_container(reply, 'e', "sv") > 0) {
            const char *key = nullptr;
            if (sd_bus_message_read(reply, "s", &key) < 0 || sd_bus_message_skip(reply, "v") < 0 ||
                sd_bus_message_exit_container(reply) < 0)
                break;
            if (std::string_view(key) == "ProcessFD") found = true;
        }
    }
    sd_bus_message_unref(reply);
    sd_bus_flush_close_unref(bus);
    return found;
}

void print_text(const host::HostReport &r) {
    std::cout << "GPUs:";
    if (r.gpus.empty()) std::cout << " none";
    std::cout << "\n";
    for (auto &g : r.gpus)
        std::cout << "  " << g.pci << "  " << (g.model.empty() ? "unknown model" : g.model)
                  << (g.render_node.empty() ? "" : "  " + g.render_node) << "  "
                  << host::to_string(g.support) << "\n";
    std::cout << "Netdevs:\n";
    for (auto &n : r.netdevs)
        std::cout << "  " << n.name << "  ifindex " << n.ifindex << "  " << n.state << "  "
                  << n.rx_queues << (n.rx_queues == 1 ? " RX queue" : " RX queues")
                  << (n.rx_queues_allocated > n.rx_queues
                          ? " (" + std::to_string(n.rx_queues_allocated) + " allocated)"
                          : "")
                  << (n.driver.empty() ? "" : "  " + n.driver)
                  << (n.pci.empty() ? (n.kind.empty() ? "" : "  (" + n.kind + ")") : "  " + n.pci)
                  << "\n";
    std::cout << "Kernel " << (r.config.release.empty() ? "unknown" : r.config.release) << ", ROCm "
              << (r.rocm ? r.rocm->text : "none") << ", " << r.iommu_groups << " IOMMU groups\n\n";
    for (auto &c : r.checks) {
        std::cout << host::to_string(c.status) << "  " << c.id
                  << (c.subject == "host" ? "" : " [" + c.subject + "]") << ": " << c.message
                  << "\n";
        if (!c.fix.empty() && c.status != host::CheckStatus::pass)
            std::cout << "      fix: " << c.fix << "\n";
    }
}

int run(Options o) {
    if (!o.host_root.empty()) o.paths = host::HostPaths::under(o.host_root);
    auto report = host::build_report(o.paths, o.pairs);
    if (!report) {
        std::cerr << "knod-policy doctor: " << report.error().message << "\n";
        return exit_usage;
    }
    // The running kernel and bus, not a fixture's: only for this host.
    if (o.host_root.empty()) {
        report->checks.push_back(host::caller_identity_check(host::kernel_has_peer_pidfd(),
                                                             bus_sends_pidfd(o.bus_address)));
        for (auto &c : host::kernel_feature_checks(host::probe_kernel_features()))
            report->checks.push_back(std::move(c));
    }
    if (o.json)
        std::cout << knod::dump_json_escaped(report->to_json(), 2) << "\n";
    else
        print_text(*report);
    return report->failed() ? exit_failed : exit_ok;
}

} // namespace

Runner add_doctor(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "doctor", "Check the host for KNOD: GPUs, netdevs, IOMMU groups, PCIe ACS, P2P distance, "
                  "kernel parameters and configuration, ROCm; say how to fix what fails.");
    cmd->add_option("--nic", o->pairs.nic,
                    "check this NIC (netdev name or PCI address) against the GPUs; default: "
                    "every PCI netdev");
    cmd->add_option("--gpu", o->pairs.gpu,
                    "check this GPU (PCI address or render node); default: every GPU");
    cmd->add_option("--host-root", o->host_root,
                    "read a fixture tree laid out as DIR/sys, DIR/proc, DIR/boot, DIR/opt/rocm");
    cmd->add_option("--sysfs-root", o->paths.sysfs, "read sysfs here")->capture_default_str();
    cmd->add_option("--proc-root", o->paths.proc, "read /proc here")->capture_default_str();
    cmd->add_option("--boot-root", o->paths.boot, "look for config-RELEASE here")
        ->capture_default_str();
    cmd->add_option("--rocm-root", o->paths.rocm, "ROCm's install directory")
        ->capture_default_str();
    cmd->add_option("--bus-address", o->bus_address,
                    "the bus knod-policyd serves, asked whether it sends callers' pidfds "
                    "(caller.identity; default: the system bus)");
    cmd->add_flag("--json", o->json, "print the report as JSON (as GetHostReport's \"host\")");
    cmd->footer(
        "Every check prints pass, info, warn or fail, with the fix under each one that is "
        "not a pass.\nACS bits come from PCI config space, which only root reads past 64 "
        "bytes.\nOn this host (no --host-root) the kernel features the drivers use are probed "
        "too (kernel.feature.*: BPF program and map types, the helpers the filters call, AF_XDP, "
        "tc BPF, the netdev family): each says which driver needs it and what its absence "
        "costs; most probes need root.\nExit codes: 0 no check fails; 1 a check fails; 2 bad "
        "usage, or a --nic or --gpu "
        "this host does not have (the message lists the ones it has).\n\n"
        "Example:\n  knod-policy doctor --nic eth2 --gpu 0000:03:00.0\n"
        "  knod-policy doctor --host-root tests/data/hosts/mi250x-cx6 --json");
    return [cmd, o]() -> int { return cmd->parsed() ? run(*o) : -1; };
}

} // namespace knod::cli
