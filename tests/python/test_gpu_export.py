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
