// Real dma-bufs for the devmem tests, from whichever exporter the kernel has: udmabuf (a sealed
// memfd turned into a dma-buf) and DRM PRIME exports of dumb buffers (virtio-gpu, vgem). On a
// machine without them (this project's CI VMs) each returns -1 and the tests that need one skip;
// the QEMU run (tests/vm/devmem.sh) has all three.
#pragma once

#include <fcntl.h>
#include <libdrm/drm.h>
#include <libdrm/drm_mode.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace knod::test {

// A dma-buf of `size` bytes from /dev/udmabuf, or -1.
inline int make_udmabuf(std::uint64_t size) {
    int dev = ::open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
    if (dev < 0) return -1;
    int mem = memfd_create("knod-udmabuf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int buf = -1;
    if (mem >= 0 && ftruncate(mem, static_cast<off_t>(size)) == 0 &&
        fcntl(mem, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
        udmabuf_create req{};
        req.memfd = static_cast<std::uint32_t>(mem);
        req.flags = UDMABUF_FLAGS_CLOEXEC;
        req.size = size;
        buf = ioctl(dev, UDMABUF_CREATE, &req);
    }
    if (mem >= 0) ::close(mem);
    ::close(dev);
    return buf;
}

// A PRIME export of a dumb buffer (about `size` bytes) from the DRM card whose driver is
// `driver` ("virtio_gpu", "vgem"), or -1. Dumb buffers need the primary node, not renderD*.
inline int make_drm_dmabuf(const std::string &driver, std::uint64_t size) {
    std::error_code ec;
    for (auto &e : std::filesystem::directory_iterator("/dev/dri", ec)) {
        if (e.path().filename().string().rfind("card", 0) != 0) continue;
        int fd = ::open(e.path().c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0) continue;
        char name[64] = {};
        drm_version v{};
        v.name = name;
        v.name_len = sizeof name - 1;
        int buf = -1;
        if (ioctl(fd, DRM_IOCTL_VERSION, &v) == 0 && driver == name) {
            drm_mode_create_dumb dumb{};
            dumb.width = 1024;
            dumb.bpp = 32;
            dumb.height = static_cast<std::uint32_t>((size + 4095) / 4096);
            drm_prime_handle prime{};
            if (ioctl(fd, DRM_IOCTL_MODE_CREATE_DUMB, &dumb) == 0) {
                prime.handle = dumb.handle;
                prime.flags = DRM_CLOEXEC | DRM_RDWR;
                if (ioctl(fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &prime) == 0) buf = prime.fd;
            }
        }
        ::close(fd); // the export keeps the buffer alive
        if (buf >= 0) return buf;
    }
    return -1;
}

} // namespace knod::test
