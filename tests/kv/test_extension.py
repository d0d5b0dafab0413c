"""The compiled module: the installed build, and a build made without CUDA, have the same API; a CUDA
build loads and copies host memory on a machine without a GPU; errors name the source file and line."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specgen.kv.extension import cuda_compiled, cuda_device_count, kv_extension

REPO = Path(__file__).resolve().parents[2]


def _exercise(ext) -> None:
    """The same checks for any build: host copies through a Transfer, the block table, error types."""
    cache = np.arange(8 * 256, dtype=np.uint8).reshape(8, 256)
    pool = np.zeros(4 * 256, dtype=np.uint8)
    region = ext.Region(cache.ctypes.data, 256, 256, 0)
    transfer = ext.Transfer(-1, [region], 8, 256, 4, 1)
    transfer.set_segment(0, pool.ctypes.data)
    transfer.copy(True, np.array([6, 1]), np.array([0, 3]), 0, None, ext.Method.AUTO).wait()
    assert np.array_equal(pool.reshape(4, 256)[0], cache[6]) and np.array_equal(pool.reshape(4, 256)[3], cache[1])
    table = ext.BlockTable(4)
    table.enable_slots(0, 4)
    slots, evicted = table.allocate(np.array([11, 12], dtype=np.uint64))
    assert list(slots) == [0, 1] and len(evicted) == 0
    assert issubclass(ext.KvTransferError, RuntimeError)
    with pytest.raises(ext.KvTransferError, match=r"csrc/block_table\.cpp:\d+: acquire: block 99 is not in the pool"):
        table.acquire(np.array([99], dtype=np.uint64))


def test_installed_build_api() -> None:
    ext = kv_extension()
    _exercise(ext)
    if cuda_compiled():
        assert ext.cuda_runtime_version() >= 11000


def test_cuda_build_loads_and_reports_no_device_without_a_gpu() -> None:
    if not cuda_compiled():
        pytest.skip("this build has no CUDA paths (nvcc was absent)")
    if cuda_device_count() > 0:
        pytest.skip("this machine has a GPU")
    ext = kv_extension()
    assert ext.pointer_device(np.zeros(4).ctypes.data) == -1
    with pytest.raises(ext.KvTransferError, match=r"csrc/cuda_ops\.cu:\d+: CUDA device 0 does not exist \(this machine "
                                                  r"has 0 usable CUDA devices\)"):
        ext.device_alloc(0, 1 << 20)


@pytest.fixture(scope="module")
def cpu_only_module(tmp_path_factory: pytest.TempPathFactory):
    """The extension configured and built by CMake with the CUDA paths switched off."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not on PATH")
    import pybind11

    build = tmp_path_factory.mktemp("kv_cpu_build")
    out = build / "out"
    configure = ["cmake", "-S", str(REPO), "-B", str(build), "-DSPECGEN_KV_CUDA=OFF",
                 f"-DSPECGEN_KV_OUTPUT_DIR={out}", f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
    subprocess.run(configure, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)], check=True, capture_output=True)
    (path,) = out.glob("_kv_transfer*.so")
    spec = importlib.util.spec_from_file_location("_kv_transfer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_without_cuda_has_the_same_api(cpu_only_module) -> None:
    ext = cpu_only_module
    assert not ext.cuda_compiled() and ext.device_count() == 0 and ext.cuda_runtime_version() == 0
    installed = {name for name in dir(kv_extension()) if not name.startswith("_")}
    assert installed == {name for name in dir(ext) if not name.startswith("_")}
    _exercise(ext)
    with pytest.raises(ext.KvTransferError, match=r"csrc/cuda_ops_stub\.cpp:\d+: device_alloc: this build .* has no "
                                                  r"CUDA support \(nvcc was not found"):
        ext.device_alloc(0, 1024)
