"""Build script: packaging metadata lives in pyproject.toml; this file drives CMakeLists.txt.

`pip install -e .` (and `pip install .`) configure and build the two compiled modules with CMake:
the KV-transfer extension and the evaluation's digest.
Environment knobs: SPECGEN_KV_CUDA=0 builds the host-memory module even where nvcc exists;
SPECGEN_CUDA_ARCHS (e.g. "90" or "80;90") picks the GPU architectures; SPECGEN_BUILD_JOBS caps
parallel compile jobs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import pybind11

        # One CMake tree builds both modules; each extension builds its own target into the
        # folder setuptools expects it in.
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSPECGEN_KV_OUTPUT_DIR={self._output_dir(KV_MODULE)}",
            f"-DSPECGEN_EVAL_OUTPUT_DIR={self._output_dir(DIGEST_MODULE)}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ]
        if os.environ.get("SPECGEN_KV_CUDA", "1") == "0":
            configure.append("-DSPECGEN_KV_CUDA=OFF")
        if os.environ.get("SPECGEN_CUDA_ARCHS"):
            configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ['SPECGEN_CUDA_ARCHS']}")
        jobs = os.environ.get("SPECGEN_BUILD_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "-j", jobs,
                        "--target", ext.name.rsplit(".", 1)[1]], check=True)

    def _output_dir(self, name: str) -> Path:
        return Path(self.get_ext_fullpath(name)).parent.resolve()


KV_MODULE = "specgen.kv._kv_transfer"
DIGEST_MODULE = "specgen.eval._digest"
ARENA_MODULE = "specgen.eval._arena"

setup(
    ext_modules=[CMakeExtension(KV_MODULE), CMakeExtension(DIGEST_MODULE), CMakeExtension(ARENA_MODULE)],
    cmdclass={"build_ext": CMakeBuild},
)
