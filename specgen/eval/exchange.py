"""The judge's requests to its two runners (eval/judge.py): each sent in a turn on the device,
within the evaluation's deadline, its reply checked for type; a request that gets no fit reply
stops the evaluation with the verdict saying why, and whose fault it was. A call goes through the
reference runner's arena (eval/arena.py): inputs handed over, the call, the outputs read; a timed
call is one window, from handing over to the reply.

Workers sharing the GPU take turns (eval/device_turns.py): between this judge's requests its
candidate runner is stopped, so nothing of it runs beside another worker's timing.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Iterator

from specgen.eval.device_turns import DeviceTurns
from specgen.eval.findings import Findings, Stop
from specgen.eval.runner_process import Runner
from specgen.eval.arena import claimed
from specgen.messages import (ArenaMade, ArenaMapped, Awake, Call, Called, Hand, Handed, Look,
                              Looked, MakeArena, MapArena, Read, ReadDone, Slot, Wake)


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
        self.index = 0                              # the calls handed over, numbered
        self.arena = (0, 0)                         # its regions' sizes, as the reference made them
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

    def ask(self, runner: Runner, message: Any, expect: type, fds: tuple[int, ...] = (),
            fds_expected: int = 0) -> Any:
        """Send one request and return its reply, or stop: the verdict says why (and whose).
        Descriptors beyond `fds_expected` that come with the reply are closed on arrival."""
        with self.turn(candidate=runner is self.candidate):
            began = time.perf_counter()
            received, why = runner.request(message, self.deadline, self.timeout_setting(),
                                           self.polled(runner), fds, fds_expected=fds_expected)
            # Where a verdict's time goes, per runner and request ("reference Compare").
            key = f"{runner.role} {type(message).__name__}"
            seconds = self.findings.seconds
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
        if received is None:
            self.no_reply(runner, why)
        if not isinstance(received.message, expect):
            for fd in received.fds:
                os.close(fd)
            self.unexpected(runner, received.message, type(message))
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

    # ------------------------------------------------------------------ the arena
    def make_arena(self, input_bytes: int, output_bytes: int) -> None:
        """The reference runner's arena at least this large, mapped in the candidate's runner."""
        received = self.ask(self.reference, MakeArena(input_bytes=input_bytes,
                                                      output_bytes=output_bytes),
                            ArenaMade, fds_expected=2)
        self._map(received.message, received.fds)

    def _map(self, made: ArenaMade | Handed, fds: list[int]) -> None:
        """Hand the reference runner's arena descriptors `fds` to the candidate's runner."""
        try:
            if len(fds) != 2:
                self.findings.fail(f"the reference runner sent {len(fds)} arena descriptors, not 2 "
                                   "(the reference, not the candidate)")
                self.findings.verdict.code = self.findings.verdict.code or "reference"
                raise Stop
            if isinstance(made, ArenaMade):
                self.arena = (made.input_bytes, made.output_bytes)
            mapped: ArenaMapped = self.ask(self.candidate, MapArena(
                input_bytes=self.arena[0], output_bytes=self.arena[1]), ArenaMapped,
                fds=tuple(fds)).message
        finally:
            for fd in fds:
                os.close(fd)
        if mapped.error:
            self.findings.fail(f"the candidate's runner: {mapped.error}")
            raise Stop

    def hand(self, seed: int, shape: dict[str, int] | None = None, early: bool = False,
             rejected_ok: bool = False) -> Handed:
        """The reference runner makes a call's inputs and hands them over in the arena (untimed);
        an arena it had to grow is mapped in the candidate's runner. A problem that raises on
        them stops the evaluation (its fault), unless `rejected_ok`: then the reply says why."""
        self.index += 1
        received = self.ask(self.reference, Hand(index=self.index, seed=seed, shape=shape or {},
                                                 early=early), Handed, fds_expected=2)
        if rejected_ok and received.message.error and received.message.index == self.index:
            for fd in received.fds:
                os.close(fd)
            return received.message
        return self._handed(received)

    def _handed(self, received: Any) -> Handed:
        handed: Handed = received.message
        if handed.index != self.index or handed.error:
            for fd in received.fds:
                os.close(fd)
            self.findings.fail(f"{handed.error or 'the reference runner answered another call'} "
                               "(the reference, not the candidate)")
            self.findings.verdict.code = self.findings.verdict.code or "reference"
            raise Stop
        if handed.grown:
            if len(handed.arena) == 2:
                # The regions as made (a GPU's are whole allocation granules, and are mapped so).
                self.arena = (handed.arena[0], handed.arena[1])
            self._map(handed, received.fds)
        else:
            for fd in received.fds:
                os.close(fd)
        return handed

    def call(self, runner: Runner, handed: Handed, **flags: Any) -> Called:
        """`runner` calls its model on the inputs handed over (untimed)."""
        done = self.ask(runner, Call(index=handed.index, args=handed.args, **flags), Called).message
        return self._echoed(runner, done, handed.index)

    def _echoed(self, runner: Runner, done: Called, index: int) -> Called:
        """A reply to call `index`, not a stale or early one."""
        if done.index != index:
            runner.kill()
            self.findings.fail(f"the {runner.role} runner answered call {done.index} to call "
                               f"{index}")
            raise Stop
        return done

    def look(self, done: Called, slots: list[Slot], digest_seed: int) -> None:
        """The reference runner reads the outputs the call left in the arena (untimed)."""
        looked: Looked = self.ask(self.reference, Look(index=done.index, digest_seed=digest_seed,
                                                       outputs=slots), Looked).message
        self._looked(looked, done.index)

    def _looked(self, looked: Looked, index: int) -> None:
        if looked.index != index:
            self.findings.fail("the reference runner answered another call (the reference, not "
                               "the candidate)")
            self.findings.verdict.code = self.findings.verdict.code or "reference"
            raise Stop
        if looked.error:
            self.findings.fail(looked.error)
            raise Stop

    def timed(self, runner: Runner, seed: int, digest_seed: int, **flags: Any
              ) -> tuple[Called, float | None]:
        """One timed call in `runner` on fresh inputs made from `seed`: its reply and its window in
        ms, from sending the reference runner the request that hands the inputs over to the
        kernel's receive stamp on its reply to `Look`, the outputs read (eval/timing.py). No
        window when the call raised or its outputs cannot be read (the reply says why)."""
        self.index += 1
        # Awake and waiting for its call before the window opens, whatever came before (the
        # reading of its last call can outlast its wait without sleeping).
        runner.send(Wake())
        self._receive(runner, Wake, Awake, " (before a timed call)")
        # The reference runner outlives the evaluation: a cancel waits for its whole reply, so
        # that it is in step with the next request (a candidate runner is killed at once).
        began = self.reference.send(Hand(index=self.index, seed=seed))
        handed = self._handed(self._receive(self.reference, Hand, Handed,
                                            " (handing over a timed call's inputs)", 2))
        runner.send(Call(index=handed.index, args=handed.args, **flags))
        done = self._echoed(runner, self._receive(runner, Call, Called, " (while timed)").message,
                            handed.index)
        slots = claimed(done.outputs, self.arena[1])
        if done.error or isinstance(slots, str):
            return done, None
        self.reference.send(Look(index=done.index, digest_seed=digest_seed, outputs=slots))
        received = self._receive(self.reference, Look, Looked, " (reading a timed call's outputs)")
        self._looked(received.message, done.index)
        ended = received.stamp_ns if received.stamp_ns is not None \
            else time.clock_gettime_ns(time.CLOCK_REALTIME)
        return done, (ended - began) / 1e6

    def _receive(self, runner: Runner, request: type, expect: type, when: str,
                 fds_expected: int = 0) -> Any:
        """The reply to a request sent already (a timed call's), or stop."""
        kept = runner.role == "reference"
        received, why = runner.receive(self.deadline, self.timeout_setting(),
                                       (lambda: False) if kept else self.cancelled,
                                       fds_expected=fds_expected)
        if received is None:
            self.no_reply(runner, why, when)
        if kept and self.cancelled():
            for fd in received.fds:
                os.close(fd)
            self.no_reply(runner, "cancelled")
        if not isinstance(received.message, expect):
            for fd in received.fds:
                os.close(fd)
            self.unexpected(runner, received.message, request)
        return received

    def read(self, done: Called, full: bool, atol: float | None, rtol: float | None) -> ReadDone:
        """The reference runner judges the outputs it looked at."""
        return self.ask(self.reference, Read(index=done.index, full=full, atol=atol, rtol=rtol),
                        ReadDone).message

    def unexpected(self, runner: Runner, message: Any, request: type) -> None:
        runner.kill()
        self.findings.fail(f"the {runner.role} runner answered {type(message).__name__} "
                           f"to {request.__name__}")
        raise Stop

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
