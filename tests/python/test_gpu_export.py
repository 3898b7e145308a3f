"""knod.gpu without a GPU runtime: importing loads nothing; each helper fails with
knod.ExportUnavailable naming what is missing; a runtime that has no device says so."""
import ctypes
import os
import subprocess
import sys

import pytest

import knod
import knod.gpu


def test_import_loads_no_runtime():
    code = ("import knod, knod.gpu, sys; "
            "maps = open('/proc/self/maps').read(); "
            "print(any(n in maps for n in ('libcuda', 'libamdhip64', 'libhsa-runtime')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _have(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


@pytest.mark.skipif(_have("libcuda.so.1"), reason="a CUDA driver is installed here")
def test_cuda_missing_names_the_driver_library():
    with pytest.raises(knod.ExportUnavailable, match="libcuda.so.1"):
        knod.gpu.cuda_export_dmabuf(0x7F0000001000, 4096)


@pytest.mark.skipif(_have("libamdhip64.so.6") or _have("libhsa-runtime64.so.1"),
                    reason="a ROCm runtime is installed here")
def test_hip_missing_names_both_runtimes():
    with pytest.raises(knod.ExportUnavailable) as e:
        knod.gpu.hip_export_dmabuf(0x7F0000001000, 4096)
    assert "libamdhip64.so.6" in str(e.value) and "libhsa-runtime64.so.1" in str(e.value)


def test_an_overridden_path_that_does_not_exist(monkeypatch):
    monkeypatch.setenv("KNOD_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
    with pytest.raises(knod.ExportUnavailable, match="/nonexistent/libcuda.so.1"):
        knod.gpu.cuda_export_dmabuf(0x7F0000001000, 4096)
    monkeypatch.setenv("KNOD_HIP_LIBRARY", "/nonexistent/libamdhip64.so")
    with pytest.raises(knod.ExportUnavailable, match="/nonexistent/libamdhip64.so"):
        knod.gpu.hip_export_dmabuf(0x7F0000001000, 4096)


def test_a_cuda_driver_without_a_device(tmp_path, monkeypatch):
    # A stand-in libcuda whose cuInit answers CUDA_ERROR_NO_DEVICE (100), as on a machine
    # with the driver's library but no GPU.
    src = tmp_path / "cuda_stub.c"
    src.write_text("""
        int cuInit(unsigned f) { (void)f; return 100; }
        int cuGetErrorName(int e, const char **s) { *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : 0; return 0; }
        int cuMemGetHandleForAddressRange(void) { return 1; }
    """)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.setenv("KNOD_CUDA_LIBRARY", str(lib))
    with pytest.raises(knod.ExportUnavailable, match="cuInit failed: CUDA_ERROR_NO_DEVICE"):
        knod.gpu.cuda_export_dmabuf(0x7F0000001000, 4096)


def test_page_rounding_and_bad_pointers():
    page = os.sysconf("SC_PAGE_SIZE")
    assert knod.gpu._page_range(10 * page + 100, 50) == (10 * page, page, 100)
    assert knod.gpu._page_range(10 * page, 2 * page) == (10 * page, 2 * page, 0)
    assert knod.gpu._page_range(10 * page + 1, page) == (10 * page, 2 * page, 1)
    for ptr, n in ((0, 1), (-5, 1), (4096, 0), ("x", 1)):
        with pytest.raises(ValueError):
            knod.gpu.cuda_export_dmabuf(ptr, n)
    with pytest.raises(ValueError):
        knod.gpu.export_dmabuf(type("T", (), {"data_ptr": lambda s: 4096, "nbytes": 8})(),
                               runtime="opencl")


# Stand-in runtimes that answer like the real ones and log what they were asked, so the
# helpers' page rounding and argument passing are checked without a GPU.
STUBS = r"""
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
static void log_call(const char *what, uintptr_t p, size_t n, int type) {
    FILE *f = fopen(getenv("STUB_LOG"), "w");
    if (f) { fprintf(f, "%s %lx %zx %d\n", what, (unsigned long)p, n, type); fclose(f); }
}
/* STUB_SIZED: a sealed memfd of the exported size, which the sim driver takes as a region. */
static int fd_of(size_t n) {
    int f = memfd_create("stub-dmabuf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f >= 0 && getenv("STUB_SIZED") && (ftruncate(f, (off_t)n) != 0 ||
                                           fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
        close(f);
        return -1;
    }
    return f;
}
int cuInit(unsigned f) { (void)f; return 0; }
int cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_STUB"; return 0; }
int cuPointerGetAttribute(void *data, int attr, unsigned long long p) {
    (void)attr; (void)p; *(int *)data = 0; return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev; *v = attr == 124 && getenv("STUB_DMABUF"); return 0;
}
int cuMemGetHandleForAddressRange(int *h, unsigned long long p, size_t n, int t,
                                  unsigned long long fl) {
    (void)fl; log_call("cuda", (uintptr_t)p, n, t); *h = fd_of(n); return 0;
}
int hipMemGetHandleForAddressRange(int *h, void *p, size_t n, int t, unsigned long long fl) {
    (void)fl; log_call("hip", (uintptr_t)p, n, t); *h = fd_of(n); return 0;
}
int hsa_init(void) { return 0; }
int hsa_amd_portable_export_dmabuf(const void *p, size_t n, int *h, uint64_t *off) {
    log_call("hsa", (uintptr_t)p, n, 0); *h = fd_of(n); *off = (uintptr_t)p & 4095; return 0;
}
"""


@pytest.fixture
def stub(tmp_path, monkeypatch):
    src = tmp_path / "stub.c"
    src.write_text(STUBS)
    lib = tmp_path / "libstub.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "log"))
    return lib, tmp_path / "log"


def test_cuda_export_rounds_to_pages_and_returns_the_offset(stub, monkeypatch):
    lib, log = stub
    monkeypatch.setenv("KNOD_CUDA_LIBRARY", str(lib))
    page = os.sysconf("SC_PAGE_SIZE")
    ptr = 0x7F0000000000 + 3 * page + 200
    with pytest.raises(knod.ExportUnavailable, match="cannot export dma-bufs"):
        knod.gpu.cuda_export_dmabuf(ptr, 5000)  # the device says no
    monkeypatch.setenv("STUB_DMABUF", "1")
    with knod.gpu.cuda_export_dmabuf(ptr, 5000) as buf:
        assert (buf.offset, buf.length) == (200, 5000)
        assert os.fstat(buf.fd).st_size == 0  # the stub's fd: a real, open file
        what, start, size, kind = log.read_text().split()
        assert what == "cuda" and int(kind) == 1  # CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
        assert int(start, 16) == ptr - 200 and int(size, 16) == 2 * page
    assert buf.fd == -1


def test_hip_export_with_hip_and_with_hsa_on_older_rocm(stub, monkeypatch):
    lib, log = stub
    page = os.sysconf("SC_PAGE_SIZE")
    ptr = 0x7F0000000000 + page + 8
    monkeypatch.setenv("KNOD_HIP_LIBRARY", str(lib))
    with knod.gpu.hip_export_dmabuf(ptr, page) as buf:
        assert (buf.offset, buf.length) == (8, page)
        what, start, size, kind = log.read_text().split()
        assert (what, int(start, 16), int(size, 16), int(kind)) == ("hip", ptr - 8, 2 * page, 1)
    # A HIP without hipMemGetHandleForAddressRange: the HSA exporter, with its own offset.
    monkeypatch.setenv("KNOD_HIP_LIBRARY", "/nonexistent/libamdhip64.so")
    with pytest.raises(knod.ExportUnavailable, match="/nonexistent/libamdhip64.so"):
        knod.gpu.hip_export_dmabuf(ptr, page)
    monkeypatch.delenv("KNOD_HIP_LIBRARY")
    monkeypatch.setenv("KNOD_HSA_LIBRARY", str(lib))
    if _have("libamdhip64.so.6"):
        pytest.skip("a real HIP runtime is installed here")
    with knod.gpu.hip_export_dmabuf(ptr, page) as buf:
        assert (buf.offset, buf.length) == (8, page)
        what, start, size, _ = log.read_text().split()
        assert (what, int(start, 16), int(size, 16)) == ("hsa", ptr, page)


class _CudaTensor:
    """Shaped like a torch CUDA tensor, for the stand-in driver: device.type "cuda", a device
    pointer, bytes."""

    class device:
        type = "cuda"

    def __init__(self, ptr, nbytes):
        self._ptr, self.nbytes = ptr, nbytes

    def data_ptr(self):
        return self._ptr


def test_a_gpu_tensor_is_exported_for_the_caller_and_bound_whole(stub, monkeypatch, client):
    """#36: register_buffer(cuda_tensor) exports its dma-buf itself (the stand-in CUDA driver
    hands out a sealed memfd of the exported pages), binds the tensor's own bytes in it (never
    the neighbours' on its pages), and closes it with the binding."""
    from conftest import NETDEV, eventually, flow, sim_send

    lib, log = stub
    monkeypatch.setenv("KNOD_CUDA_LIBRARY", str(lib))
    monkeypatch.setenv("STUB_DMABUF", "1")
    monkeypatch.setenv("STUB_SIZED", "1")
    page = os.sysconf("SC_PAGE_SIZE")
    tensor = _CudaTensor(0x7F0000000000 + page + 100, 3000)
    with client.register_buffer(tensor, flow(5160), netdev=NETDEV) as b:
        assert b.dmabuf is not None and b.dmabuf.fd >= 0
        assert b.length == 3000  # the tensor's bytes, at offset 100 of the exported page
        assert log.read_text().split()[0] == "cuda"
        sim_send(5160, "gpu-bytes", count=1)
        assert eventually(lambda: (b.wait_for_data(200, seen=0) or 0) >= len("gpu-bytes"))
        assert os.pread(b.dmabuf.fd, 9, 100) == b"gpu-bytes"
        assert os.pread(b.dmabuf.fd, 100, 0) == bytes(100)  # the neighbour's bytes untouched
    assert b.dmabuf.fd == -1  # closed with the binding
    with pytest.raises(ValueError, match="where it lies"):
        client.request_binding(tensor, flow(5161), netdev=NETDEV, length=100)
    # An export that fails is the caller's error, and no binding is asked for.
    monkeypatch.delenv("STUB_DMABUF")
    with pytest.raises(knod.ExportUnavailable, match="cannot export dma-bufs"):
        client.request_binding(tensor, flow(5161), netdev=NETDEV)
