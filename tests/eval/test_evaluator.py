"""EvalWorker: isolation (crash, hang, memory, exit), cancel, spares, stages, caches, bad input,
runners that send what the judge cannot handle, push descriptors or flood their log."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.eval import EvalOptions, EvalWorker, evaluator
from tests.eval.conftest import BUNDLED, HERE, codes, concealed, submission

GOOD = (BUNDLED / "candidates" / "softmax_torch.py").read_text()


def forward_body(body: str, imports: str = "") -> str:
    return (f"import torch\n{imports}\nclass ModelNew(torch.nn.Module):\n"
            f"    def forward(self, x):\n        {body}\n")


@pytest.fixture(scope="module")
def strict_worker(tmp_path_factory: pytest.TempPathFactory) -> EvalWorker:
    """Short timeout and a small memory cap, for the limit tests."""
    options = EvalOptions(timeout_s=4.0, memory_limit_mb=400, timing_trials=4, warmup=1)
    worker = EvalWorker("cpu", tmp_path_factory.mktemp("strict"), spare_processes=1,
                        options=options)
    worker.start()
    yield worker
    worker.close()


def test_a_crash_costs_only_that_candidate(cpu_worker: EvalWorker) -> None:
    crash = forward_body(concealed("import ctypes; ctypes.string_at(0)"))
    verdict = cpu_worker.run(submission("softmax", crash), "validate")
    assert not verdict.correct and "the candidate runner died (killed by signal SIGSEGV)" in \
        verdict.error
    abort = forward_body("os.abort()", "import os")
    assert "SIGABRT" in cpu_worker.run(submission("softmax", abort), "validate").error
    after = cpu_worker.run(submission("softmax", GOOD), "validate")
    assert after.correct, after


def test_exits_are_contained(cpu_worker: EvalWorker) -> None:
    hard = cpu_worker.run(submission("softmax", forward_body(concealed("import os; os._exit(0)"))))
    assert "the candidate runner died (exit code 0)" in hard.error
    soft = cpu_worker.run(submission("softmax", forward_body("sys.exit(3)", "import sys")))
    assert "ModelNew raised: SystemExit: 3 (trial 0)" in soft.error


def test_a_hang_times_out_naming_the_setting(strict_worker: EvalWorker) -> None:
    began = time.monotonic()
    verdict = strict_worker.run(submission("softmax", forward_body("time.sleep(600)",
                                                                   "import time")))
    assert verdict.error == "candidate timed out (EvalOptions.timeout_s = 4 s)" and verdict.code == "timeout"
    assert time.monotonic() - began < 30
    assert strict_worker.run(submission("softmax", GOOD), "validate").correct


def test_memory_blowup_is_capped(strict_worker: EvalWorker) -> None:
    big = forward_body("return torch.ones(2_000_000_000)")
    verdict = strict_worker.run(submission("softmax", big), "validate")
    assert not verdict.correct and "EvalOptions.memory_limit_mb" in verdict.error


def test_cancel_kills_the_running_candidate(strict_worker: EvalWorker) -> None:
    hang = forward_body("time.sleep(600)", "import time")
    timer = threading.Timer(1.0, strict_worker.cancel)
    timer.start()
    began = time.monotonic()
    verdict = strict_worker.run(submission("softmax", hang))
    timer.join()
    assert verdict.error == "cancelled" and verdict.code == "cancelled" and time.monotonic() - began < 3.5
    assert strict_worker.run(submission("softmax", GOOD), "validate").correct


def test_a_cancel_by_id_that_comes_before_the_run_is_not_lost(strict_worker: EvalWorker) -> None:
    # A caller hands work over on one thread while a cancel for it arrives on another: the
    # cancel may land before run() begins, and must still apply to that run and no other.
    strict_worker.cancel("job-a/c1/validate")
    began = time.monotonic()
    verdict = strict_worker.run(submission("softmax", GOOD), "validate", run_id="job-a/c1/validate")
    assert verdict.error == "cancelled" and verdict.code == "cancelled" and time.monotonic() - began < 3.5
    assert strict_worker.run(submission("softmax", GOOD), "validate", run_id="job-a/c2/validate").correct


def test_spares_take_start_up_off_the_critical_path(tmp_path: Path) -> None:
    options = EvalOptions(timing_trials=4, warmup=1)
    with EvalWorker("cpu", tmp_path / "spares", spare_processes=1, options=options) as warm:
        warm._pool._spares[0][1].join(60)          # its warm-up thread saw it ready
        pids = [runner.init_pid for runner, _ in warm._pool._spares]
        first = warm.run(submission("softmax", GOOD), "validate")
        assert first.correct and first.stage_seconds["spare_wait"] < 0.2
        warm._pool._spares[0][1].join(60)          # its warm-up thread saw it ready
        replacement = [runner.init_pid for runner, _ in warm._pool._spares]
        assert replacement and replacement[0] not in pids  # each runner serves one candidate
    for pid in pids + replacement:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    with EvalWorker("cpu", tmp_path / "cold", spare_processes=0, options=options) as cold:
        verdict = cold.run(submission("softmax", GOOD), "validate")
        # Without a spare, the runner is a fork of the template started on demand: no
        # interpreter start, no torch import, so well under a second even then.
        assert verdict.correct and verdict.stage_seconds["spare_wait"] < 2.0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def test_stages_and_the_reference_timing_cache(cpu_worker: EvalWorker) -> None:
    validate = cpu_worker.run(submission("layernorm", (BUNDLED / "candidates" /
                                                       "layernorm_torch.py").read_text()),
                              "validate")
    assert validate.stage == "validate" and validate.correct and validate.candidate_ms is None
    sub = submission("layernorm", (BUNDLED / "candidates" / "layernorm_triton.py").read_text())
    first = cpu_worker.run(sub, "profile")
    second = cpu_worker.run(sub, "profile")
    assert first.stage == "profile" and first.correct and first.candidate_ms > 0
    # The reference's time comes from the cache (floored at this run's resolution, which is
    # measured anew each run).
    assert second.ref_cached and second.ref_ms > 0 or first.ref_cached
    assert second.cpu_timing and "timing" in second.stage_seconds


def test_bad_problem_source_is_a_verdict_error(cpu_worker: EvalWorker) -> None:
    sub = submission("softmax", GOOD)
    broken = sub.__class__(**{**{f: getattr(sub, f) for f in sub.__struct_fields__},
                              "problem_source": "class Model(:\n"})
    verdict = cpu_worker.run(broken)
    assert verdict.error.startswith("problem source: problem <string>: syntax error")
    raising = (BUNDLED / "softmax.py").read_text().replace(
        "    x = torch.randn(batch_size, dim)", "    raise ValueError('no inputs today')")
    bad_inputs = sub.__class__(**{**{f: getattr(sub, f) for f in sub.__struct_fields__},
                                  "problem_source": raising})
    verdict = cpu_worker.run(bad_inputs)
    assert "get_inputs() raised ValueError: no inputs today" in verdict.error
    no_model_new = cpu_worker.run(submission("softmax", "import torch\n"))
    assert no_model_new.error.startswith("candidate source:") and not no_model_new.compiled


def test_extensions_build_apart_and_come_from_the_cache(cpu_worker: EvalWorker) -> None:
    source = (HERE / "honest" / "cpp_extension_elementwise.py").read_text()
    first = cpu_worker.run(submission("fused_elementwise", source), "validate")
    second = cpu_worker.run(submission("fused_elementwise", source), "validate")
    assert first.correct and second.correct, (first, second)
    assert second.stage_seconds["build"] == 0.0  # the library came from the shared cache
    # <cache>/ext/<candidate source hash>/<arguments hash>/<name>.so
    libraries = list((cpu_worker.cache_dir / "ext").glob("*/*/fused_gelu_sigmoid_cpu.so"))
    assert len(libraries) == 1
    # A failed build is cached too: it is not compiled again by the runner.
    never = (HERE / "redteam" / "never_built_extension.py").read_text()
    verdict = cpu_worker.run(submission("softmax", never), "validate")
    assert "custom-kernel-not-run" in codes(verdict)
    assert list((cpu_worker.cache_dir / "ext").glob("*/*/FAILED"))


def test_noisy_candidates_do_not_break_the_protocol(cpu_worker: EvalWorker) -> None:
    noisy = forward_body("print('x' * 100000); sys.stdout.write('\\0\\1' * 1000)\n"
                         "        return torch.softmax(x, dim=-1)", "import sys")
    verdict = cpu_worker.run(submission("softmax", noisy), "validate")
    assert verdict.correct, verdict


def test_workers_sharing_a_gpu_split_its_memory(tmp_path) -> None:
    """Four workers on one GPU: each runner's allocator may take a quarter of what one alone may,
    so that a candidate hoarding device memory runs out of its own share, not its neighbours'."""
    alone = EvalWorker("cuda:0", tmp_path / "a")
    shared = EvalWorker("cuda:0", tmp_path / "b", gpu_sharers=4)
    assert shared.options.gpu_memory_fraction == pytest.approx(alone.options.gpu_memory_fraction / 4)
    with pytest.raises(UsageError, match="gpu_sharers"):
        EvalWorker("cuda:0", tmp_path / "c", gpu_sharers=0)


# ---------------------------------------------------------------------- a runner that is hostile

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or _zombie(pid)


def test_an_exception_while_judging_fails_that_candidate_only(
        cpu_worker: EvalWorker, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Whatever raises while a candidate is judged (here a part of the judge, as a reply's
    # impossible size made ftruncate raise OverflowError) ends as that candidate's verdict:
    # on a cluster the exception killed the worker process, again and again.
    assert cpu_worker.run(submission("softmax", GOOD), "validate").correct
    before = open_fds()
    seen: list[int] = []

    def raising(judge, stage):
        seen.extend(r.init_pid for r in cpu_worker._current)
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(evaluator.Judge, "run", raising)
    with caplog.at_level(logging.ERROR, logger="specgen.eval.evaluator"):
        verdict = cpu_worker.run(submission("softmax", GOOD, "victim"), "validate")
    monkeypatch.undo()
    assert verdict.code == "candidate" and not verdict.correct
    assert "OverflowError: Python int too large" in verdict.error
    assert verdict.stage == "validate" and verdict.sandbox == cpu_worker.sandbox_status.kind
    logged = [r for r in caplog.records if "victim" in r.getMessage()]
    assert logged and logged[0].exc_info is not None          # the traceback, in the worker's log
    assert len(seen) == 2 and all(_gone(pid) for pid in seen)  # its runner and the reference's
    after = cpu_worker.run(submission("softmax", GOOD), "validate")
    assert after.correct and after.code == "" and after.error is None, after
    assert open_fds() == before


HUGE_SIZE = '''import torch
import torch.nn as nn
from specgen.eval import protocol

_send = protocol.Channel.send


def _send_huge(self, message, fds=()):
    # Claims every output tensor is 2**63 - 1 bytes long.
    for meta in getattr(message, "outputs", None) or []:
        if getattr(meta, "kind", "") == "tensor":
            meta.nbytes = 2**63 - 1
    return _send(self, message, fds)


protocol.Channel.send = _send_huge


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
'''


def test_a_reply_claiming_an_impossible_size_is_a_verdict_not_a_crash(cpu_worker: EvalWorker) -> None:
    # Found sizing a shared buffer from the claim (OverflowError out of EvalWorker.run). A judge
    # that no longer trusts the claim ignores it; one that trips on it fails the candidate.
    verdict = cpu_worker.run(submission("softmax", HUGE_SIZE), "validate")
    assert verdict.code in ("candidate", ""), verdict
    if verdict.code == "candidate":
        assert not verdict.correct and "OverflowError" in verdict.error, verdict
    assert cpu_worker.run(submission("softmax", GOOD), "validate").correct


PUSHES_DESCRIPTORS = '''import torch
import torch.nn as nn
from specgen.eval import protocol

_send = protocol.Channel.send


def _send_more(self, message, fds=()):
    # Four descriptors with every reply (the most one packet may carry).
    return _send(self, message, tuple(fds) or (0, 1, 2, 1))


protocol.Channel.send = _send_more


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
'''


def test_descriptors_a_runner_sends_are_not_kept(cpu_worker: EvalWorker) -> None:
    assert cpu_worker.run(submission("softmax", GOOD), "full").correct
    before = open_fds()
    verdict = cpu_worker.run(submission("softmax", PUSHES_DESCRIPTORS), "full")
    assert verdict.correct, verdict
    assert open_fds() == before


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


FLOOD = '''import os
import torch
import torch.nn as nn

_done = []


def _flood():
    # 1 GiB to stdout, once; writes past the log's cap fail and are ignored.
    line = b"flood " * 174762 + b"\\n"
    for _ in range(1024):
        try:
            os.write(1, line)
        except OSError:
            pass
    _done.append(1)


class ModelNew(nn.Module):
    def forward(self, x):
        if not _done:
            _flood()
            EXIT
        return torch.softmax(x, dim=-1)
'''


def test_a_runner_writing_a_gigabyte_grows_no_disk_and_still_answers(cpu_worker: EvalWorker) -> None:
    from specgen.eval.runner_process import LOG_CAP

    cpu_worker.run(submission("softmax", GOOD), "validate")
    before = _disk_bytes(cpu_worker.work_dir)
    began = time.monotonic()
    verdict = cpu_worker.run(submission("softmax", FLOOD.replace("EXIT", "pass")), "validate")
    assert verdict.correct, verdict                 # its writes failed; it went on
    assert time.monotonic() - began < 60
    assert _disk_bytes(cpu_worker.work_dir) - before < LOG_CAP
    died = cpu_worker.run(submission("softmax", FLOOD.replace("EXIT", "os._exit(3)")), "validate")
    assert "the candidate runner died (exit code 3)" in died.error
    assert "flood flood" in died.error and "the log reached its cap of 8 MiB" in died.error
    assert _disk_bytes(cpu_worker.work_dir) - before < LOG_CAP


def test_a_runners_last_words_reach_the_verdict(cpu_worker: EvalWorker) -> None:
    last = forward_body("sys.stderr.write('my last words\\\\n'); sys.stderr.flush(); os._exit(3)",
                        "import os, sys")
    verdict = cpu_worker.run(submission("softmax", last), "validate")
    assert "exit code 3" in verdict.error and "my last words" in verdict.error, verdict.error
