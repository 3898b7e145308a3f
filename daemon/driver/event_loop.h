// What a driver needs from the daemon's event loop: to be told when an fd is readable.
// main.cc implements it on sd-event; tests can drive a driver by hand.
#pragma once

#include "knod/result.h"

#include <functional>

namespace knod::driver {

class EventLoop {
  public:
    virtual ~EventLoop() = default;
    virtual Result<void> watch(int fd, std::function<void()> on_readable) = 0;
    virtual void unwatch(int fd) = 0;
};

} // namespace knod::driver
