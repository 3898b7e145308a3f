// What a caller's region fd really is. A region is a dma-buf on hardware and a sealed memfd in
// the sim; anything else (regular file, pipe, socket, O_PATH) is refused.
#pragma once

#include "knod/result.h"

#include <cstdint>

namespace knod::driver {

enum class RegionKind { memfd, dma_buf };

struct RegionInfo {
    RegionKind kind = RegionKind::memfd;
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
    std::uint64_t size = 0;
};

// Inspects `fd` without changing it. A memfd must carry F_SEAL_SHRINK (so the window cannot
// vanish under the data path), must not be write-sealed, and must be open read-write.
Result<RegionInfo> inspect_region(int fd);

// Checks offset and length for overflow and against the region's size.
Result<void> check_window(const RegionInfo &region, std::uint64_t offset, std::uint64_t length);

const char *to_string(RegionKind k);

} // namespace knod::driver
