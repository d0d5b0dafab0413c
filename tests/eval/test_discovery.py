"""A build runner finds the load_inline calls a candidate makes in its constructor and its first
forward, at the run's scale and without memory or kernels, and the calls written with arguments
its globals give; it cannot find those made from what exists only in a run. (The compiler is
replaced by a stand-in here: what is tested is which calls are made, with what arguments.)"""
from __future__ import annotations

import inspect
import types
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.utils.cpp_extension as cpp_extension  # noqa: E402

from specgen.eval import discovery  # noqa: E402
from specgen.eval.extensions import BuildSession, KernelLedger  # noqa: E402
from specgen.eval.loader import candidate_from_text, exec_source  # noqa: E402
from specgen.messages import LoadProblem  # noqa: E402

PROBLEM = '''
import os
import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 1 << 20
dim = 64 if SMALL else 4096


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(batch_size, dim)]   # 16 GiB at full scale


def get_init_inputs():
    return [dim]
'''

HEADER = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n" \
         "SOURCE = 'torch::Tensor f(torch::Tensor x) { return x; }'\n"


class Built:
    """What the stand-in compiler was asked for, and which extension functions ran."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.ran: list[str] = []

    def load_inline(self, *args, **kwargs):
        bound = inspect.signature(REAL).bind(*args, **kwargs)
        self.calls.append(dict(bound.arguments))
        module = types.ModuleType(bound.arguments["name"])
        module.f = lambda *a: self.ran.append(bound.arguments["name"])
        return module


REAL = cpp_extension.load_inline


def discover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, scale: str = "full"
             ) -> tuple[Built, KernelLedger, list[str]]:
    built, ledger = Built(), KernelLedger()
    session = BuildSession(REAL, tmp_path / "cache", tmp_path / "build", ledger, "scope")
    session.real = built.load_inline
    monkeypatch.setattr(cpp_extension, "load_inline", session.load_inline)
    candidate = candidate_from_text(HEADER + body)
    module = exec_source(candidate, f"specgen_candidate_{uuid.uuid4().hex[:12]}", tmp_path)
    stopped = discovery.discover(session, candidate, module,
                                 LoadProblem(problem_source=PROBLEM, problem_name="p", scale=scale,
                                             init_seed=1), tmp_path)
    return built, ledger, stopped


def names(built: Built) -> list[str]:
    return [call["name"].rsplit("_", 1)[0] for call in built.calls]


def test_a_build_in_the_constructor_gets_the_runs_arguments(tmp_path, monkeypatch) -> None:
    built, ledger, _ = discover(tmp_path, monkeypatch, '''
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim))     # 64 MiB at full scale: meta here
        self.ext = load_inline(name=f"init_ext_{dim}", cpp_sources=SOURCE, functions=["f"])

    def forward(self, x):
        return self.ext.f(x)
''')
    assert names(built) == ["init_ext_4096"]
    assert [r.name for r in ledger.builds] == ["init_ext_4096"] and built.ran == []


def test_a_lazy_build_in_forward_is_found_at_the_runs_shapes_without_memory(
        tmp_path, monkeypatch) -> None:
    built, _, stopped = discover(tmp_path, monkeypatch, '''
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ext = None

    def forward(self, x):
        if self.ext is None:
            self.ext = load_inline(name=f"cols_{x.shape[1]}", cpp_sources=SOURCE, functions=["f"])
        return self.ext.f(x)
''')
    assert names(built) == ["cols_4096"]
    assert built.ran == []                         # the kernel did not run on meta tensors
    assert stopped and "ProbeStop" in stopped[0]


def test_a_source_specialized_to_the_batch_is_built_for_the_second_shape_too(
        tmp_path, monkeypatch) -> None:
    from specgen.eval.inputs import other_size

    built, _, _ = discover(tmp_path, monkeypatch, '''
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.built = {}

    def forward(self, x):
        rows = x.shape[0]
        if rows not in self.built:
            self.built[rows] = load_inline(name=f"rows_{rows}", cpp_sources=SOURCE, functions=["f"])
        return self.built[rows].f(x)
''')
    assert names(built) == [f"rows_{1 << 20}", f"rows_{other_size(1 << 20)}"]


def test_a_call_past_where_forward_fails_is_built_from_the_modules_globals(
        tmp_path, monkeypatch) -> None:
    built, _, stopped = discover(tmp_path, monkeypatch, '''
_ext = None

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        global _ext
        x = x.cuda()                       # no GPU in a build runner
        if _ext is None:
            _ext = load_inline(name="after_cuda", cpp_sources=SOURCE, functions=["f"],
                               extra_cflags=["-O3"])
        return _ext.f(x)
''')
    assert names(built) == ["after_cuda"] and built.calls[0]["extra_cflags"] == ["-O3"]
    assert any(s.startswith("forward:") for s in stopped)


def test_a_call_made_twice_builds_once(tmp_path, monkeypatch) -> None:
    built, ledger, _ = discover(tmp_path, monkeypatch, '''
ext = load_inline(name="shared", cpp_sources=SOURCE, functions=["f"])

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ext = load_inline(name="shared", cpp_sources=SOURCE, functions=["f"])

    def forward(self, x):
        return self.ext.f(x)
''')
    assert names(built) == ["shared"] and len(ledger.builds) == 1


def test_arguments_that_exist_only_in_a_run_are_not_guessed(tmp_path, monkeypatch) -> None:
    built, _, _ = discover(tmp_path, monkeypatch, '''
import uuid

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        name = "gpu_" + torch.cuda.get_device_name(0).replace(" ", "_")
        return load_inline(name=name, cpp_sources=SOURCE, functions=["f"]).f(x)
''')
    assert built.calls == []


def test_a_candidate_stuck_in_its_own_loop_does_not_stop_the_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(discovery, "PROBE_SECONDS", 1)
    built, _, stopped = discover(tmp_path, monkeypatch, '''
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x):
        while True:
            pass
        return load_inline(name="never_reached", cpp_sources=SOURCE, functions=["f"]).f(x)
''')
    assert names(built) == ["never_reached"]        # from the sweep: its arguments are all globals
    assert any("_ProbeTimeout" in s for s in stopped)


def test_without_a_problem_the_sweep_still_finds_written_calls(tmp_path, monkeypatch) -> None:
    built, ledger = Built(), KernelLedger()
    session = BuildSession(REAL, tmp_path / "cache", tmp_path / "build", ledger, "scope")
    session.real = built.load_inline
    monkeypatch.setattr(cpp_extension, "load_inline", session.load_inline)
    candidate = candidate_from_text(HEADER + '''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="in_init", cpp_sources=SOURCE, functions=["f"])
''')
    module = exec_source(candidate, f"specgen_candidate_{uuid.uuid4().hex[:12]}", tmp_path)
    discovery.discover(session, candidate, module, None, tmp_path)
    assert names(built) == ["in_init"]
