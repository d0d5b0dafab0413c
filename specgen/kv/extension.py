"""Loads the compiled KV-transfer module (`specgen.kv._kv_transfer`, built from csrc/ and bindings/).

Everything else in specgen.kv imports the module through `kv_extension()`, so a missing build gives
one clear message instead of an ImportError deep inside a call.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from specgen.errors import SpecgenError

_module: ModuleType | None = None


class KvExtensionMissing(SpecgenError, ImportError):
    """The compiled extension is not built or not importable."""


def kv_extension() -> ModuleType:
    """The compiled module; raises KvExtensionMissing with the fix when it is absent."""
    global _module
    if _module is None:
        try:
            _module = importlib.import_module("specgen.kv._kv_transfer")
        except ImportError as exc:
            raise KvExtensionMissing(
                "specgen's KV-transfer extension is not built: run `pip install -e .` in the specgen "
                "repository (needs CMake and a C++17 compiler; with nvcc present it adds the CUDA copy "
                f"paths). Import error: {exc}"
            ) from exc
    return _module


def cuda_compiled() -> bool:
    """True when the extension was built with its CUDA copy paths."""
    return bool(kv_extension().cuda_compiled())


def cuda_device_count() -> int:
    """CUDA devices the extension can use now (0 without a driver or GPU)."""
    return int(kv_extension().device_count())


def kv_transfer_error() -> type[Exception]:
    """The exception type the compiled extension raises (a RuntimeError whose message starts with
    the C++/CUDA source file and line that failed)."""
    return kv_extension().KvTransferError
