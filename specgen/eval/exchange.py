"""The judge's requests to its two runners (eval/judge.py): each sent in a turn on the device,
within the evaluation's deadline, its reply checked for type; a request that gets no fit reply
stops the evaluation with the verdict saying why, and whose fault it was.

Workers sharing the GPU take turns (eval/device_turns.py): between this judge's requests its
candidate runner is stopped, so nothing of it runs beside another worker's timing.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Iterator

import msgspec

from specgen.eval.device_turns import DeviceTurns
from specgen.eval.findings import Findings, Stop
from specgen.eval.runner_process import Runner
from specgen.eval.timing import Windows
from specgen.messages import Trial, TrialDone, TrialStage


@contextlib.contextmanager
def _not_preempting() -> Iterator[None]:
    """This thread as SCHED_BATCH while it times. Each stage message of a timed call wakes the
    judge; on a host with few cores a woken thread of the normal policy may take the core of the
    runner that sent it, and the judge's reading of the message then lies in the runner's next
    window. A batch thread is not run ahead of the thread it would preempt."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):          # not Linux, or not allowed: times as before
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


class Exchange:
    """One evaluation's channel to its reference and candidate runners (see the module doc)."""

    def __init__(self, findings: Findings, reference: Runner, candidate: Runner, timeout_s: float,
                 cancelled: Callable[[], bool], turns: DeviceTurns | None) -> None:
        self.findings = findings
        self.reference = reference
        self.candidate = candidate
        self.timeout_s = timeout_s
        self.cancelled = cancelled
        self.deadline = time.monotonic() + timeout_s
        self.turns = turns or DeviceTurns("cpu")
        self._candidate_running = not self.turns.active
        if self.turns.active:
            candidate.pause()

    @contextlib.contextmanager
    def turn(self, exclusive: bool = False, candidate: bool = True) -> Iterator[None]:
        """A request (shared) or a timing (exclusive) on a GPU other workers may share, with the
        candidate runner let run for it when `candidate`."""
        seconds = self.findings.seconds
        # Apart, so that a bench can tell which wait costs: a request waiting for another
        # worker's timing (turn_wait), or a timing waiting for other workers' requests in flight
        # (timing_wait).
        waited = "timing_wait" if exclusive else "turn_wait"
        began = time.perf_counter()
        with self.turns.exclusive() if exclusive else self.turns.shared(), \
                contextlib.ExitStack() as timing:
            seconds[waited] = seconds.get(waited, 0.0) + time.perf_counter() - began
            if exclusive:
                timing.enter_context(_not_preempting())
            outer = candidate and not self._candidate_running
            if outer:
                self.candidate.resume()
                self._candidate_running = True
            try:
                yield
            finally:
                if outer:
                    self.candidate.pause()
                    self._candidate_running = False

    def ask(self, runner: Runner, message: Any, expect: type, fds: tuple[int, ...] = ()) -> Any:
        """Send one request and return its reply, or stop: the verdict says why (and whose)."""
        with self.turn(candidate=runner is self.candidate):
            began = time.perf_counter()
            received, why = runner.request(message, self.deadline, self.timeout_setting(),
                                           self.polled(runner), fds)
            # Where a verdict's time goes, per runner and request ("reference Compare").
            key = f"{runner.role} {type(message).__name__}"
            seconds = self.findings.seconds
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
        if received is None:
            self.no_reply(runner, why)
        if not isinstance(received.message, expect):
            runner.kill()
            self.findings.fail(f"the {runner.role} runner answered {type(received.message).__name__} "
                               f"to {type(message).__name__}")
            raise Stop
        return received

    def polled(self, runner: Runner) -> Callable[[], bool]:
        """The check made while a request's reply is awaited: give way to another worker's
        timing (eval/device_turns.py; the seconds count as waiting for a turn), then whether
        the evaluation was cancelled."""
        def check() -> bool:
            given = self.turns.give_way(runner.pause, runner.resume)
            if given:
                seconds = self.findings.seconds
                seconds["turn_wait"] = seconds.get("turn_wait", 0.0) + given
            return self.cancelled()
        return check

    def timed(self, runner: Runner, trial: Trial) -> tuple[TrialDone, Windows | None]:
        """One timed call, staged (Trial.staged): its reply and its windows in ms, from the
        request to the kernel's receive stamps on the two stages and on the reply. A reply with
        an error may come in place of a stage (the inputs or the call raised): no windows then."""
        # The reference runner outlives the evaluation: a cancel waits for its whole reply, so
        # that it is in step with the next request (a candidate runner is killed at once).
        kept = runner.role == "reference"
        stamps = [runner.send(msgspec.structs.replace(trial, staged=True))]
        for stage in ("made", "called", None):
            received, why = runner.receive(self.deadline, self.timeout_setting(),
                                           (lambda: False) if kept else self.cancelled)
            if received is None:
                self.no_reply(runner, why, " (while timed)")
            message = received.message
            stamps.append(received.stamp_ns if received.stamp_ns is not None
                          else time.clock_gettime_ns(time.CLOCK_REALTIME))
            if isinstance(message, TrialDone) and (stage is None or message.error):
                if kept and self.cancelled():
                    self.no_reply(runner, "cancelled")
                if stage is not None:
                    return message, None
                made, call, digest = ((b - a) / 1e6 for a, b in zip(stamps, stamps[1:]))
                return message, Windows(made=made, call=call, digest=digest)
            if not (isinstance(message, TrialStage) and message.stage == stage
                    and message.index == trial.index):
                runner.kill()
                what = f"stage {message.stage!r} of call {message.index}" \
                    if isinstance(message, TrialStage) else type(message).__name__
                expected = f"stage {stage!r} of call {trial.index}" if stage else "TrialDone"
                self.findings.fail(f"the {runner.role} runner answered {what} to a timed call, "
                                   f"where {expected} was due")
                raise Stop
        raise AssertionError("unreachable")

    def timeout_setting(self) -> str:
        return f"EvalOptions.timeout_s = {self.timeout_s:g} s"

    def no_reply(self, runner: Runner, why: str | None, when: str = "") -> None:
        """Stop for a request that got no reply: the verdict says why, and whose fault it was.
        A runner killed by a cancel reads as cancelled, not as a death."""
        verdict, fail = self.findings.verdict, self.findings.fail
        if why == "cancelled" or self.cancelled():
            verdict.error, verdict.code = "cancelled", "cancelled"
        elif runner.role == "reference":
            fail(f"the reference runner failed: {why}{when} (the reference, not the candidate)")
            verdict.code = verdict.code or "reference"
        elif why is not None and why.startswith("the candidate runner"):
            fail(f"{why}{when}")
        else:
            fail(f"candidate {why}{when}")
            if why is not None and why.startswith("timed out"):
                verdict.code = verdict.code or "timeout"
        raise Stop
