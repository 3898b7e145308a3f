// knod-policy doctor: the host's isolation facts and what each rule requirement would say about
// a NIC and a GPU, with the fix for each failure. Reads sysfs and /proc; no daemon needed.
#include "cli/commands.h"
#include "daemon/host/isolation.h"

#include <nlohmann/json.hpp>

#include <iostream>

namespace knod::cli {
namespace {

struct Options {
    std::string sysfs = "/sys", proc = "/proc", nic, gpu;
    bool json = false;
};

nlohmann::json device_json(const host::DeviceIsolation &d) {
    return {{"pci", d.pci},
            {"iommu_group", d.group ? nlohmann::json(*d.group) : nlohmann::json()},
            {"domain", host::to_string(d.type)},
            {"shares_group_with", d.peers}};
}

int run(const Options &o) {
    host::SysfsHost h(o.sysfs, o.proc);
    host::KernelFacts k = h.kernel();
    host::DeviceIsolation nic = h.device(o.nic), gpu = h.device(o.gpu);
    nlohmann::json checks = nlohmann::json::array();
    bool strict_ok = true;
    for (auto req :
         {policy::IommuRequirement::translated, policy::IommuRequirement::passthrough_ok}) {
        host::Verdict v = host::check(req, nic, gpu);
        if (req == policy::IommuRequirement::translated) strict_ok = v.ok;
        checks.push_back({{"requirement", policy::to_string(req)},
                          {"result", v.ok ? "pass" : "fail"},
                          {"reason", v.reason},
                          {"fix", v.fix}});
    }
    if (o.json) {
        std::cout << nlohmann::json{{"kernel",
                                     {{"iommu_pt", k.iommu_passthrough},
                                      {"amdgpu_knod_enable", k.knod_enabled},
                                      {"sys_class_knod", k.knod_class}}},
                                    {"nic", device_json(nic)},
                                    {"gpu", device_json(gpu)},
                                    {"checks", checks}}
                         .dump(2)
                  << "\n";
    } else {
        auto line = [](const char *what, bool ok, const std::string &note) {
            std::cout << (ok ? "pass " : "warn ") << what << (note.empty() ? "" : ": " + note)
                      << "\n";
        };
        line("kernel: amdgpu.knod_enable=1", k.knod_enabled,
             k.knod_enabled ? "" : "add it to the kernel command line");
        line("kernel: /sys/class/knod", k.knod_class,
             k.knod_class ? "" : "the KNOD module is not loaded");
        std::cout << "info kernel: iommu=pt "
                  << (k.iommu_passthrough ? "set (pass-through: fast, but untranslated)"
                                          : "not set (translated DMA)")
                  << "\n";
        for (auto &[name, d] : {std::pair{"NIC", &nic}, std::pair{"GPU", &gpu}})
            std::cout << "info " << name << " " << (d->pci.empty() ? "(none given)" : d->pci)
                      << ": "
                      << (d->group ? "IOMMU group " + std::to_string(*d->group) + ", " +
                                         host::to_string(d->type)
                                   : std::string("no IOMMU group"))
                      << (d->peers.empty() ? ""
                                           : ", shared with " + nlohmann::json(d->peers).dump())
                      << "\n";
        for (auto &c : checks) {
            std::cout << (c["result"] == "pass" ? "pass " : "fail ") << "iommu = \""
                      << c["requirement"].get<std::string>() << "\"";
            if (c["result"] != "pass")
                std::cout << ": " << c["reason"].get<std::string>()
                          << "\n     fix: " << c["fix"].get<std::string>();
            std::cout << "\n";
        }
    }
    return strict_ok ? exit_ok : exit_failed;
}

} // namespace

Runner add_doctor(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *cmd = app.add_subcommand(
        "doctor", "Check the host's IOMMU isolation for a NIC and a GPU, the way knod-policyd does "
                  "before a binding, and say how to fix what fails.");
    cmd->add_option("--nic", o->nic, "the NIC's PCI address, e.g. 0000:c2:00.0");
    cmd->add_option("--gpu", o->gpu, "the GPU's PCI address, e.g. 0000:c1:00.0");
    cmd->add_option("--sysfs-root", o->sysfs, "read sysfs here (fixture trees in tests)")
        ->capture_default_str();
    cmd->add_option("--proc-root", o->proc, "read /proc here")->capture_default_str();
    cmd->add_flag("--json", o->json, "print JSON");
    cmd->footer(
        "Exit 0 when the pair meets iommu = \"translated\", 1 otherwise. GPU inventory (libdrm), "
        "netdevs (netlink), PCIe ACS and P2P distance are not checked yet.");
    return [cmd, o]() -> int { return cmd->parsed() ? run(*o) : -1; };
}

} // namespace knod::cli
