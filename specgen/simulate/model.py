"""The workload and its service times, all from measured or modelled sources, never constants here.

- Evaluation service times (validate, profile) and profiled speedups: a `specgen bench`
  results.json (its per-job `evaluations`): those of the same program where the run evaluated it
  (a program that fails to build is rejected in a millisecond, one that runs takes seconds), else
  those of its problem, else pooled over the run's problems. Each is kept without the time it
  waited for a runner process: that wait is modelled, from the runner start-up times the run shows.
- Decode and prefill: `TimingModel` (its defaults, or the timing a bench run recorded).
- Reasoning: turns of the synthetic trace generator (token counts, where drafts sit, the share of
  correct answers), or the exact traces a bench run used (replay). Where the loop would fork is
  found by running the loop's own triggers over the turn's text; the gates are asked live.
"""
from __future__ import annotations

import bisect
import functools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.messages import TriggerSettings
from specgen.optimize.dedup import fingerprint
from specgen.optimize.fork_models import fork_writer
from specgen.optimize.triggers import TriggerContext, TriggerPolicy, build_trigger_policy
from specgen.traces.extraction import extract_candidate
from specgen.traces.format import Iteration, Segment
from specgen.traces.synthetic import CHARS_PER_TOKEN, LANGS, CandidateLibrary, generate_turn

# The loop streams reasoning in deltas; the trigger scan reads the text in deltas of this many
# tokens (a modelled engine's stream granularity is one token; triggers are edge-triggered on
# text, so a coarser delta moves a trigger point by less than one delta).
SCAN_DELTA_TOKENS = 16


@functools.lru_cache(maxsize=65536)
def program_key(source: str) -> str:
    """The loop's dedup fingerprint of a program, computed once per distinct program: the jobs
    draw from a bank of turns, so the same programs come back many times."""
    return fingerprint(source)


def base_problem(name: str) -> str:
    """A bench problem's name without the `#i` it gets when a problem repeats."""
    return name.split("#", 1)[0]


@dataclass
class ServiceTimes:
    """Measured stage durations (seconds) and profiled speedups, per problem."""

    durations: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # problem -> stage -> s
    speedups: dict[str, list[float]] = field(default_factory=dict)               # problem -> speedups
    compile_s: dict[str, list[float]] = field(default_factory=dict)              # problem -> compile s
    # program fingerprint -> the verdicts (correct or not) its validations got in the measured run
    verdicts: dict[str, list[bool]] = field(default_factory=dict)
    # program fingerprint -> stage -> its measured durations; -> its measured speedups
    program_durations: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    program_speedups: dict[str, list[float]] = field(default_factory=dict)
    # Runner processes: whether an evaluation took one (a program rejected by the static checks or
    # its build does not), per program and per problem; how long a worker's replacement runner
    # took to start (seconds), where the run shows it.
    program_takes_runner: dict[str, list[bool]] = field(default_factory=dict)
    takes_runner: dict[str, list[bool]] = field(default_factory=dict)
    runner_startup_s: list[float] = field(default_factory=list)
    # problem -> whether each profile evaluation first timed the reference (in a runner of its own,
    # then a second runner for the candidate); it does when the reference-timing cache misses.
    reference_runs: dict[str, list[bool]] = field(default_factory=dict)
    # program fingerprint -> its extension build's seconds on a cold cache: a run's first
    # evaluation of the program waits for it (the evaluation service builds inline, cached by source)
    build_s: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def pooled(self, stage: str) -> list[float]:
        return [d for per in self.durations.values() for d in per.get(stage, [])]

    def sample(self, problem: str, stage: str, rng: random.Random, program: str | None = None) -> float:
        """A measured duration of `stage`: of this program (its fingerprint) if the run evaluated it,
        else of its problem, else of any problem."""
        stage = "validate" if stage == "validate" else "profile"
        options = (self.program_durations.get(program, {}).get(stage) if program else None) \
            or self.durations.get(base_problem(problem), {}).get(stage) or self.pooled(stage)
        if not options:
            raise UsageError(f"no measured {stage} time in {self.source or 'the service times'}")
        return rng.choice(options)

    def takes_a_runner(self, problem: str, program: str | None, rng: random.Random) -> bool:
        """Whether this evaluation runs the candidate in a runner process (as the run measured it)."""
        options = (self.program_takes_runner.get(program) if program else None) \
            or self.takes_runner.get(base_problem(problem)) or [t for v in self.takes_runner.values() for t in v]
        return bool(options) and rng.choice(options)

    def runners_taken(self, problem: str, stage: str, program: str | None, rng: random.Random) -> int:
        """How many runner processes this evaluation takes: 0 (rejected before running), 1, or 2
        (a profile that times the reference first)."""
        if not self.takes_a_runner(problem, program, rng):
            return 0
        options = self.reference_runs.get(base_problem(problem)) if stage != "validate" else None
        return 2 if options and rng.choice(options) else 1

    def runner_startup(self, rng: random.Random) -> float:
        """How long a replacement runner takes to start; 0 where the run never showed one."""
        return rng.choice(self.runner_startup_s) if self.runner_startup_s else 0.0

    def speedup(self, problem: str, key: str, seed: int) -> float | None:
        """The speedup a correct candidate gets: one measured for this program (keyed by its
        fingerprint) if the run profiled it, else one of its problem's; the same one for the same
        program on every run."""
        options = self.program_speedups.get(key) or self.speedups.get(base_problem(problem)) \
            or [s for v in self.speedups.values() for s in v]
        if not options:
            return None
        return random.Random(f"{seed}-{key}").choice(sorted(options))

    def summary(self) -> dict[str, Any]:
        out = {}
        for problem, per in sorted(self.durations.items()):
            out[problem] = {stage: {"n": len(v), "mean_s": sum(v) / len(v)} for stage, v in per.items() if v}
            if self.compile_s.get(problem):
                c = self.compile_s[problem]
                out[problem]["compile_mean_s"] = sum(c) / len(c)
        if self.runner_startup_s:
            out["runner_startup"] = {"n": len(self.runner_startup_s),
                                     "mean_s": sum(self.runner_startup_s) / len(self.runner_startup_s)}
        return out

    @classmethod
    def from_measured(cls, rows: list[dict[str, Any]], source: str = "") -> "ServiceTimes":
        """From the rows of a virtual-clock bench (`specgen.bench.virtual.measure`): each program
        validated (and profiled when correct) once per device, one at a time. Where a row has
        its stages' `stage_seconds` (`spare_wait`: the evaluation took a runner and waited that
        long for it; `runner_startup`: that runner's fork to ready), the wait is taken out of the
        service time and the start-ups kept, so that the simulator models the waits of a loaded
        worker (one spare runner each) instead of the idle measuring worker's; rows without them
        keep the runner's start inside the service time."""
        times = cls(source=source or "measured by specgen bench --clock virtual")
        for row in rows:
            problem, fp = row["problem"], row["program"]
            per = times.durations.setdefault(problem, {"validate": [], "profile": []})
            program = times.program_durations.setdefault(fp, {})
            took = False
            for stage in ("validate", "profile"):
                if row.get(f"{stage}_s") is None:
                    continue
                stages = row.get(f"{stage}_stages") or {}
                wait = float(stages.get("spare_wait", 0.0))
                if "spare_wait" in stages:
                    took = True
                    if stages.get("runner_startup") is not None:
                        times.runner_startup_s.append(float(stages["runner_startup"]))
                duration = max(0.0, float(row[f"{stage}_s"]) - wait)
                per[stage].append(duration)
                program.setdefault(stage, []).append(duration)
            if row.get("build_s") is not None:
                times.build_s[fp] = float(row["build_s"])
            times.verdicts.setdefault(fp, []).append(bool(row["correct"]))
            times.program_takes_runner.setdefault(fp, []).append(took)
            times.takes_runner.setdefault(problem, []).append(took)
            if row.get("speedup"):
                times.program_speedups.setdefault(fp, []).append(float(row["speedup"]))
                times.speedups.setdefault(problem, []).append(float(row["speedup"]))
        return times

    @classmethod
    def from_bench(cls, path: Path) -> "ServiceTimes":
        data = load_bench(path)
        if data.get("clock") == "virtual":
            return cls.from_measured(data.get("evaluations") or [], source=str(path))
        times = cls(source=str(path))
        seen = 0
        runs: dict[tuple[Any, Any, str], list[dict[str, Any]]] = {}  # (mode, batch, worker) -> runner takes
        for job in data.get("intervals", []):
            evaluations = job.get("evaluations")
            if evaluations is None:
                continue
            problem = base_problem(job["problem"])
            per = times.durations.setdefault(problem, {"validate": [], "profile": []})
            for e in evaluations:
                seen += 1
                stage = "validate" if e["stage"] == "validate" else "profile"
                seconds = e.get("stage_seconds") or {}
                # The evaluator reports spare_wait whenever it took a runner.
                took = "spare_wait" in seconds
                duration = float(e["finished_at"]) - float(e["started_at"]) - float(seconds.get("spare_wait", 0.0))
                per[stage].append(duration)
                times.takes_runner.setdefault(problem, []).append(took)
                program = e.get("program")
                if program:
                    times.program_durations.setdefault(program, {}).setdefault(stage, []).append(duration)
                    times.program_takes_runner.setdefault(program, []).append(took)
                if took and stage == "profile":
                    times.reference_runs.setdefault(problem, []).append("reference" in seconds)
                if took:
                    runs.setdefault((job.get("mode"), job.get("batch"), e.get("worker", "")), []).append(e)
                compile_s = (e.get("stage_seconds") or {}).get("compile")
                if compile_s is not None:
                    times.compile_s.setdefault(problem, []).append(float(compile_s))
                if stage == "profile" and e.get("correct") and e.get("speedup") is not None:
                    times.speedups.setdefault(problem, []).append(float(e["speedup"]))
                    if program:
                        times.program_speedups.setdefault(program, []).append(float(e["speedup"]))
                if stage == "validate" and e.get("program"):
                    times.verdicts.setdefault(e["program"], []).append(bool(e.get("correct")))
        if not seen:
            raise UsageError(f"{path}: no per-stage evaluations recorded (results.json of a bench "
                             "from before `evaluations` was written: run `specgen bench` again)")
        times.runner_startup_s = runner_startups(runs.values())
        return times


def runner_startups(takes_per_worker) -> list[float]:
    """Replacement-runner start-up times, from each worker's runner takes in time order.

    A worker keeps one spare runner (spare_processes' default, which the bench runs with) and
    starts its replacement when it takes it (at the take: the evaluation's start plus its build). When the next take waited (spare_wait > 0), the replacement
    became ready at that take plus the wait, which gives its start-up time exactly; a take that did
    not wait only bounds it, and is left out, as is a pair where either evaluation took a second
    runner for a reference timing (when that replacement started, or which wait was whose, is not
    recorded)."""
    def take_at(e: dict[str, Any]) -> float:
        return float(e["started_at"]) + float((e.get("stage_seconds") or {}).get("build", 0.0))

    out = []
    for takes in takes_per_worker:
        ordered = sorted(takes, key=take_at)
        for previous, current in zip(ordered, ordered[1:]):
            if "reference" in previous["stage_seconds"] or "reference" in current["stage_seconds"]:
                continue
            waited = float(current["stage_seconds"]["spare_wait"])
            if waited > 0.02:       # below this, a ready spare's hand-over, not a start-up
                out.append(take_at(current) + waited - take_at(previous))
    return out


def load_bench(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise UsageError(f"{path}: no such bench results file")
    return json.loads(path.read_text())


def bench_timing(data: dict[str, Any]) -> TimingModel:
    recorded = dict((data.get("config") or {}).get("timing") or {})
    recorded.pop("source", None)
    return TimingModel.from_overrides({k: str(v) for k, v in recorded.items()}) if recorded else TimingModel()


def bench_seed(data: dict[str, Any]) -> int | None:
    """The generator seed of a bench run's traces (written into each trace's model label)."""
    for p in (data.get("config") or {}).get("problems", []):
        m = re.search(r"seed (\d+)", p.get("trace_model") or "")
        if m:
            return int(m.group(1))
    return None


# ------------------------------------------------------------------------------------- turns
@dataclass
class Firing:
    token: int                      # reasoning tokens when it fires
    kind: str                       # "fork" | "inline"
    char: int                       # offset in the reasoning text
    source: str | None = None       # inline: the program the reasoning just completed
    fork_answer: str | None = None  # fork: what the fork writes (by the fork model), None = nothing


@dataclass
class TurnScript:
    """One reasoning turn as the simulator plays it."""

    problem: str
    reasoning_tokens: int
    final_tokens: int
    final_source: str | None
    firings: list[Firing]
    text: str                       # kept for the gates' context (MinGap etc. read counters only)


def _estimated_tokens(chars: int) -> int:
    return max(1, int(round(chars / CHARS_PER_TOKEN)))


def tokens_at(segment: Segment) -> Callable[[int], int] | None:
    """How many of a recorded segment's tokens a replay has streamed once `chars` characters of
    its text are out: whole chunks as recorded, a chunk's share in proportion within it. A replay
    paces the recorded tokens, so the virtual clock must count those, not an estimate from the
    text's length (off by 5-15% on code-heavy text). None for a segment with no token ids."""
    ends_c: list[int] = []
    ends_t: list[int] = []
    chars = tokens = 0
    for chunk in segment.chunks:
        chars += len(chunk.text)
        tokens += len(chunk.token_ids)
        ends_c.append(chars)
        ends_t.append(tokens)
    if not tokens:
        return None

    def at(offset: int) -> int:
        i = bisect.bisect_left(ends_c, offset)
        if i >= len(ends_c):
            return tokens
        prev_c, prev_t = (ends_c[i - 1], ends_t[i - 1]) if i else (0, 0)
        span = ends_c[i] - prev_c
        share = (offset - prev_c) / span if span else 1.0
        return max(1, prev_t + int(round(share * (ends_t[i] - prev_t))))
    return at


def trace_turn(problem: str, iteration: Iteration, settings: TriggerSettings, forking: bool,
               inline: bool, fork_model: str = "draft") -> TurnScript:
    """`script_turn` of a recorded iteration, counting its recorded tokens."""
    return script_turn(problem, iteration.reasoning.text, iteration.final.text, settings, forking,
                       inline, fork_model, tokens=tokens_at(iteration.reasoning),
                       final_tokens=iteration.final.num_tokens or None)


def script_turn(problem: str, reasoning: str, final_text: str, settings: TriggerSettings,
                forking: bool, inline: bool, fork_model: str = "draft",
                tokens: Callable[[int], int] | None = None,
                final_tokens: int | None = None) -> TurnScript:
    """Run the loop's own triggers (no gates: those are asked live) over the turn's text in
    stream-sized deltas, and note where each fires and what a fork there would write: the
    registered fork model's `program_at` (`fork_models`: with `draft` the latest program the
    reasoning completed before that point; with `named` the final answer once its kernel has
    been named, else that draft). `tokens`: the reasoning's tokens at a character offset, and
    `final_tokens` the answer's, where recorded (else estimated from the text's length)."""
    count = tokens or _estimated_tokens
    final = extract_candidate(final_text, accept_unclosed=True)
    writer = fork_writer(fork_model)
    policy = build_trigger_policy(settings, forking=forking, inline_candidates=inline, load_aware=False)
    scan = TriggerPolicy(policy.triggers, gates=())
    firings: list[Firing] = []
    step = int(SCAN_DELTA_TOKENS * CHARS_PER_TOKEN)
    previous = 0
    for end in list(range(step, len(reasoning), step)) + [len(reasoning)]:
        at = count(end)
        ctx = TriggerContext(iteration=0, reasoning_tokens=at, text=reasoning[:end],
                             new_text_start=previous, previous_tokens=count(previous) if previous else 0)
        previous = end
        decision = scan.decide(ctx)
        if decision is None:
            continue
        for source in decision.inline_candidates:
            firings.append(Firing(at, "inline", end, source=source))
        if decision.fork:
            answer = writer.program_at(reasoning[:end], reasoning, final)
            firings.append(Firing(at, "fork", end, fork_answer=answer))
    for source in policy.finish(reasoning) if inline else []:
        firings.append(Firing(count(len(reasoning)), "inline", len(reasoning), source=source))
    return TurnScript(problem=problem, reasoning_tokens=count(len(reasoning)),
                      final_tokens=final_tokens or _estimated_tokens(len(final_text)), final_source=final,
                      firings=firings, text="")


class Correctness:
    """Whether a program is correct: what its validations got in the measured run when the bench
    recorded it (most of them correct), else by the library's label of it. Measured verdicts win
    because a kernel can fail on the hardware measured (a timeout, a tolerance) whatever its label
    says; for the same reason a labelled program the run never evaluated is correct at the rate
    the run measured for its label's programs (honest and slow kernels are correct, wrong and
    cheating ones are not, where the run measured none of that label), decided once per program
    from its fingerprint. A program neither measured nor in the library (a draft the generator
    broke) is not correct."""

    def __init__(self, library: CandidateLibrary, measured: dict[str, list[bool]] | None = None) -> None:
        self.correct: dict[str, bool] = {}
        kind: dict[str, str] = {fingerprint(c.source): c.kind for c in library.candidates}
        measured = {key: 2 * sum(v) >= len(v) for key, v in (measured or {}).items() if v}
        outcomes: dict[str, list[bool]] = {}
        for key, correct in measured.items():
            if key in kind:
                outcomes.setdefault(kind[key], []).append(correct)
        self.label_rates = {k: sum(v) / len(v) for k, v in outcomes.items()}
        for key, k in kind.items():
            rate = self.label_rates.get(k, 1.0 if k in ("honest", "slow") else 0.0)
            self.correct[key] = random.Random(f"correct-{key}").random() < rate
        self.correct.update(measured)

    def __call__(self, source: str) -> bool:
        return self.correct.get(program_key(source), False)


class TurnBank:
    """Generated turns per problem, scripted once and drawn by the jobs: generating and scanning
    a fresh turn for every job and iteration of a long run costs more than the run itself."""

    def __init__(self, problems: list[str], per_problem: int, seed: int, settings: TriggerSettings,
                 library: CandidateLibrary | None = None) -> None:
        self.library = library or CandidateLibrary.load()
        self.settings = settings
        self.turns: dict[tuple[str, bool], list[TurnScript]] = {}
        self.raw: dict[str, list[tuple[str, str]]] = {}
        for problem in problems:
            rng = random.Random(f"simulate-{seed}-{problem}")
            self.raw[problem] = [generate_turn(problem, self.library, rng, LANGS)[:2]
                                 for _ in range(per_problem)]

    def scripts(self, problem: str, forking: bool) -> list[TurnScript]:
        key = (problem, forking)
        if key not in self.turns:
            self.turns[key] = [script_turn(problem, r, f, self.settings, forking, forking)
                               for r, f in self.raw[problem]]
        return self.turns[key]

    def draw(self, problem: str, forking: bool, rng: random.Random) -> TurnScript:
        return rng.choice(self.scripts(problem, forking))
