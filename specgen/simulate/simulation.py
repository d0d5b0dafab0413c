"""The event loop: jobs reasoning on modelled engines, evaluation workers, and the project's
SchedulerCore between them, all on one VirtualClock.

The simulator plays every peer the real scheduler talks to, through the core's public entry
points only (`handle`, `schedule`, `tick`, `stats`, `outbox`), as the scheduler actor does:
each job is a scheduled job with a reasoner (CreateJob, the reasoner's Hello, SubmitCandidate,
ReportJobResult); each evaluation GPU is a worker (Hello, then WorkDone when its service time is
up). What the core decides (which worker takes what, pool moves, drops) is the real code's
decision; the simulator only supplies how long things take.

Reasoning: each job's turns stream at the timing model's per-request decode rate for the number of
sequences its engine runs (its own reasoning, its forks, the other jobs on that engine), in steps
of at most `STEP_TOKENS` (a rate change takes effect at the next step). At each trigger point the
loop's own gates decide whether to fork (load-aware gate fed from the core's queues); a fork costs
its prefill (prefix cached, the timing model's `ttft_s`) and its answer's tokens. Verdicts go
through the loop's own termination criterion.
"""
from __future__ import annotations

import collections
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from specgen.backend import BackendLoad
from specgen.clock import VirtualClock
from specgen.engines.timing_model import TimingModel
from specgen.messages import (
    AssignWork, CancelWork, CandidateSubmission, CandidateUpdate, CandidateUpdateNotice, CreateJob,
    Hello, JobResult, JobSpec, OptimizeSpec, ReportJobResult, SubmitCandidate, TriggerSettings,
    Verdict, WorkDone,
)
from specgen.optimize.fork_prompt import FORK_INSTRUCTION, FORK_STOP
from specgen.optimize.modes import Mechanisms
from specgen.optimize.termination import JobStanding, VerdictView, default_criterion
from specgen.optimize.triggers import TriggerContext, build_trigger_policy
from specgen.runtime.journal import Journal
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings
from specgen.simulate.model import Correctness, ServiceTimes, TurnScript, program_key
from specgen.traces.synthetic import CHARS_PER_TOKEN

STEP_TOKENS = 256            # reasoning advances at most this far between rate updates
# The fork prompt's uncached part: the closing think tag and the loop's own instruction.
FORK_SUFFIX_TOKENS = round(len("\n</think>" + FORK_INSTRUCTION) / CHARS_PER_TOKEN)
WALL0 = 1_000_000.0          # virtual wall clock at start (the core wants extracted_at > 0)
CLIENT = b"client/simulate/0"


@dataclass
class SimConfig:
    eval_gpus: int
    reasoning_engines: int
    elastic: bool = True
    hours: float | None = 1.0             # simulated duration (None: until every job is done)
    seed: int = 0
    timing: TimingModel = field(default_factory=TimingModel)
    speed: float = 1.0                    # LLM time divided by this (bench --speed)
    tick_s: float = 0.5                   # core.tick cadence (= rebalance_interval_s default)
    sample_s: float = 30.0                # utilization-over-time sampling
    turns: int = 4                        # iterations per job (OptimizeSpec.max_iterations' default)
    best_of_n: int = 4
    target_speedup: float | None = None
    improvement_margin: float | None = 0.1
    restart_jobs: bool = True             # a finished job's slot takes a new job while time remains
    settings: dict[str, Any] = field(default_factory=dict)   # RuntimeSettings overrides


@dataclass
class JobPlan:
    job_id: str
    problem: str
    mode: str
    engine: int
    turns: list[list[TurnScript]] | None = None    # fixed turns (replay); None: drawn from the bank


@dataclass
class Stream:
    script: TurnScript
    pos: int = 0
    next_firing: int = 0
    timer: Any = None
    done: bool = False
    answered: bool = False


class SimEngine:
    """One reasoning engine: its running sequences set each one's decode rate."""

    def __init__(self, timing: TimingModel, speed: float) -> None:
        self.timing, self.speed, self.running = timing, speed, 0

    def rate(self) -> float:
        return self.timing.decode_tps(self.running) * self.speed


class SimJob:
    def __init__(self, sim: "Simulation", plan: JobPlan) -> None:
        self.sim, self.plan, self.id = sim, plan, plan.job_id
        spec = OptimizeSpec(job_id=plan.job_id, problem_name=plan.problem, problem_source="x",
                            mode=plan.mode, target_speedup=sim.cfg.target_speedup,
                            improvement_margin=sim.cfg.improvement_margin)
        self.mech = Mechanisms.of(spec)
        self.gates = build_trigger_policy(TriggerSettings(), forking=self.mech.forking,
                                          inline_candidates=self.mech.inline_candidates,
                                          load_aware=self.mech.load_aware).gates
        self.criterion = default_criterion(sim.cfg.target_speedup,
                                           sim.cfg.improvement_margin if self.mech.early_termination else None)
        self.peer = f"reasoner/{plan.job_id}/0".encode()
        self.engine = sim.engines[plan.engine]
        self.iteration = -1
        self.streams: list[Stream] = []
        self.started = sim.clock.now()
        self.finished: float | None = None
        self.candidates: dict[str, dict[str, Any]] = {}    # id -> {order, iteration, source, verdicts}
        self.open: dict[int, set[str]] = {}                 # iteration -> candidates without a final verdict
        # iteration -> the open candidates that stand for its answers (an answer repeating an
        # earlier program waits for that program's verdict), as the loop's candidates.answer_ids does
        self.answers: dict[int, set[str]] = {}
        self.by_fp: dict[str, str] = {}                     # program -> its candidate (dedup)
        self.best: float | None = None
        self.forks_in_flight = 0
        self.forks_iteration = 0
        self.last_fork_token = 0
        self.fork_yields: list[bool] = []
        self.fork_timers: list[Any] = []
        self.profiled = 0
        self.reasoning_done_iterations: set[int] = set()

    # -- iterations -----------------------------------------------------------------------
    def start_iteration(self) -> None:
        self.iteration += 1
        sim = self.sim
        if self.iteration >= sim.cfg.turns:
            self.finish("iterations_done")
            return
        n = sim.cfg.best_of_n if self.plan.mode == "best-of-n" else 1
        if self.plan.turns is not None:
            scripts = self.plan.turns[self.iteration % len(self.plan.turns)][:n]
        else:
            scripts = [sim.bank.draw(self.plan.problem, self.mech.forking, sim.rng) for _ in range(n)]
        self.streams = [Stream(s) for s in scripts]
        self.open.setdefault(self.iteration, set())
        self.answers.setdefault(self.iteration, set())
        self.forks_iteration, self.last_fork_token = 0, 0
        for stream in self.streams:
            self.engine.running += 1
            # The prompt's prefill (conversation so far; its prefix is cached from the last turn).
            stream.timer = sim.clock.call_later(self.engine.timing.ttft_s(0) / sim.cfg.speed,
                                                lambda s=stream: self.step(s))

    def step(self, stream: Stream) -> None:
        if self.finished is not None or stream.done:
            return
        script = stream.script
        while stream.next_firing < len(script.firings) and script.firings[stream.next_firing].token <= stream.pos:
            self.on_firing(stream, script.firings[stream.next_firing])
            stream.next_firing += 1
            if stream.done or self.finished is not None:
                return
        if stream.pos >= script.reasoning_tokens:
            self.end_reasoning(stream)
            return
        target = min(script.reasoning_tokens, stream.pos + STEP_TOKENS)
        if stream.next_firing < len(script.firings):
            target = min(target, max(stream.pos + 1, script.firings[stream.next_firing].token))
        dt = (target - stream.pos) / self.engine.rate()
        stream.pos = target
        stream.timer = self.sim.clock.call_later(dt, lambda: self.step(stream))

    def end_reasoning(self, stream: Stream) -> None:
        # The answer is decoded after the reasoning, then extracted and submitted.
        dt = stream.script.final_tokens / self.engine.rate()
        stream.done = True

        def answered() -> None:
            self.engine.running -= 1
            stream.answered = True
            if self.finished is not None:
                return
            if stream.script.final_source:
                self.submit(stream.script.final_source, "final")
            if self.mech.forking:
                self.abort_forks()      # forks of a reasoning that has answered (OptimizeJob._run_single)
            self.maybe_next()
        stream.timer = self.sim.clock.call_later(dt, answered)

    def maybe_next(self) -> None:
        """Start the next iteration when this one's streams are answered and (except in
        pipeline mode) its answers have their verdicts; end the job after the last iteration
        once every answer has its verdict (speculative candidates still owed are cancelled)."""
        if self.finished is not None or not all(s.answered for s in self.streams):
            return
        last = self.iteration + 1 >= self.sim.cfg.turns
        if self.plan.mode != "pipeline" and self.answers.get(self.iteration):
            return
        if last and any(self.answers.values()):
            return      # a job ends with its answers' verdicts in, pipelined or not
        if self.forks_in_flight:
            return
        self.start_iteration()

    def abort_iteration(self) -> None:
        for s in self.streams:
            if s.timer is not None:
                s.timer.cancel()
            if not s.answered:
                self.engine.running -= 1
            s.done = s.answered = True
        self.abort_forks()

    def abort_forks(self) -> None:
        for t in self.fork_timers:
            t.cancel()
        self.engine.running -= self.forks_in_flight
        self.forks_in_flight = 0
        self.fork_timers = []

    # -- forks and inline candidates --------------------------------------------------------
    def on_firing(self, stream: Stream, firing) -> None:
        if firing.kind == "inline":
            self.submit(firing.source, "inline")
            self.last_fork_token = firing.token      # an inline candidate counts as a fork for the gap
            return
        ctx = TriggerContext(iteration=self.iteration, reasoning_tokens=firing.token, text="",
                             new_text_start=0, tokens_since_last_fork=firing.token - self.last_fork_token,
                             forks_this_iteration=self.forks_iteration, forks_in_flight=self.forks_in_flight,
                             recent_fork_yields=tuple(self.fork_yields[-8:]), load_probe=self.sim.load)
        for gate in self.gates:
            if gate.veto(ctx) is not None:
                self.sim.counts["forks_vetoed"] += 1
                return
        self.forks_iteration += 1
        self.forks_in_flight += 1
        self.last_fork_token = firing.token
        self.engine.running += 1
        self.sim.counts["forks"] += 1
        answer = firing.fork_answer
        # The program, then the fence that stops the fork; a fork with no draft to write stops at once.
        tokens = round(len(answer + FORK_STOP[0]) / CHARS_PER_TOKEN) if answer else 1
        t = self.engine.timing
        dt = t.ttft_s(firing.token + FORK_SUFFIX_TOKENS, cached_tokens=firing.token) / self.sim.cfg.speed \
            + tokens / self.engine.rate()
        iteration = self.iteration

        def done() -> None:
            self.forks_in_flight -= 1
            self.engine.running -= 1
            new = bool(answer) and self.iteration == iteration and self.submit(answer, "fork")
            self.fork_yields.append(bool(new))
            self.maybe_next()
        self.fork_timers.append(self.sim.clock.call_later(dt, done))

    def submit(self, source: str, origin: str) -> bool:
        fp = program_key(source)
        if fp in self.by_fp:
            self.sim.counts["duplicates"] += 1
            earlier = self.by_fp[fp]
            if origin == "final" and earlier in self.open.get(self.candidates[earlier]["iteration"], ()):
                self.answers[self.iteration].add(earlier)
            return False
        cid = f"c{len(self.candidates)}"
        self.by_fp[fp] = cid
        if origin == "final":
            self.answers[self.iteration].add(cid)
        self.candidates[cid] = {"order": len(self.candidates), "iteration": self.iteration,
                                "source": source, "fp": fp, "origin": origin,
                                "extracted": self.sim.clock.now()}
        self.open[self.iteration].add(cid)
        self.sim.submit(self, CandidateSubmission(
            job_id=self.id, candidate_id=cid, problem_name=self.plan.problem, problem_source="x",
            candidate_source=source, origin=origin, iteration=self.iteration,
            extracted_at=self.sim.clock.wall()))
        return True

    # -- verdicts ---------------------------------------------------------------------------
    def on_update(self, upd: CandidateUpdate) -> None:
        c = self.candidates.get(upd.candidate_id)
        if c is None:
            return
        v = upd.verdict
        final = upd.cancelled or upd.stage != "validate" or not v.correct
        if final:
            c["final_updates"] = c.get("final_updates", 0) + 1
        if self.finished is not None:
            return
        if upd.stage != "validate" and not upd.cancelled:
            self.profiled += 1
            c["speedup"] = v.speedup if v.correct else None
            if v.correct and v.speedup is not None:
                earlier = [o.get("speedup") for o in self.candidates.values()
                           if o["order"] < c["order"] and o.get("speedup") is not None]
                bar = max(earlier) if earlier else 1.0
                self.best = max(self.best or v.speedup, v.speedup)
                decision = self.criterion.check(
                    VerdictView(upd.candidate_id, True, v.speedup),
                    JobStanding(iteration=self.iteration, best_speedup=self.best, bar=bar))
                if decision is not None and self.mech.early_termination:
                    self.sim.counts[f"terminations_{decision.scope}"] += 1
                    if decision.scope == "job":
                        self.finish("target_reached")
                        return
                    if c["iteration"] == self.iteration:
                        self.open[c["iteration"]].discard(upd.candidate_id)
                        self.abort_iteration()
                        self.open[self.iteration] = set()
                        self.answers[self.iteration] = set()
                        self.start_iteration()
                        return
        if final:
            self.open.get(c["iteration"], set()).discard(upd.candidate_id)
            for waiting in self.answers.values():
                waiting.discard(upd.candidate_id)
            self.maybe_next()

    def finish(self, status: str) -> None:
        if self.finished is not None:
            return
        self.abort_iteration()
        self.finished = self.sim.clock.now()
        self.status = status
        self.sim.job_finished(self)


class Simulation:
    def __init__(self, cfg: SimConfig, service: ServiceTimes, bank: Any, jobs: list[JobPlan],
                 correctness: Correctness | None = None) -> None:
        self.cfg = cfg
        self.service = service
        self.bank = bank
        self.correct = correctness or Correctness(bank.library, service.verdicts)
        self.rng = random.Random(f"simulate-{cfg.seed}")
        self.eval_rng = random.Random(f"simulate-eval-{cfg.seed}")
        self.clock = VirtualClock(start=0.0, wall_start=WALL0)
        self.journal = Journal(":memory:")
        settings = {"pool_mode": "elastic" if cfg.elastic else "static",
                    # No heartbeats are simulated: nobody times out.
                    "peer_timeout_s": 1e12, **cfg.settings}
        self.core = SchedulerCore(RuntimeSettings(**settings), self.journal,  # type: ignore[arg-type]
                                  scheduler_id="sim", clock=self.clock)
        self.engines = [SimEngine(cfg.timing, cfg.speed) for _ in range(max(1, cfg.reasoning_engines))]
        self.decision_s: list[float] = []
        self.calls = 0
        self.counts: dict[str, int] = {k: 0 for k in (
            "forks", "forks_vetoed", "duplicates", "submitted", "assigned", "verdicts",
            "cancel_work", "terminations_job", "terminations_iteration", "submit_refused")}
        self.jobs: dict[str, SimJob] = {}
        self.done_jobs: list[SimJob] = []
        self.finished_jobs: dict[str, SimJob] = {}
        self.queue_plans = list(jobs)
        self.next_job = 0
        self.assignments: dict[bytes, tuple[AssignWork, float, Any]] = {}   # worker -> (work, started wall, timer)
        # worker -> when each of its spare runners is ready (virtual s), oldest first
        self.spares: dict[bytes, collections.deque[float]] = {}
        self.runner_wait_s = 0.0      # of the busy worker-seconds: waiting for a runner to start
        # (worker, pool, start, end, completed: not cancelled)
        self.busy: list[tuple[str, str, float, float, bool]] = []
        self.verdicts: dict[tuple[str, str, str], int] = {}    # (job, cand, stage) -> count
        self.samples: list[dict[str, float]] = []
        self._load: tuple[float, BackendLoad] | None = None
        self.end = cfg.hours * 3600.0 if cfg.hours else math.inf
        self.send(CLIENT, Hello(role="client", name="simulate"))
        self.workers = [f"worker/gpu{i}/0".encode() for i in range(cfg.eval_gpus)]
        for i, peer in enumerate(self.workers):
            self.send(peer, Hello(role="worker", name=f"gpu{i}", node=f"node{i // 8}",
                                  device=f"cuda:{i % 8}"))

    # -- the core, as the scheduler actor drives it ------------------------------------------
    def send(self, peer: bytes, msg: Any) -> None:
        now = self.clock.now()
        t0 = time.perf_counter()
        self.core.handle(peer, msg, now)
        self.core.schedule(now)
        self.decision_s.append(time.perf_counter() - t0)
        self.journal.commit()
        self.drain()

    def tick(self) -> None:
        now = self.clock.now()
        t0 = time.perf_counter()
        self.core.tick(now)
        self.core.schedule(now)
        self.decision_s.append(time.perf_counter() - t0)
        self.journal.commit()
        self.drain()
        if now + self.cfg.tick_s <= self.end:
            self.clock.call_later(self.cfg.tick_s, self.tick)

    def drain(self) -> None:
        out, self.core.outbox = self.core.outbox, []
        self.core.actions.clear()     # reasoners are played here; nothing to start
        for peer, msg in out:
            kind = type(msg)
            if kind is AssignWork:
                self.on_assign(peer, msg)
            elif kind is CandidateUpdateNotice:
                job = self.jobs.get(msg.update.job_id) or self.finished_jobs.get(msg.update.job_id)
                if job is not None:
                    job.on_update(msg.update)
            elif kind is CancelWork:
                self.on_cancel(peer, msg)

    def load(self) -> BackendLoad:
        now = self.clock.now()
        if self._load is None or self._load[0] != now:
            s = self.core.stats(now)
            self._load = (now, BackendLoad(
                validation_queued=s.validate.queued, profiling_queued=s.profile.queued,
                validation_running=s.validate.running, profiling_running=s.profile.running,
                validation_workers=s.validate.workers, profiling_workers=s.profile.workers))
        return self._load[1]

    # -- workers --------------------------------------------------------------------------------
    def on_assign(self, peer: bytes, work: AssignWork) -> None:
        self.counts["assigned"] += 1
        sub = work.submission
        program = program_key(sub.candidate_source)
        dt = self.service.sample(sub.problem_name, work.stage, self.eval_rng, program)
        # The worker's spare runners (setting spare_processes): each take gets the oldest, waits
        # for it if it is still starting, and starts its replacement, as EvalWorker does.
        take = self.clock.now()
        count = self.core.settings.spare_processes
        spares = self.spares.setdefault(peer, collections.deque([take] * count))
        for _ in range(self.service.runners_taken(sub.problem_name, work.stage, program, self.eval_rng)):
            if spares:
                take = max(take, spares.popleft())
            else:
                take += self.service.runner_startup(self.eval_rng)   # no spares: start-up in line
            if count:
                spares.append(take + self.service.runner_startup(self.eval_rng))
        self.runner_wait_s += take - self.clock.now()
        dt += take - self.clock.now()
        started = self.clock.wall()
        pool = self.core.workers[peer].pool
        timer = self.clock.call_later(dt, lambda: self.work_done(peer, work.request_id, False))
        self.assignments[peer] = (work, started, timer, pool)

    def on_cancel(self, peer: bytes, msg: CancelWork) -> None:
        held = self.assignments.get(peer)
        if held is None or held[0].request_id != msg.request_id:
            return
        self.counts["cancel_work"] += 1
        held[2].cancel()
        self.clock.call_later(0.0, lambda: self.work_done(peer, msg.request_id, True))

    def work_done(self, peer: bytes, request_id: str, cancelled: bool) -> None:
        work, started, _, pool = self.assignments.pop(peer)
        sub = work.submission
        finished = self.clock.wall()
        self.busy.append((peer.decode(), pool, started - WALL0, finished - WALL0, not cancelled))
        if cancelled:
            verdict = Verdict(stage=work.stage, error="cancelled", code="cancelled")
        else:
            correct = self.correct(sub.candidate_source)
            speedup = (self.service.speedup(sub.problem_name, program_key(sub.candidate_source), self.cfg.seed)
                       if correct and work.stage != "validate" else None)
            verdict = Verdict(stage=work.stage, compiled=True, correct=correct, speedup=speedup)
        key = (sub.job_id, sub.candidate_id, work.stage)
        self.verdicts[key] = self.verdicts.get(key, 0) + 1
        self.counts["verdicts"] += 1
        self.calls += 1
        upd = CandidateUpdate(job_id=sub.job_id, candidate_id=sub.candidate_id, stage=work.stage,
                              verdict=verdict, worker=peer.decode(), started_at=started,
                              finished_at=finished, cancelled=cancelled)
        self.send(peer, WorkDone(call_id=self.calls, request_id=request_id, update=upd))

    # -- jobs -------------------------------------------------------------------------------------
    def start_job(self, plan: JobPlan) -> None:
        job = SimJob(self, plan)
        self.jobs[plan.job_id] = job
        self.calls += 1
        self.send(CLIENT, CreateJob(call_id=self.calls, spec=JobSpec(
            job_id=plan.job_id, problem_name=plan.problem, problem_source="x",
            max_iterations=self.cfg.turns)))
        self.send(job.peer, Hello(role="reasoner", name=plan.job_id))
        job.start_iteration()

    def submit(self, job: SimJob, sub: CandidateSubmission) -> None:
        self.counts["submitted"] += 1
        self.calls += 1
        self.send(job.peer, SubmitCandidate(call_id=self.calls, submission=sub))

    def job_finished(self, job: SimJob) -> None:
        self.done_jobs.append(job)
        self.calls += 1
        self.send(job.peer, ReportJobResult(call_id=self.calls, result=JobResult(
            job_id=job.id, status="succeeded", finished_at=self.clock.wall(),
            summary={"status": job.status})))
        del self.jobs[job.id]
        self.finished_jobs[job.id] = job
        if self.cfg.restart_jobs and self.clock.now() < self.end:
            self.clock.call_later(0.0, lambda: self.start_next(job.plan))

    def start_next(self, previous: JobPlan) -> None:
        self.next_job += 1
        self.start_job(JobPlan(job_id=f"{previous.job_id.split('~')[0]}~{self.next_job}",
                               problem=previous.problem, mode=previous.mode, engine=previous.engine))

    def sample(self) -> None:
        now = self.clock.now()
        row = {"t": now}
        for pool in ("validate", "profile"):
            ws = [w for w in self.core.workers.values() if w.pool == pool]
            row[f"{pool}_workers"] = len(ws)
            row[f"{pool}_busy"] = sum(1 for w in ws if w.busy is not None)
        self.samples.append(row)
        if now + self.cfg.sample_s <= self.end:
            self.clock.call_later(self.cfg.sample_s, self.sample)

    # -- run --------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        real0 = time.perf_counter()
        for plan in self.queue_plans:
            self.start_job(plan)
        self.clock.call_later(self.cfg.tick_s, self.tick)
        self.sample()
        while True:
            due = self.clock.next_due()
            if due is None or due > self.end:
                break
            self.clock.advance_to(due)
            if not self.cfg.restart_jobs and not self.jobs and not self.assignments:
                break
        now = min(self.clock.now(), self.end) if math.isfinite(self.end) else self.clock.now()
        self.elapsed = now
        self.real_s = time.perf_counter() - real0
        return self.results()

    def results(self) -> dict[str, Any]:
        now = self.elapsed
        stats = self.core.stats(now)
        lat = sorted(self.core.feedback_latencies)
        dec = sorted(self.decision_s)

        def q(values: list[float], p: float) -> float | None:
            return values[min(len(values) - 1, int(p * len(values)))] if values else None
        # Busy worker-seconds per pool (the pool a worker was in when it took the work), running
        # work cut at the end.
        busy = list(self.busy) + [(p.decode(), a[3], a[1] - WALL0, now, False) for p, a in self.assignments.items()]
        per_pool = {"validate": 0.0, "profile": 0.0}
        completed_busy = 0.0
        for _, pool, s, e, completed in busy:
            per_pool[pool] += max(0.0, min(e, now) - s)
            completed_busy += max(0.0, min(e, now) - s) if completed else 0.0
        total_busy = sum(per_pool.values())
        jobs = [{"job": j.id, "problem": j.plan.problem, "mode": j.plan.mode, "status": j.status,
                 "end_to_end_s": j.finished - j.started, "profiled": j.profiled,
                 "candidates": len(j.candidates), "best_speedup": j.best,
                 # programs no measured evaluation covers: correct at their label's measured rate,
                 # timed by their problem's evaluations
                 "unmeasured": sum(c["fp"] not in self.service.program_durations for c in j.candidates.values()),
                 "iterations": j.iteration}
                for j in self.done_jobs]
        e2e = sorted(j["end_to_end_s"] for j in jobs)
        return {
            "simulated_s": now, "real_s": self.real_s,
            "eval_gpus": self.cfg.eval_gpus, "reasoning_engines": len(self.engines),
            "pools": "elastic" if self.cfg.elastic else "static",
            "utilization": {
                "all": total_busy / (self.cfg.eval_gpus * now) if now else None,
                # Work that ran to its verdict only (a bench's measured utilization counts no other).
                "completed": completed_busy / (self.cfg.eval_gpus * now) if now else None,
                "validate_core": stats.validate.utilization, "profile_core": stats.profile.utilization,
                "busy_while_waiting": stats.busy_while_waiting, "waiting_s": stats.waiting_s,
            },
            "busy_s": per_pool, "completed_busy_s": completed_busy, "runner_wait_s": self.runner_wait_s,
            "feedback_latency_s": {"p50": q(lat, 0.5), "p95": q(lat, 0.95), "n": len(lat)},
            "feedback_latencies": lat,
            "jobs_finished": len(jobs), "jobs_running": len(self.jobs),
            "end_to_end_s": {"p50": q(e2e, 0.5), "mean": statistics.fmean(e2e) if e2e else None},
            "decision_time_s": {"p50": q(dec, 0.5), "p99": q(dec, 0.99), "calls": len(dec),
                                "total": sum(dec)},
            "reassignments": stats.reassignments, "requests_dropped": stats.requests_dropped,
            "counts": dict(self.counts), "jobs": jobs, "samples": self.samples,
        }
