#include "host/link_monitor.h"

#include <net/if.h>

#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>

namespace knod::host {

Result<LinkMonitor> LinkMonitor::open(Handler handler) {
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
    if (fd < 0)
        return make_error(Errc::io, std::string("rtnetlink socket: ") + std::strerror(errno));
    UniqueFd owned(fd);
    sockaddr_nl addr{};
    addr.nl_family = AF_NETLINK;
    addr.nl_groups = RTMGRP_LINK;
    if (bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0)
        return make_error(Errc::io, std::string("rtnetlink bind: ") + std::strerror(errno));
    return LinkMonitor(std::move(owned), std::move(handler));
}

void LinkMonitor::drain() {
    // A deleted link is reported down first and removed a moment later: one verdict per name
    // per batch, removal winning.
    std::map<std::string, std::string> verdicts;
    alignas(nlmsghdr) char buf[16384];
    for (;;) {
        ssize_t n = recv(fd_.get(), buf, sizeof buf, 0);
        if (n <= 0) break; // EAGAIN: all read (ENOBUFS: overrun; the next event resyncs)
        for (auto *h = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(h, static_cast<unsigned>(n));
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) continue;
            auto *ifi = static_cast<ifinfomsg *>(NLMSG_DATA(h));
            std::string name;
            int len = static_cast<int>(IFLA_PAYLOAD(h));
            for (auto *a = IFLA_RTA(ifi); RTA_OK(a, len); a = RTA_NEXT(a, len))
                if (a->rta_type == IFLA_IFNAME)
                    name.assign(static_cast<const char *>(RTA_DATA(a)),
                                strnlen(static_cast<const char *>(RTA_DATA(a)), RTA_PAYLOAD(a)));
            if (name.empty()) continue;
            bool gone = h->nlmsg_type == RTM_DELLINK ||
                        if_nametoindex(name.c_str()) != static_cast<unsigned>(ifi->ifi_index);
            if (gone)
                verdicts[name] = "link-removed";
            else if (!(ifi->ifi_flags & IFF_UP) && !verdicts.count(name))
                verdicts[name] = "link-down";
        }
    }
    for (auto &[name, why] : verdicts)
        handler_(name, why);
}

} // namespace knod::host
