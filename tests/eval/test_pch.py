"""The precompiled torch headers: made only for flags that name no file and run no program, found
for a build by its flags, and a build that uses one gives the same working extension."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from specgen.eval import pch  # noqa: E402
from specgen.eval.extensions import BuildSession, KernelLedger  # noqa: E402


def test_only_flags_that_change_code_generation_are_allowed() -> None:
    assert pch.allowed(["-O3", "-fopenmp", "-march=native", "-DBLOCK=256", "-std=c++17", "-w"])
    for flag in ("-fplugin=/tmp/x.so", "-B/tmp", "-wrapper", "-Wp,-MD,/tmp/out", "@/etc/passwd",
                 "-include/etc/passwd", "-fdump-tree-all", "-specs=/tmp/s", "-o/tmp/x"):
        assert not pch.allowed([flag]), flag


def test_flags_are_read_as_torch_passes_them() -> None:
    assert pch.normalize(None) == [] and pch.normalize([""]) == []
    assert pch.normalize(" -O3 ") == ["-O3"] and pch.normalize([" -O2", ""]) == ["-O2"]
    assert pch.normalize([3]) is None and pch.normalize({"-O3": 1}) is None


def test_variants_are_read_from_cpp_calls_without_running_them() -> None:
    source = '''
from torch.utils.cpp_extension import load_inline
import torch.utils.cpp_extension as ce
FLAGS = ["-O1"]
a = load_inline(name="a", cpp_sources=S, extra_cflags=["-O3", ""])
b = ce.load_inline(name="b", cpp_sources=S, cuda_sources=C, functions=["f"])
c = load_inline(name="c", cpp_sources=S, extra_cflags=FLAGS)                # not a literal
d = load_inline(name="d", cpp_sources=S, extra_cflags=["-fplugin=/tmp/p.so"])
e = load_inline(name="e", cpp_sources=S, extra_include_paths=["/x"])
f = load_inline(name="f", cpp_sources=S, extra_cflags=["-O3"])              # a repeat
'''
    assert pch.variants(source) == [(False, ["-O3"])]      # none for CUDA: see pch.variants
    assert pch.variants("def broken(:\n") == []


def test_a_refused_flag_makes_nothing(tmp_path: Path) -> None:
    assert pch.make(tmp_path, False, ["-fplugin=/tmp/p.so"]) is None
    assert not (tmp_path / "ext").exists()
    assert pch.lookup(tmp_path, False, []) is None
    assert pch.lookup(tmp_path, False, [], extra_include_paths=["/x"]) is None


@pytest.mark.slow
def test_a_build_with_the_pch_gives_the_same_working_extension(tmp_path: Path) -> None:
    import torch.utils.cpp_extension as cpp_extension

    made = pch.make(tmp_path, False, ["-O2"])
    assert made is not None and (made / "torch" / "extension.h.gch").stat().st_size > 1 << 20
    assert pch.lookup(tmp_path, False, ["-O2", ""]) == made
    assert pch.lookup(tmp_path, False, ["-O3"]) is None          # other flags: another PCH
    assert pch.make(tmp_path, False, ["-O2"]) == made           # made once
    ledger = KernelLedger()
    session = BuildSession(cpp_extension.load_inline, tmp_path, tmp_path / "build", ledger, "s")
    module = session.load_inline(name="specgen_pch_used", functions=["twice"], extra_cflags=["-O2"],
                                 cpp_sources="torch::Tensor twice(torch::Tensor x) { return x * 2; }")
    assert torch.equal(module.twice(torch.ones(3)), torch.full((3,), 2.0))
    ninja = next((tmp_path / "build").glob("specgen_pch_used-*/build.ninja")).read_text()
    assert f"-I{made}" in ninja
