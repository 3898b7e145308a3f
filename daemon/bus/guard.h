// No exception may unwind through sd-bus or sd-event (C code, and the daemon is everyone's): a
// callback that throws is a bug, logged and answered with an error, and the loop keeps serving.
#pragma once

#include "knod/untrusted.h"

#include <systemd/sd-bus.h>

#include <cerrno>
#include <exception>
#include <iostream>

namespace knod::bus {

template <typename Fn> int guarded(const char *what, sd_bus_error *err, Fn &&fn) noexcept {
    try {
        return fn();
    } catch (const std::exception &e) {
        try {
            std::cerr << "knod-policyd: " << what
                      << ": internal error: " << escape_untrusted(e.what(), Escape::message, 512)
                      << std::endl;
        } catch (...) {
        }
    } catch (...) {
        try {
            std::cerr << "knod-policyd: " << what << ": internal error" << std::endl;
        } catch (...) {
        }
    }
    if (err) sd_bus_error_set(err, SD_BUS_ERROR_FAILED, "internal error; see the daemon's log");
    return -EIO;
}

} // namespace knod::bus
