"""`specgen optimize` end to end: the bundled example through the actor runtime, and bad input."""
from __future__ import annotations

import contextlib
import json
import stat

import msgspec
import pytest

from specgen.cli import main
from specgen.messages import EvalOptions, OptimizeEvent, OptimizeResult
from specgen.traces.bundled import bundled_problem

from tests.optimize.chrome_trace import load_chrome_trace
from tests.optimize.conftest import PROBLEMS


def test_default_run_replays_the_bundled_trace_through_the_runtime(tmp_path, capsys) -> None:
    # The GPU host's default problem, named (a CPU-only host's default is a generated trace:
    # tests/optimize/test_first_run.py).
    out = tmp_path / "run"
    code = main(["optimize", str(PROBLEMS / "fused_elementwise.py"), "--speed", "12",
                 "--max-iterations", "1", "--trials", "2",
                 "--timing-trials", "5", "--devices", "cpu,cpu", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "No engine configured: replaying the bundled hand-written trace" in captured.err
    assert "fused_elementwise" in captured.err and "CPU timings" in captured.err
    assert "Forks: fork model 'draft'; timing: 56 tokens/s per request" in captured.err
    # The closing screen: the best kernel's file and the sequential comparison.
    assert f"Best kernel: {out / 'best_kernel.py'}" in captured.err
    assert "Sequential, same trace (virtual clock)" in captured.err and "Saved: " in captured.err

    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    assert result.mode == "specgen" and result.status == "iterations_done"
    assert result.best_speedup is not None and result.cpu_timing
    assert (out / "best_kernel.py").read_text() == result.best_source
    assert "class ModelNew" in result.best_source
    # Evaluated by the runtime's workers (named by their node), not in this process.
    workers = {c.validation.worker for c in result.candidates if c.validation is not None}
    assert workers and all(w.startswith("local0/") for w in workers)

    lines = (out / "events.jsonl").read_text().splitlines()
    events = [msgspec.json.decode(line, type=OptimizeEvent) for line in lines]
    assert events[0].kind == "job_started" and events[-1].kind == "job_finished"
    assert sum(1 for e in events if e.kind == "fork_started") == result.metrics.forks

    trace_events = load_chrome_trace(out / "timeline.json")
    spans = {e["cat"] for e in trace_events if e["ph"] == "X"}
    assert {"reasoning", "fork", "validate", "profile"} <= spans
    json.loads((out / "result.json").read_text())        # plain JSON for other tools too

    # Nobody else on the host reads the run: its folders are 0700, its files 0600, the scheduler's
    # state and its journal included.
    state = out / "journal" / "scheduler"
    for folder in (out, out / "journal", state, state / "jobs", state / "logs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for path in [out / "result.json", out / "best_kernel.py", out / "events.jsonl", out / "timeline.json",
                 out / "journal" / "run.json", state / "journal.sqlite3", *state.glob("journal.sqlite3-*"),
                 *state.glob("jobs/*/journal/*"), *state.glob("logs/*")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize("argv, words", [
    (["optimize", "--llm", "vllm"], "needs a PROBLEM.py"),
    (["optimize", str(PROBLEMS / "softmax.py"), "--llm", "vllm"], "--model"),
    (["optimize", str(PROBLEMS / "softmax.py"), "--llm", "openai", "--model", "m"],
     "--base-url, --tokenizer"),
    (["optimize", "missing_problem.py"], "missing_problem.py not found"),
    (["optimize", "--trace", "no/such/trace.json"], "no/such/trace.json not found"),
    (["optimize", str(PROBLEMS / "softmax.py")], "no bundled trace for softmax"),
    (["optimize", "--trace", str(PROBLEMS / "softmax.py"), "--llm", "vllm"], "cannot go with"),
    (["optimize", "--devices", "gpu0"], "neither cpu nor cuda:N"),
    (["optimize", "--timing-trials", "1"], "--timing-trials must be at least 2"),
    (["optimize", "--eval-timeout", "0"], "--eval-timeout must be more than 0 seconds"),
    (["optimize", "--scheduler", "tcp://127.0.0.1:9", "--trials", "3"], "--trials cannot go with --scheduler"),
    (["optimize", "--scheduler", "tcp://127.0.0.1:9", "--timing-trials", "5", "--eval-timeout", "9"],
     "--timing-trials and --eval-timeout cannot go with --scheduler"),
    (["optimize", "--max-iterations", "0"], "max_iterations must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, words, capsys, tmp_path) -> None:
    code = main(argv + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_malformed_trace_is_named(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.trace.json"
    bad.write_text('{"format": "specgen-trace", "version": 1}')
    code = main(["optimize", "--trace", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "metadata" in err


def test_a_non_empty_out_folder_is_refused_without_force(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "result.json").write_text("{}")
    code = main(["optimize", "--evaluation", "inprocess", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(out) in err and "--force" in err
    assert (out / "result.json").read_text() == "{}"          # untouched
    (tmp_path / "file").write_text("x")
    assert main(["optimize", "--out", str(tmp_path / "file")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_force_replaces_an_earlier_runs_files_and_keeps_other_files(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for name, text in (("result.json", '{"job_id": "old"}'), ("best_kernel.py", "# old kernel"),
                       ("events.jsonl", '{"old": 1}\n'), ("timeline.json", "[]"), ("notes.txt", "mine")):
        (out / name).write_text(text)
    code = main(["optimize", str(bundled_problem("fused_elementwise")), "--evaluation", "inprocess",
                 "--devices", "cpu", "--time-budget", "1",
                 "--trials", "2", "--timing-trials", "3", "--quiet", "--force", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    events = [msgspec.json.decode(line, type=OptimizeEvent)
              for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[0].kind == "job_started" and events[-1].kind == "job_finished"
    # Nothing of the earlier run is left: a best kernel only if this run found one.
    if result.best_source is None:
        assert not (out / "best_kernel.py").exists()
    else:
        assert (out / "best_kernel.py").read_text() == result.best_source
    assert (out / "timeline.json").read_text() != "[]"
    assert (out / "notes.txt").read_text() == "mine"


def test_a_killed_optimize_leaves_no_scheduler_node_worker_or_directory(tmp_path) -> None:
    """`specgen optimize` killed with SIGKILL: its embedded cluster goes with it."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.runtime.conftest import alive, descendants, wait_for

    def cmdline(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            return []

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen.cli", "optimize", str(bundled_problem("fused_elementwise")),
         "--speed", "0.02", "--max-iterations", "1",
         "--trials", "2", "--timing-trials", "3", "--devices", "cpu", "--quiet", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        def cluster_up():
            # The loop started (its first event is written once the backend is up).
            if not (out / "events.jsonl").exists() or not (out / "events.jsonl").read_text():
                return None
            pids = descendants(proc.pid)
            modules = {pid: cmdline(pid) for pid in pids}
            kinds = {m for argv in modules.values() for m in argv if m.startswith("specgen.runtime.")}
            if not {"specgen.runtime.scheduler", "specgen.runtime.node", "specgen.runtime.worker"} <= kinds:
                return None
            return pids, modules

        pids, modules = wait_for(cluster_up, 180, "the embedded cluster to start", interval=0.2)
        [scheduler_argv] = [a for a in modules.values() if "specgen.runtime.scheduler" in a]
        tmp = Path(scheduler_argv[scheduler_argv.index("--remove-if-orphaned") + 1])
        assert tmp.name.startswith("specgen-local-") and tmp.is_dir()
        # The scheduler's journal is the run's (for --resume), not the cluster's temporary one.
        state = Path(scheduler_argv[scheduler_argv.index("--state-dir") + 1])
        assert state == out / "journal" / "scheduler"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        started = time.monotonic()
        wait_for(lambda: not alive(pids), 30, "the scheduler, node and workers to exit")
        wait_for(lambda: not tmp.exists(), 30, f"{tmp} to be removed")
        assert time.monotonic() - started < 30
        assert (state / "journal.sqlite3").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Captured(Exception):
    pass


def _capture_connect(monkeypatch, seen: dict, submitted: list) -> None:
    """`connect` records what the run asks of its scheduler, and the JobSpec it submits."""
    from specgen.runtime import connect as connect_module

    class Cluster:
        where, failure, kv_control_endpoint = "a captured scheduler", None, None

        class client:   # noqa: N801 - stands where the Client is
            @staticmethod
            def submit(spec):
                submitted.append(spec)
                raise _Captured

    @contextlib.asynccontextmanager
    async def capture(kind, **kwargs):
        seen.update(kind=kind, **kwargs)
        yield Cluster()

    monkeypatch.setattr(connect_module, "connect", capture)


@pytest.mark.parametrize("evaluation", ["runtime", "inprocess"])
def test_evaluation_flags_reach_the_evaluation_options(evaluation: str, tmp_path, monkeypatch) -> None:
    # What the cluster's workers are built with (runtime/worker.py build_evaluator reads the
    # settings' eval_options), on both local kinds, under the options' own names.
    seen: dict = {}
    _capture_connect(monkeypatch, seen, [])
    with pytest.raises(_Captured):
        main(["optimize", "--evaluation", evaluation, "--devices", "cpu", "--trials", "3",
              "--timing-trials", "7", "--eval-timeout", "42", "--quiet", "--out", str(tmp_path / "o")])
    assert seen["kind"] == ("local" if evaluation == "runtime" else "inprocess")
    assert seen["settings"].eval_options == EvalOptions(trials=3, timing_trials=7, timeout_s=42.0)


def test_an_inprocess_clusters_workers_take_the_evaluation_options() -> None:
    from specgen.runtime.connect import cluster_settings
    from specgen.runtime.inprocess import InProcessCluster

    settings = cluster_settings(True, {"trials": 3, "timing_trials": 7, "timeout_s": 42.0}, ["spare_processes=0"])
    with InProcessCluster(["cpu"], settings=settings) as cluster:
        (worker,) = cluster._owned
        assert (worker.options.trials, worker.options.timing_trials, worker.options.timeout_s) == (3, 7, 42.0)


@pytest.mark.parametrize("where", [["--evaluation", "runtime"], ["--evaluation", "inprocess"],
                                   ["--scheduler", "tcp://127.0.0.1:9"]])
def test_the_time_budget_is_the_scheduler_jobs_wall_time(where, tmp_path, monkeypatch) -> None:
    # Every kind of scheduler backs the loop's budget with its own deadline (the job's wall time).
    submitted: list = []
    _capture_connect(monkeypatch, {}, submitted)
    with pytest.raises(_Captured):
        main(["optimize", *where, "--time-budget", "90", "--quiet", "--out", str(tmp_path / "o")])
    assert submitted[0].wall_time_s == 90.0 and "time_budget_s" not in submitted[0].options
    from specgen.optimize.job import JobConfig

    assert JobConfig.from_job(submitted[0]).optimize.time_budget_s == 90.0   # what the loop enforces

