// Whether a NIC can carry a devmem TCP binding, asked before the kernel is: the facts bind-rx
// depends on (header split, hds-thresh, an attached XDP program, active RX queues, RSS reach)
// read from ethtool netlink (rings-get, through libnl-genl), rtnetlink (IFLA_XDP) and the RSS
// indirection table, and judged by one pure function so that the doctor and the devmem backend
// refuse for the same reasons, each with its fix. Upstream facts: ../shared/vm-rig.md.
#pragma once

#include "host/netdev_genl.h"
#include "knod/result.h"
#include "policy/parser.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

struct nlattr;
struct nlmsghdr;

namespace knod::host {

// ethtool rings-get, as far as devmem cares.
struct HeaderSplit {
    // ETHTOOL_A_RINGS_TCP_DATA_SPLIT (ETHTOOL_TCP_DATA_SPLIT_*: 1 off, 2 on); the kernel leaves
    // it out when the driver does not report header split, which means it has none.
    std::optional<std::uint8_t> tcp_data_split;
    // ETHTOOL_A_RINGS_HDS_THRESH: Linux 6.13 and later; absent is unknown, not wrong.
    std::optional<std::uint32_t> hds_thresh;
};

// The XDP program on a netdev (IFLA_XDP), and whose it is.
struct XdpAttachment {
    std::uint8_t mode = 0; // XDP_ATTACHED_*: 0 none, 1 driver, 2 generic (skb), 3 hw, 4 multi
    std::uint32_t prog_id = 0;
    std::string prog_name; // from the BPF object info; empty when unreadable
    bool attached() const { return mode != 0; }
};

struct DevmemFacts {
    std::string netdev;
    std::uint32_t rx_queues = 0; // active RX queues; 0: unknown
    std::optional<HeaderSplit> split;
    std::string split_error; // why `split` is missing
    std::optional<XdpAttachment> xdp;
    std::string xdp_error;
    // The RSS indirection table; nullopt with an empty rss_error: the device has none (it
    // spreads nothing).
    std::optional<std::vector<std::uint32_t>> rss;
    std::string rss_error;
};

struct DevmemProblem {
    std::string check; // "header-split", "hds-thresh", "xdp", "queues", "rss"
    std::string message;
    std::string fix;
    // Whether bind-rx itself would fail (refused at request time); the others make a binding
    // impossible or unsafe in ways the backend checks on its own (queue choice, RSS reach).
    bool refuses_bind = false;
};

// Everything that keeps `f.netdev` from carrying a devmem binding; empty: devmem-ready as far as
// these facts go.
std::vector<DevmemProblem> devmem_problems(const DevmemFacts &f);

// The RX queues past 0 that RSS never sends traffic to (candidates for a binding).
std::vector<std::uint32_t> queues_outside_rss(const DevmemFacts &f);

// The RX queues of a queue-get answer that something already holds, one line each, in queue
// order: "queue 3 is held by io_uring zero-copy receive". A held queue is refused to a new
// binding (choose_rx_queue); the doctor names them so an operator sees who holds what.
std::vector<std::string> held_rx_queues(const std::vector<driver::NetdevQueue> &queues);

// Parsers of the kernel's answers (unit-tested on crafted messages).
// A genetlink ETHTOOL_MSG_RINGS_GET_REPLY.
Result<HeaderSplit> parse_rings_reply(nlmsghdr *reply);
// An RTM_NEWLINK answer: its IFLA_XDP nest (program name left empty).
Result<XdpAttachment> parse_link_xdp(nlmsghdr *reply);

// Live reads, in the caller's network namespace.
Result<HeaderSplit> read_header_split(int ifindex);
Result<XdpAttachment> read_xdp(int ifindex);
Result<std::optional<std::vector<std::uint32_t>>> read_rss_table(const std::string &ifname);
DevmemFacts read_devmem_facts(int ifindex, const std::string &ifname, std::uint32_t rx_queues);

// The request-time check: fails (driver_failure) with every problem that would make bind-rx
// fail (header split, hds-thresh, XDP), each with its fix.
Result<void> require_devmem_ready(int ifindex, const std::string &ifname);

// What the devmem backend can never serve in `policy` (`knod-policy check --driver devmem`):
// a warning per allow rule with flows that are not TCP (devmem receives TCP only) or whose port
// ranges have no ntuple form, saying whether the rule can serve anything at all on devmem.
std::vector<policy::Diagnostic> devmem_policy_warnings(const policy::Policy &policy);

} // namespace knod::host
