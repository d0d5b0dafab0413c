"""The simulator drives the real scheduler core on a virtual clock: small, seeded, fast runs."""
from __future__ import annotations

import json

from specgen.simulate.model import ServiceTimes
from specgen.simulate.workload import build, split_gpus

PROBLEMS = ["attention", "conv2d_bias_relu"]


def service(validate: float = 4.0, profile: float = 2.0) -> ServiceTimes:
    return ServiceTimes(
        durations={p: {"validate": [validate, validate * 1.5], "profile": [profile, profile * 2]}
                   for p in PROBLEMS},
        speedups={"attention": [0.9, 1.2, 1.6]}, source="test")


def run(seed: int = 3, **kw):
    sim = build(8, 3, kw.pop("times", service()), hours=kw.pop("hours", 0.25), seed=seed,
                problems=PROBLEMS, **kw)
    return sim, sim.run()


def test_split() -> None:
    assert split_gpus(64, 0.25) == (16, 6)
    assert split_gpus(8, eval_gpus=3) == (3, 1)


def test_same_seed_same_results() -> None:
    _, a = run(seed=5)
    _, b = run(seed=5)
    for r in (a, b):
        r.pop("real_s"), r.pop("decision_time_s")
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    _, c = run(seed=6)
    c.pop("real_s"), c.pop("decision_time_s")
    assert json.dumps(c, sort_keys=True, default=str) != json.dumps(a, sort_keys=True, default=str)


def test_conservation_and_bounds() -> None:
    sim, r = run()
    assert r["jobs_finished"] > 0 and r["counts"]["submitted"] > 0
    # No stage of a candidate ran twice; every candidate got exactly one final answer
    # (rejected at validation, profiled, or cancelled when its job ended) unless still in flight.
    assert set(sim.verdicts.values()) == {1}
    for job in sim.done_jobs:
        for cid, c in job.candidates.items():
            assert c.get("final_updates", 0) == 1, (job.id, cid, c)
    in_flight = {(w.submission.job_id, w.submission.candidate_id) for w, *_ in sim.assignments.values()}
    for job in sim.jobs.values():
        for cid, c in job.candidates.items():
            assert c.get("final_updates", 0) <= 1
    # Every assignment the core made was answered by its worker, or is still running.
    assert r["counts"]["assigned"] == r["counts"]["verdicts"] + len(sim.assignments)
    assert r["counts"]["assigned"] == sum(sim.verdicts.values()) + len(in_flight)
    u = r["utilization"]
    for key in ("all", "validate_core", "profile_core"):
        assert 0.0 <= u[key] <= 1.0
    assert 0 <= r["feedback_latency_s"]["p50"] <= r["feedback_latency_s"]["p95"]
    assert r["decision_time_s"]["calls"] > 0


def test_pool_split_follows_the_load() -> None:
    """The core's elastic policy moves workers toward the pool with the load: validation-heavy
    service times for the first half hour, profiling-heavy ones after; while there is work, the
    validation pool is larger in the first half than in the second."""
    sim = build(8, 6, service(validate=40.0, profile=1.0), hours=1.0, seed=3, problems=PROBLEMS)
    sim.clock.call_at(1800.0, lambda: setattr(sim, "service", service(validate=1.0, profile=40.0)))
    r = sim.run()

    def validators(rows: list[dict]) -> float:
        rows = [row for row in rows if row["validate_busy"] + row["profile_busy"]]
        return sum(row["validate_workers"] for row in rows) / len(rows)

    first = validators([row for row in r["samples"] if row["t"] < 1800.0])
    second = validators([row for row in r["samples"] if row["t"] >= 1800.0])
    assert r["reassignments"] > 0
    assert first > 2.5 and first > second + 0.5      # of 4 workers


def test_static_pools_do_not_move() -> None:
    _, r = run(elastic=False)
    assert r["reassignments"] == 0
    assert {row["validate_workers"] for row in r["samples"]} == {2}


def _bench_file(tmp_path) -> str:
    evaluations = lambda v, p: [  # noqa: E731
        {"stage": "validate", "started_at": 10.0, "finished_at": 10.0 + v, "correct": True,
         "speedup": None, "stage_seconds": {"compile": v / 2}},
        {"stage": "profile", "started_at": 20.0, "finished_at": 20.0 + p, "correct": True,
         "speedup": 1.4, "stage_seconds": {}}]
    data = {"config": {"problems": [{"name": p, "turns": 1} for p in PROBLEMS]},
            "intervals": [{"mode": "specgen", "problem": p, "batch": 0, "intervals": [],
                           "evaluations": evaluations(3.0, 1.5)} for p in PROBLEMS]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_service_times_from_bench(tmp_path) -> None:
    times = ServiceTimes.from_bench(_bench_file(tmp_path))
    assert times.durations["attention"] == {"validate": [3.0], "profile": [1.5]}
    assert times.speedups["attention"] == [1.4] and times.compile_s["attention"] == [1.5]


def _runner_bench(tmp_path) -> ServiceTimes:
    """One worker's takes: a program rejected before running (no runner), then runners taken at
    10 s (spare ready), 12 s (waited 5 s: the replacement started at 10 s took 7 s), 30 s (no wait,
    only a bound), and a profile that timed the reference first."""
    def ev(stage, start, end, program, seconds):
        return {"stage": stage, "started_at": start, "finished_at": end, "correct": True, "speedup": 1.2,
                "program": program, "worker": "w0", "stage_seconds": seconds}

    evaluations = [ev("validate", 1.0, 1.001, "rejected", {"total": 0.001}),
                   ev("validate", 10.0, 11.0, "p1", {"spare_wait": 0.0}),
                   ev("validate", 12.0, 18.0, "p2", {"spare_wait": 5.0}),
                   ev("validate", 30.0, 31.0, "p2", {"spare_wait": 0.0}),
                   ev("profile", 40.0, 50.0, "p1", {"spare_wait": 7.0, "reference": 0.5})]
    data = {"intervals": [{"mode": "specgen", "problem": "attention", "batch": 0, "evaluations": evaluations}]}
    path = tmp_path / "runners.json"
    path.write_text(json.dumps(data))
    return ServiceTimes.from_bench(path)


def test_runner_waits_and_start_up_from_bench(tmp_path) -> None:
    import random

    times = _runner_bench(tmp_path)
    # Start-up from the take that waited only; the pair with a reference timing is left out.
    assert times.runner_startup_s == [7.0]
    # Durations per program, without the wait for a runner.
    assert times.program_durations["p2"]["validate"] == [1.0, 1.0]
    assert times.program_durations["p1"]["profile"] == [3.0]
    rng = random.Random(0)
    assert times.sample("attention", "validate", rng, "p2") == 1.0
    assert times.runners_taken("attention", "validate", "rejected", rng) == 0
    assert times.runners_taken("attention", "validate", "p1", rng) == 1
    assert times.runners_taken("attention", "profile", "p1", rng) == 2   # every profile timed the reference


def test_a_worker_waits_for_its_spare_runner() -> None:
    """Two runs back to back on one worker: the second waits for the replacement runner the
    first started (EvalWorker keeps one spare); with no start-up measured, nothing waits."""
    slow = service(validate=1.0)
    slow.durations = {p: {"validate": [1.0], "profile": [1.0]} for p in PROBLEMS}
    quick = ServiceTimes(durations=slow.durations, speedups=slow.speedups, source="test")
    slow.runner_startup_s = [30.0]
    slow.takes_runner = {p: [True] for p in PROBLEMS}
    quick.takes_runner = slow.takes_runner
    _, with_waits = run(times=slow, hours=0.1, eval_gpus=1)
    _, without = run(times=quick, hours=0.1, eval_gpus=1)
    busy = lambda r: sum(r["busy_s"].values())  # noqa: E731
    assert busy(with_waits) > busy(without)
    assert with_waits["feedback_latency_s"]["p50"] > without["feedback_latency_s"]["p50"]


def test_measured_verdicts_override_the_library_labels(tmp_path) -> None:
    """A kernel labelled honest that failed its validations in the measured run is incorrect in
    the simulation (and one labelled wrong that passed is correct)."""
    from specgen.optimize.dedup import fingerprint
    from specgen.simulate.model import Correctness
    from specgen.traces.synthetic import CandidateLibrary

    library = CandidateLibrary.load()
    honest = next(c for c in library.candidates if c.kind == "honest")
    wrong = next(c for c in library.candidates if c.kind == "wrong")
    other = next(c for c in library.candidates if c.kind == "honest" and c is not honest)
    data = {"intervals": [{"mode": "specgen", "problem": "attention", "batch": 0, "evaluations": [
        {"stage": "validate", "program": fingerprint(honest.source), "correct": False, "started_at": 1.0,
         "finished_at": 2.0},
        {"stage": "validate", "program": fingerprint(honest.source), "correct": False, "started_at": 3.0,
         "finished_at": 4.0},
        {"stage": "validate", "program": fingerprint(wrong.source), "correct": True, "started_at": 5.0,
         "finished_at": 6.0}]}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    times = ServiceTimes.from_bench(path)
    correct = Correctness(library, times.verdicts)
    assert not correct(honest.source) and correct(wrong.source)
    # An honest program the run never evaluated is correct at the rate the run measured for honest
    # programs (here none of one); where the run measured no program of a label, by the label.
    assert correct.label_rates == {"honest": 0.0, "wrong": 1.0} and not correct(other.source)
    slow = next(c for c in library.candidates if c.kind == "slow")
    cheat = next(c for c in library.candidates if c.kind == "cheat")
    assert correct(slow.source) and not correct(cheat.source)


def test_command_writes_its_report(tmp_path) -> None:
    from specgen.cli import main

    out = tmp_path / "sim"
    assert main(["simulate", "--gpus", "4", "--jobs", "2", "--hours", "0.05", "--seed", "1",
                 "--from-bench", _bench_file(tmp_path), "--out", str(out)]) == 0
    r = json.loads((out / "results.json").read_text())
    assert r["eval_gpus"] == 2 and (out / "report.md").is_file() and (out / "utilization.png").is_file()
    assert main(["simulate", "--gpus", "4"]) == 2     # no service times: refused, none assumed


def test_more_spare_processes_wait_less() -> None:
    """The what-if of the runtime setting spare_processes: with two spares a worker's second
    quick take finds one ready; with none, every take starts a runner in line."""
    times = service(validate=1.0)
    times.durations = {p: {"validate": [1.0], "profile": [1.0]} for p in PROBLEMS}
    times.runner_startup_s = [30.0]
    times.takes_runner = {p: [True] for p in PROBLEMS}
    lat = {n: run(times=times, hours=0.1, eval_gpus=1, settings={"spare_processes": n})[1]
           ["feedback_latency_s"]["p50"] for n in (0, 1, 2)}
    assert lat[2] < lat[1] < lat[0]


def test_spare_processes_must_not_be_negative(tmp_path) -> None:
    from specgen.cli import main

    assert main(["simulate", "--from-bench", _bench_file(tmp_path), "--spare-processes", "-1"]) == 2


def test_a_recorded_turn_is_paced_by_its_recorded_tokens_not_its_length() -> None:
    # A replay streams the trace's own tokens; the virtual clock must count the same ones (code
    # tokenizes to fewer characters a token than prose, so a length estimate runs fast).
    from specgen.messages import TriggerSettings
    from specgen.simulate.model import script_turn, tokens_at, trace_turn
    from specgen.traces.format import Chunk, Iteration, Segment
    from specgen.traces.synthetic import CHARS_PER_TOKEN

    reasoning = Segment([Chunk(0.0, [1] * 30, "x" * 36), Chunk(0.1, [2] * 10, "y" * 36)])
    final = Segment([Chunk(0.2, [3] * 7, "```python\nz\n```")])
    at = tokens_at(reasoning)
    assert at is not None
    assert (at(0), at(18), at(36), at(54), at(72), at(1000)) == (1, 15, 30, 35, 40, 40)
    turn = trace_turn("p", Iteration(reasoning, final), TriggerSettings(), False, False)
    assert (turn.reasoning_tokens, turn.final_tokens) == (40, 7)
    estimated = script_turn("p", reasoning.text, final.text, TriggerSettings(), False, False)
    assert estimated.reasoning_tokens == round(72 / CHARS_PER_TOKEN) != 40
    assert tokens_at(Segment([Chunk(0.0, [], "text")])) is None
