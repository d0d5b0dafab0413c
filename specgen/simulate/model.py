"""The workload and its service times, all from measured or modelled sources, never constants here.

- Evaluation service times (validate, profile) and profiled speedups: a `specgen bench`
  results.json (its per-job `evaluations`), per problem, else pooled over the run's problems.
- Decode and prefill: `TimingModel` (its defaults, or the timing a bench run recorded).
- Reasoning: turns of the synthetic trace generator (token counts, where drafts sit, the share of
  correct answers), or the exact traces a bench run used (replay). Where the loop would fork is
  found by running the loop's own triggers over the turn's text; the gates are asked live.
"""
from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.messages import TriggerSettings
from specgen.optimize.dedup import fingerprint
from specgen.optimize.extraction import extract_candidate
from specgen.optimize.fork_models import latest_draft
from specgen.optimize.synthetic import CHARS_PER_TOKEN, LANGS, CandidateLibrary, generate_turn
from specgen.optimize.triggers import TriggerContext, TriggerPolicy, build_trigger_policy

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
    source: str = ""

    def pooled(self, stage: str) -> list[float]:
        return [d for per in self.durations.values() for d in per.get(stage, [])]

    def sample(self, problem: str, stage: str, rng: random.Random) -> float:
        stage = "validate" if stage == "validate" else "profile"
        options = self.durations.get(base_problem(problem), {}).get(stage) or self.pooled(stage)
        if not options:
            raise UsageError(f"no measured {stage} time in {self.source or 'the service times'}")
        return rng.choice(options)

    def speedup(self, problem: str, key: str, seed: int) -> float | None:
        """The speedup a correct candidate gets: one of the measured ones, the same one for the
        same program (keyed by its fingerprint) on every run."""
        options = self.speedups.get(base_problem(problem)) or [s for v in self.speedups.values() for s in v]
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
        return out

    @classmethod
    def from_bench(cls, path: Path) -> "ServiceTimes":
        data = load_bench(path)
        times = cls(source=str(path))
        seen = 0
        for job in data.get("intervals", []):
            evaluations = job.get("evaluations")
            if evaluations is None:
                continue
            problem = base_problem(job["problem"])
            per = times.durations.setdefault(problem, {"validate": [], "profile": []})
            for e in evaluations:
                seen += 1
                stage = "validate" if e["stage"] == "validate" else "profile"
                per[stage].append(float(e["finished_at"]) - float(e["started_at"]))
                compile_s = (e.get("stage_seconds") or {}).get("compile")
                if compile_s is not None:
                    times.compile_s.setdefault(problem, []).append(float(compile_s))
                if stage == "profile" and e.get("correct") and e.get("speedup") is not None:
                    times.speedups.setdefault(problem, []).append(float(e["speedup"]))
                if stage == "validate" and e.get("program"):
                    times.verdicts.setdefault(e["program"], []).append(bool(e.get("correct")))
        if not seen:
            raise UsageError(f"{path}: no per-stage evaluations recorded (results.json of a bench "
                             "from before `evaluations` was written: run `specgen bench` again)")
        return times


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
    fork_answer: str | None = None  # fork (draft model): what the fork writes, None = nothing


@dataclass
class TurnScript:
    """One reasoning turn as the simulator plays it."""

    problem: str
    reasoning_tokens: int
    final_tokens: int
    final_source: str | None
    firings: list[Firing]
    text: str                       # kept for the gates' context (MinGap etc. read counters only)


def _tokens(chars: int) -> int:
    return max(1, int(round(chars / CHARS_PER_TOKEN)))


def script_turn(problem: str, reasoning: str, final_text: str, settings: TriggerSettings,
                forking: bool, inline: bool) -> TurnScript:
    """Run the loop's own triggers (no gates: those are asked live) over the turn's text in
    stream-sized deltas, and note where each fires and what a fork there would write (the
    `draft` fork model: the latest program the reasoning completed before that point)."""
    policy = build_trigger_policy(settings, forking=forking, inline_candidates=inline, load_aware=False)
    scan = TriggerPolicy(policy.triggers, gates=())
    firings: list[Firing] = []
    step = int(SCAN_DELTA_TOKENS * CHARS_PER_TOKEN)
    previous = 0
    for end in list(range(step, len(reasoning), step)) + [len(reasoning)]:
        tokens = _tokens(end)
        ctx = TriggerContext(iteration=0, reasoning_tokens=tokens, text=reasoning[:end],
                             new_text_start=previous, previous_tokens=_tokens(previous) if previous else 0)
        previous = end
        decision = scan.decide(ctx)
        if decision is None:
            continue
        for source in decision.inline_candidates:
            firings.append(Firing(tokens, "inline", end, source=source))
        if decision.fork:
            firings.append(Firing(tokens, "fork", end, fork_answer=latest_draft(reasoning[:end])))
    for source in policy.finish(reasoning) if inline else []:
        firings.append(Firing(_tokens(len(reasoning)), "inline", len(reasoning), source=source))
    final = extract_candidate(final_text, accept_unclosed=True)
    return TurnScript(problem=problem, reasoning_tokens=_tokens(len(reasoning)),
                      final_tokens=_tokens(len(final_text)), final_source=final,
                      firings=firings, text="")


class Correctness:
    """Whether a program is correct: what its validations got in the measured run when the bench
    recorded it (most of them correct), else the library's label of it (honest and slow kernels
    are correct, wrong and cheating ones are not); a program neither measured nor in the library
    (a draft the generator broke) is not. Measured verdicts win because a kernel can fail on the
    hardware measured (a timeout, a tolerance) whatever its label says."""

    def __init__(self, library: CandidateLibrary, measured: dict[str, list[bool]] | None = None) -> None:
        self.correct: dict[str, bool] = {}
        for c in library.candidates:
            self.correct[fingerprint(c.source)] = c.kind in ("honest", "slow")
        for key, verdicts in (measured or {}).items():
            if verdicts:
                self.correct[key] = 2 * sum(verdicts) >= len(verdicts)

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
