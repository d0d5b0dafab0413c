"""The messages of an evaluation: the verdict every part of the system reports, a candidate sent
for evaluation, and the update that one stage of its evaluation finished."""
from __future__ import annotations

from typing import Literal, get_args

import msgspec

# How far an evaluation goes: validate (compile, correctness, cheat guards), profile (timing of a
# candidate that validated), full (both). Typed, so a message with another stage is refused where
# it is decoded, with the field named.
Stage = Literal["validate", "profile", "full"]
STAGES: tuple[str, ...] = get_args(Stage)

# Why a verdict could not judge the candidate on its outputs (`Verdict.code`): the candidate's run
# was cancelled, ran past its time, or never started for the named side's reason. Code reads these,
# never the words of `error`, which are for people. `candidate`: judging it raised in the worker
# (its runner, which the candidate owns, sent what the judge could not handle, e.g. an output size
# no buffer can have); its runners were killed and the worker went on to the next candidate.
VerdictCode = Literal["", "cancelled", "timeout", "reference", "problem", "candidate_source", "build",
                      "refused", "no_runner", "candidate"]
VERDICT_CODES: tuple[str, ...] = get_args(VerdictCode)[1:]   # "" is a judged verdict, right or wrong

# How a candidate's runs were isolated (`Verdict.sandbox`): in namespaces of their own, or not at all
# (EvalOptions.sandbox "optional" or "off" on a host where none can be made).
SandboxKind = Literal["namespaces", "none"]

# Where a candidate program came from: a fork off the reasoning at a trigger point, the reasoning's
# final answer, or a code block finished inside the reasoning.
CandidateOrigin = Literal["fork", "final", "inline"]


class Verdict(msgspec.Struct, kw_only=True, gc=False):
    """What evaluating one candidate against one problem found.

    `stage` says how far evaluation went: "validate" (compile + correctness + cheat guards),
    "profile" (timing of a candidate that validated), or "full" (both, one after the other).
    A rejected or failing candidate is still a Verdict: `error` and/or `flags` say why.
    """

    stage: Stage = "full"
    compiled: bool = False                  # source loaded and its kernels built
    correct: bool = False                   # every correctness trial matched, no guard rejected it
    max_abs_error: float | None = None      # largest |candidate - reference| over all trials
    max_rel_error: float | None = None      # largest error relative to the reference's magnitude
    ref_ms: float | None = None             # median time of the reference Model
    candidate_ms: float | None = None       # median time of ModelNew
    speedup: float | None = None            # ref_ms / candidate_ms
    ref_compiled_ms: float | None = None    # median time of torch.compile(Model), when asked for
    spread: float | None = None             # (p75 - p25) / median of candidate timings
    device: str = "cpu"                     # "cpu" or "cuda:N" where it ran
    cpu_timing: bool = True                 # timings are CPU timings: they say nothing about GPUs
    flags: list[str] = []                   # cheat-guard reasons; empty when clean
    error: str | None = None                # why it failed to load/compile/run, else None
    code: VerdictCode = ""                  # why it could not be judged on its outputs, as a code
                                            # (VERDICT_CODES); "" when it was (right or wrong)
    stage_seconds: dict[str, float] = {}    # wall time per stage: compile, correctness, timing, ...
    ref_cached: bool = False                # ref_ms came from the per-problem reference-timing cache
    floor_ms: float | None = None           # physical floor of the problem on this device, when known
    overhead_ms: float | None = None        # what was taken off a timed call's whole time (median)
    notes: list[str] = []                   # checks skipped and why (e.g. no second shape possible)
    sandbox: SandboxKind = "none"           # how the run was isolated


class CandidateSubmission(msgspec.Struct, kw_only=True, gc=False):
    """A candidate kernel sent for evaluation (by the optimize loop, a client, or a test)."""

    job_id: str                             # the job it belongs to ("" for a one-off request)
    candidate_id: str                       # unique within the job
    problem_name: str                       # for logs and caches
    problem_source: str                     # KernelBench-format reference program
    candidate_source: str                   # the ModelNew program
    origin: CandidateOrigin = "final"       # where it came from (the priority rule final_first reads it)
    iteration: int = 0                      # optimize-loop iteration that produced it
    extracted_at: float = 0.0               # wall clock (time.time()) when it was extracted
    deadline: float | None = None           # wall clock after which the job no longer wants it
    profile: bool = True                    # go on to profiling once it validates


class CandidateUpdate(msgspec.Struct, kw_only=True, gc=False):
    """One stage of a candidate's evaluation finished (validate, then profile)."""

    job_id: str
    candidate_id: str
    stage: Stage
    verdict: Verdict
    worker: str = ""                        # which worker ran it, e.g. "node-a/gpu1"
    started_at: float = 0.0                 # wall clock
    finished_at: float = 0.0                # wall clock
    cancelled: bool = False                 # the job stopped wanting it before it ran

