// Watches network links through rtnetlink (RTNLGRP_LINK): tells when a link goes down or
// disappears, so the daemon can end the bindings on it. The caller polls fd() in its loop.
#pragma once

#include "knod/result.h"
#include "knod/unique_fd.h"

#include <functional>
#include <string>

namespace knod::host {

class LinkMonitor {
  public:
    // `why` is "link-down" or "link-removed".
    using Handler = std::function<void(const std::string &ifname, const std::string &why)>;

    static Result<LinkMonitor> open(Handler handler);
    int fd() const { return fd_.get(); }
    // Reads every pending notification and calls the handler for links that went away.
    void drain();

  private:
    LinkMonitor(UniqueFd fd, Handler h) : fd_(std::move(fd)), handler_(std::move(h)) {}
    UniqueFd fd_;
    Handler handler_;
};

} // namespace knod::host
