"""GPU allocations as dma-bufs, for binding real VRAM (hardware drivers: devmem, knod).

Each runtime is loaded with ctypes when first asked for, never at import, so this module imports
on a machine without a GPU. Where the runtime, a device or the kernel's dma-buf support is
missing, the helpers raise knod.ExportUnavailable saying which.

  cuda_export_dmabuf(ptr, nbytes)  cuMemGetHandleForAddressRange (CUDA >= 11.7, the driver's
                                   libcuda.so.1; needs CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
                                   the open kernel modules on Linux >= 5.12)
  hip_export_dmabuf(ptr, nbytes)   hipMemGetHandleForAddressRange (ROCm >= 6.2), or on older
                                   ROCm hsa_amd_portable_export_dmabuf (libhsa-runtime64.so.1;
                                   amdgpu with CONFIG_DMABUF_MOVE_NOTIFY/P2PDMA for VRAM)
  export_dmabuf(tensor)            a torch tensor (or any object with data_ptr() and nbytes /
                                   numel()*element_size()), through HIP on ROCm builds else CUDA

Page alignment: the CUDA and HIP calls export whole pages (the host page size), so the range
is widened to page boundaries and the returned DmaBuf's offset says where `ptr` is inside it.
The pages around the buffer are exported with it: allocate receive buffers from a dedicated
pool (their own cudaMalloc/hipMalloc, or a private memory pool, page-aligned and a whole number
of pages), not from a caching allocator whose block may share pages with other tensors. The
sim and knod drivers let the NIC write only [offset, offset+length); devmem's bind-rx gives the
NIC the whole dma-buf, so the devmem driver refuses anything but the whole of it (offset 0,
length its size): for devmem, export exactly a page-aligned buffer of whole pages.

Environment: KNOD_CUDA_LIBRARY, KNOD_HIP_LIBRARY, KNOD_HSA_LIBRARY name the library file to
load instead of the default names (for a runtime in an unusual place, and for tests).
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

from ._errors import ExportUnavailable
from .buffers import DmaBuf

_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1


def _page_range(ptr, nbytes):
    """(start, size, offset): the whole pages around [ptr, ptr+nbytes)."""
    if not isinstance(ptr, int) or isinstance(ptr, bool) or not 0 < ptr < 2**64:
        raise ValueError(f"a device pointer must be a positive int, not {ptr!r}")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or not 0 < nbytes < 2**63:
        raise ValueError(f"nbytes must be a positive int, not {nbytes!r}")
    page = os.sysconf("SC_PAGE_SIZE")
    start = ptr & ~(page - 1)
    end = (ptr + nbytes + page - 1) & ~(page - 1)
    return start, end - start, ptr - start


def _load(env, names, what, install):
    override = os.environ.get(env)
    tried = [override] if override else names
    for name in tried:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise ExportUnavailable(f"{what} is not available: cannot load {' or '.join(tried)} "
                            f"({install})")


def _cuda_check(cu, rc, call):
    if rc == 0:
        return
    name = ctypes.c_char_p()
    text = None
    if cu.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        text = name.value.decode(errors="replace")
    raise ExportUnavailable(f"CUDA {call} failed: {text or 'error ' + str(rc)}", code=rc)


def cuda_export_dmabuf(ptr: int, nbytes: int) -> DmaBuf:
    """A DmaBuf for `nbytes` of CUDA device memory at `ptr` (an int, as tensor.data_ptr())."""
    start, size, offset = _page_range(ptr, nbytes)
    cu = _load("KNOD_CUDA_LIBRARY", ["libcuda.so.1"], "the CUDA driver",
               "the NVIDIA driver's libcuda1 / libnvidia-compute package")
    if not hasattr(cu, "cuMemGetHandleForAddressRange"):
        raise ExportUnavailable("the CUDA driver has no cuMemGetHandleForAddressRange "
                                "(needs CUDA 11.7 or newer)")
    _cuda_check(cu, cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _cuda_check(cu, cu.cuPointerGetAttribute(ctypes.byref(dev),
                                             _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             ctypes.c_uint64(ptr)),
                "cuPointerGetAttribute (is it device memory?)")
    supported = ctypes.c_int()
    _cuda_check(cu, cu.cuDeviceGetAttribute(ctypes.byref(supported),
                                            _CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev),
                "cuDeviceGetAttribute")
    if not supported.value:
        raise ExportUnavailable(f"CUDA device {dev.value} cannot export dma-bufs (needs the "
                                "open kernel modules and Linux 5.12 or newer)")
    fd = ctypes.c_int(-1)
    _cuda_check(cu, cu.cuMemGetHandleForAddressRange(
        ctypes.byref(fd), ctypes.c_uint64(start), ctypes.c_size_t(size),
        _CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ctypes.c_ulonglong(0)),
        "cuMemGetHandleForAddressRange")
    return DmaBuf(fd.value, offset, nbytes)


def hip_export_dmabuf(ptr: int, nbytes: int) -> DmaBuf:
    """A DmaBuf for `nbytes` of HIP (ROCm) device memory at `ptr`."""
    start, size, offset = _page_range(ptr, nbytes)
    hip_names = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"]
    hip = None
    try:
        hip = _load("KNOD_HIP_LIBRARY", hip_names, "the HIP runtime", "ROCm's hip-runtime-amd")
    except ExportUnavailable:
        if os.environ.get("KNOD_HIP_LIBRARY"):
            raise
    if hip is not None and hasattr(hip, "hipMemGetHandleForAddressRange"):
        fd = ctypes.c_int(-1)
        rc = hip.hipMemGetHandleForAddressRange(
            ctypes.byref(fd), ctypes.c_void_p(start), ctypes.c_size_t(size),
            _HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ctypes.c_ulonglong(0))
        if rc != 0:
            hip.hipGetErrorName.restype = ctypes.c_char_p
            name = hip.hipGetErrorName(rc)
            raise ExportUnavailable(f"hipMemGetHandleForAddressRange failed: "
                                    f"{name.decode(errors='replace') if name else rc}", code=rc)
        return DmaBuf(fd.value, offset, nbytes)
    # Older ROCm: the HSA runtime's exporter, which takes any range and says the offset itself.
    hsa_names = ["libhsa-runtime64.so.1"]
    if hip is None and not os.environ.get("KNOD_HSA_LIBRARY"):
        hsa_names = hip_names + hsa_names  # named in the error if none loads
    hsa = _load("KNOD_HSA_LIBRARY", hsa_names, "the ROCm runtime (HIP or HSA)",
                "ROCm's hip-runtime-amd or hsa-rocr")
    if not hasattr(hsa, "hsa_amd_portable_export_dmabuf"):
        raise ExportUnavailable("the HSA runtime has no hsa_amd_portable_export_dmabuf "
                                "(needs ROCm 5.x or newer)")
    rc = hsa.hsa_init()
    if rc != 0:
        raise ExportUnavailable(f"hsa_init failed: status {rc:#x} (no usable AMD GPU?)", code=rc)
    fd = ctypes.c_int(-1)
    off = ctypes.c_uint64()
    rc = hsa.hsa_amd_portable_export_dmabuf(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes),
                                            ctypes.byref(fd), ctypes.byref(off))
    if rc != 0:
        raise ExportUnavailable(f"hsa_amd_portable_export_dmabuf failed: status {rc:#x} "
                                "(not device memory, or the kernel cannot export it)", code=rc)
    return DmaBuf(fd.value, off.value, nbytes)


def export_dmabuf(tensor: Any, runtime: Optional[str] = None) -> DmaBuf:
    """A DmaBuf for a GPU tensor's bytes. `runtime`: "cuda" or "hip"; by default HIP for a
    ROCm build of torch, else CUDA."""
    if not callable(getattr(tensor, "data_ptr", None)):
        raise TypeError(f"export_dmabuf needs a GPU tensor (with data_ptr()), not a "
                        f"{type(tensor).__name__}; for a raw pointer use cuda_export_dmabuf(ptr, "
                        "nbytes) or hip_export_dmabuf(ptr, nbytes)")
    ptr = tensor.data_ptr()
    nbytes = getattr(tensor, "nbytes", None)
    if nbytes is None:
        nbytes = tensor.numel() * tensor.element_size()
    if runtime is None:
        runtime = "cuda"
        if type(tensor).__module__.split(".")[0] == "torch":
            import torch  # a torch tensor: torch is there

            if getattr(torch.version, "hip", None):
                runtime = "hip"
    if runtime == "hip":
        return hip_export_dmabuf(ptr, nbytes)
    if runtime == "cuda":
        return cuda_export_dmabuf(ptr, nbytes)
    raise ValueError(f"runtime must be 'cuda' or 'hip', not {runtime!r}")
