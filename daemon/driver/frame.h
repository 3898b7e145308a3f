// Userspace parsing of a received frame, for the sim's delivery: which flow it is and where
// its payload starts. The filter already checked it; this only finds the bytes.
#pragma once

#include "policy/flow_spec.h"

#include <optional>
#include <span>

namespace knod::driver {

struct Frame {
    policy::FiveTuple tuple;
    std::span<const std::uint8_t> payload; // the UDP or TCP payload
};

std::optional<Frame> parse_frame(std::span<const std::uint8_t> frame);

} // namespace knod::driver
