"""Keeping a LocalCluster's scheduler and nodes running: a process that dies is started again,
up to a budget, after which the supervisor gives up and says what died.

Each `ChildProcess` reports its exit from its monitor thread (`exited`, its `on_exit`); the
supervisor's own thread starts the process again. Restarts come from that one thread, which lives
as long as the cluster, because the parent-death signal (PR_SET_PDEATHSIG, child_process.py) is
tied to the thread that started a child: a child started from a monitor thread would be told its
parent died as soon as that thread returned.

A process dying more than `max_restarts` times (setting `cluster_max_restarts`) within
RESTART_WINDOW_S, or one that cannot be started again, ends the supervision: `failure` says which
process died, its pid and how it ended, and `on_give_up` gets it (once).
"""
from __future__ import annotations

import collections
import logging
import queue
import signal
import threading
import time
from typing import Callable

from specgen.runtime.child_process import ChildProcess
from specgen.runtime.transport import RuntimeFailure

log = logging.getLogger(__name__)

RESTART_WINDOW_S = 600.0   # deaths older than this do not count against the budget (as a node's workers)
_CLOSE = object()


class ProcessDied(RuntimeFailure):
    """A supervised process died and is not started again; the message is one line."""

    def __init__(self, message: str, name: str, pid: int | None, exit_code: int) -> None:
        super().__init__(message)
        self.name = name
        self.pid = pid
        self.exit_code = exit_code


def describe_exit(code: int) -> str:
    """How a process ended, from its `Popen.returncode` (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class ProcessSupervisor:
    def __init__(self, restart: Callable[[ChildProcess], object], max_restarts: int,
                 on_give_up: Callable[[ProcessDied], None] | None = None, *,
                 window_s: float = RESTART_WINDOW_S) -> None:
        """`restart(child)` starts a dead `child` again (from the supervisor's thread)."""
        self._restart = restart
        self.max_restarts = max_restarts
        self._on_give_up = on_give_up
        self.window_s = window_s
        self.failure: ProcessDied | None = None
        self.restarts: list[tuple[str, int | None, int]] = []   # (name, pid, exit code) of each death restarted
        self._deaths: dict[str, collections.deque[float]] = {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()          # held while a death is handled
        self._holding = False
        self._thread = threading.Thread(target=self._run, name="cluster-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def exited(self, child: ChildProcess, code: int) -> None:
        """A ChildProcess's `on_exit` (its monitor thread): an exit nobody asked for is a death."""
        if not child.stopping:
            self._inbox.put((child, code))

    def hold(self) -> None:
        """No more restarts (the cluster is stopping); returns once a restart under way is done."""
        with self._lock:
            self._holding = True

    def close(self) -> None:
        """End the supervisor's thread: only once the processes it started are stopped, since its
        end is their parent-death signal."""
        self.hold()
        self._inbox.put(_CLOSE)
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _CLOSE:
                return
            with self._lock:
                if not self._holding and self.failure is None:
                    self._handle(*item)

    def _handle(self, child: ChildProcess, code: int) -> None:
        now = time.monotonic()
        deaths = self._deaths.setdefault(child.name, collections.deque())
        deaths.append(now)
        while now - deaths[0] > self.window_s:
            deaths.popleft()
        died = f"the local cluster's {child.name} (pid {child.pid}) {describe_exit(code)}"
        if len(deaths) > self.max_restarts:
            count = "" if self.max_restarts == 0 else f", its death number {len(deaths)} within {self.window_s:g} s,"
            self._give_up(ProcessDied(f"{died}{count} and is not started again (setting "
                                      f"cluster_max_restarts={self.max_restarts})", child.name, child.pid, code))
            return
        log.warning("%s: starting it again", died)
        try:
            self._restart(child)
        except Exception as exc:  # noqa: BLE001 - whatever it was, the cluster cannot go on
            # Not a warning: the failure is the owner's to report, in one line (the traceback is
            # for a configured log).
            log.info("cannot start %s again", child.name, exc_info=True)
            why = type(exc).__name__ + (f": {str(exc).splitlines()[0]}" if str(exc).strip() else "")
            self._give_up(ProcessDied(f"{died} and could not be started again ({why})",
                                      child.name, child.pid, code))
            return
        self.restarts.append((child.name, child.pid, code))

    def _give_up(self, failure: ProcessDied) -> None:
        self.failure = failure
        log.info("%s", failure)   # the owner reports it (on_give_up, `failure`)
        if self._on_give_up is not None:
            try:
                self._on_give_up(failure)
            except Exception:  # noqa: BLE001
                log.exception("give-up handler failed")
