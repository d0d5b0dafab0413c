"""The bundled candidate library: for every bundled problem, honest candidates in each language
and a wrong, a slow and a cheating one, each judged on the CPU as its headers say.

Layout (strict, so that a generator can pick candidates by problem, kind and language):

* `candidates/<problem>_<lang>.py`: honest, `lang` one of torch, triton, cuda, cpp;
* `candidates/<kind>/<problem>_<kind>.py`: `kind` one of wrong, slow, cheat (kept out of the
  folder above, whose every file is an honest candidate for the other suites);
* every file starts with `# problem:`, `# kind:` and `# lang:` headers; a cheat also has an
  `# expect:` header, as in `redteam/` (tests/eval/expectations.py);
* `index.json` lists the problems (with the kind named in each problem's docstring,
  `Kind: <kind>.`) and every candidate with its headers and path.

On the CPU: `_torch` and `_triton` (interpreted, small sizes) candidates validate, every `_cpp`
one validates and is profiled (stage "full": the speedup over eager PyTorch is reported), every
`wrong` one is incorrect without a cheat flag, every `slow` one is correct and slower than the
reference, every `cheat` one meets its `# expect:` header (a trick that cannot gain anything
against the judge, such as a side stream the judge's digest waits for, is `honest-speed`). `_cuda` candidates are only
loaded here; `test_honest_candidates_on_gpu` validates and times them (with the Triton and
PyTorch ones, full sizes) on a GPU.
"""
from __future__ import annotations

import ast
import json
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from specgen.eval import FLAG_CODES, EvalOptions, EvalWorker, flag_code, load_candidate, load_problem
from tests.eval.conftest import BUNDLED, codes, header, submission
from tests.eval.expectations import meets
from tests.eval.test_problems import NAMES

LIBRARY = BUNDLED / "candidates"
INDEX = BUNDLED / "index.json"
LANGS = ("torch", "triton", "cuda", "cpp")
OTHER_KINDS = ("wrong", "slow", "cheat")
KINDS = ("honest",) + OTHER_KINDS
# Problem kinds (the `Kind:` line of each problem's docstring).
PROBLEM_KINDS = ("elementwise", "reduction", "softmax", "normalization", "matmul", "mlp", "conv",
                 "attention")


def expected_path(problem: str, kind: str, lang: str) -> Path:
    if kind == "honest":
        return LIBRARY / f"{problem}_{lang}.py"
    return LIBRARY / kind / f"{problem}_{kind}.py"


def library() -> list[Path]:
    return sorted(LIBRARY.rglob("*.py"))


def of(kind: str, lang: str | None = None) -> list[Path]:
    return [p for p in library() if header(p, "kind") == kind
            and (lang is None or header(p, "lang") == lang)]


def problem_kind(name: str) -> str | None:
    match = re.search(r"^Kind: (\w+)", ast.get_docstring(ast.parse((BUNDLED / f"{name}.py")
                                                                    .read_text())) or "",
                      flags=re.MULTILINE)
    return match.group(1) if match else None


def build_index() -> dict:
    """What `index.json` must say, from the problems' docstrings and the candidates' headers."""
    candidates = []
    for path in library():
        entry = {key: header(path, key) for key in ("problem", "kind", "lang")}
        entry["path"] = path.relative_to(BUNDLED).as_posix()
        if header(path, "expect"):
            entry["expect"] = header(path, "expect")
        candidates.append(entry)
    candidates.sort(key=lambda e: (e["problem"], e["path"]))
    return {"format": "specgen-problem-index", "version": 1,
            "problems": {name: {"kind": problem_kind(name), "path": f"{name}.py"} for name in NAMES},
            "candidates": candidates}


def _id(path: Path) -> str:
    return path.stem


# ---------------------------------------------------------------------------- layout, statically

def test_every_problem_has_the_whole_library() -> None:
    expected = set()
    for name in NAMES:
        expected |= {expected_path(name, "honest", lang) for lang in LANGS}
        expected |= {expected_path(name, kind, "") for kind in OTHER_KINDS}
    assert set(library()) == expected


@pytest.mark.parametrize("path", library(), ids=_id)
def test_candidate_headers_are_regular(path: Path) -> None:
    problem, kind, lang = (header(path, key) for key in ("problem", "kind", "lang"))
    assert problem in NAMES and kind in KINDS and lang in LANGS, path
    assert path == expected_path(problem, kind, lang)
    # the headers are the file's first lines
    lines = path.read_text().splitlines()
    assert lines[:3] == [f"# problem: {problem}", f"# kind: {kind}", f"# lang: {lang}"]
    expect = header(path, "expect")
    if kind == "cheat":
        assert lines[3] == f"# expect: {expect}"
        assert expect.startswith(("error:", "honest-speed ")) or expect in [*FLAG_CODES, "reject"]
    else:
        assert expect is None


def test_problem_docstrings_name_their_kind() -> None:
    kinds = {name: problem_kind(name) for name in NAMES}
    assert all(kind in PROBLEM_KINDS for kind in kinds.values()), kinds
    assert len(set(kinds.values())) == len(NAMES), kinds  # one problem of each kind


def test_index_lists_every_problem_and_candidate() -> None:
    assert json.loads(INDEX.read_text()) == build_index(), (
        "index.json is stale; it must be:\n" + json.dumps(build_index(), indent=1))


@pytest.mark.parametrize("path", library(), ids=_id)
def test_every_candidate_loads(path: Path) -> None:
    problem = load_problem(BUNDLED / f"{header(path, 'problem')}.py")
    candidate = load_candidate(path, problem)
    lang = header(path, "lang")
    expected = {"torch": (), "triton": ("triton",), "cuda": ("extension",),
                "cpp": ("extension",)}[lang]
    assert candidate.kernel_kinds == expected, path
    if lang == "cpp":
        # C++ CPU candidates: cpp_sources only, the library's common flags
        assert "cuda_sources" not in candidate.text
        assert '["-O3", "-fopenmp", "-march=native"]' in candidate.text
        assert 'extra_ldflags=["-fopenmp"]' in candidate.text


# ---------------------------------------------------------------------------- on the CPU

_BUILDS: list[Future] = []


@pytest.fixture(scope="module")
def worker(cpu_worker: EvalWorker) -> EvalWorker:
    """The session's CPU worker (its build cache is shared with the other suites), with every C++
    candidate's build started at once, two at a time on background threads (about a minute
    each here) while the untimed tests run; a run that needs one of them waits for it."""
    sources = [p for p in library() if header(p, "lang") == "cpp"]
    sources.sort(key=lambda p: header(p, "kind") == "honest")  # the one a validate test needs first
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="library-build")
    _BUILDS[:] = [pool.submit(cpu_worker.build, p.read_text()) for p in sources]
    yield cpu_worker
    for build in _BUILDS:
        build.cancel()
    pool.shutdown(wait=True)


@pytest.fixture
def quiet_worker(worker: EvalWorker) -> EvalWorker:
    """The worker once no build runs beside it: timings (the reference's is measured once per
    problem and cached) are taken on an otherwise idle CPU."""
    for build in _BUILDS:
        if not build.cancelled():
            build.result(timeout=1800)
    return worker


def evaluate(worker: EvalWorker, path: Path, stage: str):
    return worker.run(submission(header(path, "problem"), path.read_text(), path.stem), stage)


def why(verdict) -> str:
    """The parts of a verdict that say what happened (its repr cuts the error short)."""
    return (f"correct={verdict.correct} compiled={verdict.compiled} error={verdict.error!r} "
            f"flags={verdict.flags} notes={verdict.notes} speedup={verdict.speedup}")


@pytest.mark.parametrize("path", of("honest", "torch") + of("honest", "triton"), ids=_id)
def test_honest_torch_and_triton_validate(worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(worker, path, "validate")
    assert verdict.correct and verdict.flags == [] and verdict.error is None, why(verdict)
    assert verdict.max_abs_error is not None and verdict.max_abs_error < 1e-3


def _timed_cheat(path: Path) -> bool:
    return header(path, "expect").startswith("honest-speed")


@pytest.mark.parametrize("path", [p for p in of("cheat") if not _timed_cheat(p)], ids=_id)
def test_cheat_meets_its_expectation(worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(worker, path, "validate")
    ok, why_not = meets(verdict, header(path, "expect"))
    assert ok, f"{why_not}: {why(verdict)}"


@pytest.mark.parametrize("path", [p for p in of("cheat") if _timed_cheat(p)], ids=_id)
def test_timed_cheat_gains_no_more_than_its_honest_speed(quiet_worker: EvalWorker,
                                                         path: Path) -> None:
    # Timed on an idle CPU (no build beside it): a speedup bound says nothing on a host whose
    # load changes by milliseconds between the reference's calls and the candidate's.
    verdict = evaluate(quiet_worker, path, "full")
    ok, why_not = meets(verdict, header(path, "expect"))
    assert ok, f"{why_not}: {why(verdict)}"


@pytest.mark.parametrize("path", of("wrong"), ids=_id)
def test_wrong_candidate_is_incorrect(worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(worker, path, "validate")
    # it ran and its output did not match: an error, and no cheat flag (merely wrong)
    assert verdict.compiled and not verdict.correct, why(verdict)
    assert verdict.error is not None and "mismatch" in verdict.error, why(verdict)
    assert verdict.flags == [], why(verdict)


@pytest.mark.parametrize("path", of("slow"), ids=_id)
def test_slow_candidate_is_correct_and_slower(quiet_worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(quiet_worker, path, "full")
    assert verdict.correct and verdict.flags == [] and verdict.error is None, why(verdict)
    assert verdict.cpu_timing and verdict.speedup is not None, why(verdict)
    # Never reported faster; slower unless both times are within the judge's resolution here
    # (a loaded CPU's calls of nothing can spread by milliseconds).
    floored = any("at or below what the judge resolves" in n for n in verdict.notes)
    assert verdict.speedup <= 1.0 if floored else verdict.speedup < 1.0, why(verdict)


@pytest.mark.parametrize("path", of("honest", "cpp"), ids=_id)
def test_cpp_candidate_is_correct_and_timed(quiet_worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(quiet_worker, path, "full")
    assert verdict.correct and verdict.flags == [] and verdict.error is None, why(verdict)
    assert verdict.compiled and verdict.device == "cpu" and verdict.cpu_timing
    assert verdict.max_abs_error is not None and verdict.max_abs_error < 1e-3
    assert verdict.candidate_ms and verdict.ref_ms and verdict.speedup, why(verdict)
    print(f"{path.stem}: {verdict.ref_ms:.4f} ms eager, {verdict.candidate_ms:.4f} ms C++, "
          f"{verdict.speedup:.2f}x")


# ---------------------------------------------------------------------------- on a GPU

def _gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A shared cache (e.g. one a benchmark fills at the same time) can be named from outside.
    return os.environ.get("SPECGEN_TEST_EVAL_CACHE") or str(tmp_path_factory.mktemp("lib-gpu"))


@pytest.fixture(scope="module")
def gpu_worker(tmp_path_factory: pytest.TempPathFactory) -> EvalWorker:
    """KernelBench-sized problems; the CUDA candidates' nvcc builds started at once, in parallel."""
    worker = EvalWorker("cuda:0", tmp_path_factory.mktemp("lib-gpu-work"), spare_processes=2,
                        options=EvalOptions(cache_dir=_gpu_cache(tmp_path_factory), timeout_s=300))
    worker.start()
    builders = [threading.Thread(target=worker.build, args=(p.read_text(),), daemon=True)
                for p in of("honest", "cuda")]
    for thread in builders:
        thread.start()
    yield worker
    for thread in builders:
        thread.join(timeout=900)
    worker.close()


@pytest.mark.gpu
@pytest.mark.parametrize("path", of("honest", "cuda") + of("honest", "triton") + of("honest", "torch"),
                         ids=_id)
def test_honest_candidates_on_gpu(gpu_worker: EvalWorker, path: Path) -> None:
    verdict = evaluate(gpu_worker, path, "full")
    assert verdict.correct and verdict.flags == [] and verdict.error is None, why(verdict)
    assert verdict.device == "cuda:0" and not verdict.cpu_timing
    assert verdict.candidate_ms and verdict.ref_ms and verdict.speedup, why(verdict)
    print(f"{path.stem}: {verdict.ref_ms:.4f} ms reference, {verdict.candidate_ms:.4f} ms, "
          f"{verdict.speedup:.2f}x")
