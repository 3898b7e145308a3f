#include "daemon/driver/region.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifndef DMA_BUF_MAGIC
#define DMA_BUF_MAGIC 0x444d4142
#endif

namespace knod::driver {

const char *to_string(RegionKind k) {
    return k == RegionKind::memfd ? "memfd" : "dma-buf";
}

Result<RegionInfo> inspect_region(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return make_error(Errc::invalid_argument, "region: not an open file descriptor");
    if (flags & O_PATH)
        return make_error(Errc::invalid_argument, "region: an O_PATH descriptor carries no memory");
    struct stat st {};
    struct statfs sfs {};
    if (fstat(fd, &st) != 0 || fstatfs(fd, &sfs) != 0)
        return make_error(Errc::invalid_argument, std::string("region: ") + std::strerror(errno));
    RegionInfo info;
    info.device = st.st_dev;
    info.inode = st.st_ino;
    if (static_cast<unsigned long>(sfs.f_type) == DMA_BUF_MAGIC) {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < 0) return make_error(Errc::invalid_argument, "region: dma-buf size unknown");
        info.kind = RegionKind::dma_buf;
        info.size = static_cast<std::uint64_t>(end);
        return info;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !S_ISREG(st.st_mode))
        return make_error(Errc::invalid_argument,
                          "region: must be a dma-buf or a sealed memfd (memfd_create with "
                          "MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK); got a " +
                              std::string(S_ISFIFO(st.st_mode)   ? "pipe"
                                          : S_ISSOCK(st.st_mode) ? "socket"
                                          : S_ISDIR(st.st_mode)  ? "directory"
                                                                 : "regular file"));
    if (!(seals & F_SEAL_SHRINK))
        return make_error(Errc::invalid_argument, "region: memfd lacks F_SEAL_SHRINK");
    if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
        return make_error(Errc::invalid_argument, "region: memfd is sealed against writes");
    if ((flags & O_ACCMODE) != O_RDWR)
        return make_error(Errc::invalid_argument, "region: memfd must be open read-write");
    info.kind = RegionKind::memfd;
    info.size = static_cast<std::uint64_t>(st.st_size);
    return info;
}

Result<void> check_window(const RegionInfo &region, std::uint64_t offset, std::uint64_t length) {
    if (length == 0) return make_error(Errc::invalid_argument, "length: must be greater than 0");
    if (offset + length < offset)
        return make_error(Errc::invalid_argument, "offset+length: overflows 64 bits");
    if (offset + length > region.size)
        return make_error(Errc::invalid_argument,
                          "offset+length: " + std::to_string(offset + length) +
                              " is past the end of the region (" + std::to_string(region.size) +
                              " bytes)");
    return {};
}

} // namespace knod::driver
