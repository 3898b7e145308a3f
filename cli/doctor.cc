// knod-policy doctor: the host report (GPUs, netdevs, IOMMU groups, PCIe ACS, P2P distance,
// kernel parameters and configuration, ROCm) with pass/warn/fail and the fix for each check.
// The same report as the daemon's GetHostReport; reads sysfs and /proc, no daemon needed.
#include "cli/commands.h"
#include "host/report.h"
#include "knod/json.h"

#include <iostream>

namespace knod::cli {
namespace {

struct Options {
    host::HostPaths paths;
    std::string host_root;
    host::PairSelection pairs;
    bool json = false;
};

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
    if (o.json)
        std::cout << knod::dump_json(report->to_json(), 2) << "\n";
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
    cmd->add_flag("--json", o->json, "print the report as JSON (as GetHostReport's \"host\")");
    cmd->footer(
        "Every check prints pass, info, warn or fail, with the fix under each one that is "
        "not a pass.\nACS bits come from PCI config space, which only root reads past 64 "
        "bytes.\nExit codes: 0 no check fails; 1 a check fails; 2 bad usage, or a --nic or --gpu "
        "this host does not have (the message lists the ones it has).\n\n"
        "Example:\n  knod-policy doctor --nic eth2 --gpu 0000:03:00.0\n"
        "  knod-policy doctor --host-root tests/data/hosts/mi250x-cx6 --json");
    return [cmd, o]() -> int { return cmd->parsed() ? run(*o) : -1; };
}

} // namespace knod::cli
