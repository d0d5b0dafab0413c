"""Workers sharing a GPU take turns to time it (specgen/eval/device_turns.py), and a judge stops
its candidate runner between requests (Runner.pause)."""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from specgen.eval.containment import tree_pids
from specgen.eval.device_turns import DeviceTurns, host_gpu
from specgen.eval.runner_process import Runner


def test_the_host_name_of_a_gpu_follows_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert host_gpu("cuda:1") == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert host_gpu("cuda:1") == "1"
    assert host_gpu("cpu") is None
    assert not DeviceTurns("cpu").active


def test_a_timing_excludes_other_workers_requests(tmp_path: Path):
    timer, other = DeviceTurns("cuda:0", tmp_path), DeviceTurns("cuda:0", tmp_path)
    events: list[str] = []
    inside = threading.Event()

    def time_it() -> None:
        with timer.exclusive():
            inside.set()
            events.append("timing starts")
            time.sleep(0.3)
            events.append("timing ends")

    thread = threading.Thread(target=time_it)
    thread.start()
    inside.wait(5)
    with other.shared():
        events.append("other's request")
    thread.join()
    assert events == ["timing starts", "timing ends", "other's request"]


def test_requests_of_several_workers_overlap(tmp_path: Path):
    first, second = DeviceTurns("cuda:0", tmp_path), DeviceTurns("cuda:0", tmp_path)
    with first.shared():
        began = time.monotonic()
        with second.shared():
            pass
    assert time.monotonic() - began < 0.5


def test_a_waiting_timing_is_not_kept_waiting_by_new_requests(tmp_path: Path):
    reader, writer, late = (DeviceTurns("cuda:0", tmp_path) for _ in range(3))
    order: list[str] = []

    def time_it() -> None:
        with writer.exclusive():
            order.append("timing")
            time.sleep(0.2)
            order.append("timing done")

    def request() -> None:
        with late.shared():
            order.append("late request")

    with reader.shared():
        waiting = threading.Thread(target=time_it)
        waiting.start()
        time.sleep(0.2)                      # the timing now waits, holding the gate
        came = threading.Thread(target=request)
        came.start()
        time.sleep(0.2)
        assert order == []                   # the late request queues behind the timing
    waiting.join(5)
    came.join(5)
    assert order == ["timing", "timing done", "late request"]


def test_a_timing_inside_its_own_worker_does_not_turn_shared(tmp_path: Path):
    turns, other = DeviceTurns("cuda:0", tmp_path), DeviceTurns("cuda:0", tmp_path)
    got = threading.Event()

    def request() -> None:
        with other.shared():
            got.set()

    with turns.exclusive():
        with turns.shared():                 # a no-op, not a downgrade of the lock
            pass
        thread = threading.Thread(target=request)
        thread.start()
        assert not got.wait(0.3)
    assert got.wait(5)
    thread.join()


def _states(root: int) -> set[str]:
    states = set()
    for pid in tree_pids(root):
        try:
            states.add(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return states


def test_a_paused_runner_and_its_children_are_stopped_until_resumed(tmp_path: Path):
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        time.sleep(0.3)
        runner = Runner("candidate", channel=None, log_path=tmp_path / "log",  # type: ignore
                        template=None, memory_limit_mb=None)                    # type: ignore
        runner.init_pid = proc.pid
        assert len(tree_pids(proc.pid)) == 3
        runner.pause()
        time.sleep(0.1)
        assert _states(proc.pid) == {"T"}
        runner.resume()
        time.sleep(0.1)
        assert "T" not in _states(proc.pid)
    finally:
        proc.kill()
        subprocess.run(["pkill", "-f", "sleep 30"], check=False)
        proc.wait()


class _Runner:
    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


def test_a_verdict_tells_waiting_for_a_timing_from_a_timing_waiting(tmp_path: Path):
    from specgen.eval.exchange import Exchange
    from specgen.eval.findings import Findings

    findings = Findings("cuda:0", cuda=True)
    exchange = Exchange(findings, _Runner(), _Runner(), 60.0, lambda: False,  # type: ignore
                        DeviceTurns("cuda:0", tmp_path))
    other = DeviceTurns("cuda:0", tmp_path)
    held = threading.Event()

    def hold(exclusive: bool) -> None:
        with other.exclusive() if exclusive else other.shared():
            held.set()
            time.sleep(0.3)

    for exclusive, waited in ((True, "turn_wait"), (False, "timing_wait")):
        held.clear()
        thread = threading.Thread(target=hold, args=(exclusive,))
        thread.start()
        held.wait(5)
        with exchange.turn(exclusive=not exclusive):
            pass
        thread.join()
        assert findings.seconds[waited] > 0.2
    exchange.turns.close()
    other.close()


def test_a_request_in_flight_gives_way_to_a_timing_and_takes_its_turn_back(tmp_path: Path):
    reader, writer, later = (DeviceTurns("cuda:0", tmp_path) for _ in range(3))
    events: list = []
    pause, resume = (lambda: events.append("pause")), (lambda: events.append("resume"))

    def time_it() -> None:
        came = time.monotonic()
        with writer.exclusive():
            events.append(("timing", time.monotonic() - came))
            time.sleep(0.2)
            events.append("timing done")

    later_timed = threading.Event()

    def time_later() -> None:
        with later.exclusive():
            later_timed.set()

    with reader.shared():
        assert reader.give_way(pause, resume) == 0.0        # no timing waits: nothing stops
        timing = threading.Thread(target=time_it)
        timing.start()
        time.sleep(0.1)
        given, deadline = 0.0, time.monotonic() + 5
        while not given and time.monotonic() < deadline:     # the judge's polls
            given = reader.give_way(pause, resume)
            time.sleep(0.02)
        timing.join(5)
        assert given >= 0.15
        # The shared hold is back: a timing that comes now waits for this request.
        waiting = threading.Thread(target=time_later)
        waiting.start()
        assert not later_timed.wait(0.3)
    assert later_timed.wait(5)
    waiting.join(5)
    assert events[0] == "pause" and events[1][0] == "timing" and events[1][1] < 0.5
    assert events[2:] == ["timing done", "resume"]


def test_no_way_is_given_outside_a_request_or_inside_the_workers_own_timing(tmp_path: Path):
    turns, other = DeviceTurns("cuda:0", tmp_path), DeviceTurns("cuda:0", tmp_path)
    stopped: list[str] = []
    with turns.exclusive():
        waiting = threading.Thread(target=lambda: other.exclusive().__enter__())
        waiting.start()                  # another timing waits at the gate
        time.sleep(0.1)
        assert not turns.timing_waits()  # its own gate, not another's timing
        with turns.shared():             # a no-op inside its own timing
            assert turns.give_way(lambda: stopped.append("x"), lambda: None) == 0.0
    waiting.join(5)
    assert turns.give_way(lambda: stopped.append("x"), lambda: None) == 0.0
    assert stopped == []
    assert not DeviceTurns("cpu").give_way(lambda: stopped.append("x"), lambda: None)
    other.close()
    turns.close()


def test_a_judge_awaiting_a_reply_gives_way_and_counts_it_as_waiting_for_a_turn(tmp_path: Path):
    from specgen.eval.exchange import Exchange
    from specgen.eval.findings import Findings

    class Counting(_Runner):
        paused = 0

        def pause(self) -> None:
            self.paused += 1

    runner = Counting()
    findings = Findings("cuda:0", cuda=True)
    exchange = Exchange(findings, runner, _Runner(), 60.0, lambda: False,  # type: ignore
                        DeviceTurns("cuda:0", tmp_path))
    other = DeviceTurns("cuda:0", tmp_path)

    def time_it() -> None:
        with other.exclusive():
            time.sleep(0.2)

    with exchange.turn(candidate=False):
        check = exchange.polled(runner)      # type: ignore[arg-type]
        assert check() is False                  # not cancelled, and no timing waits
        assert findings.seconds.get("turn_wait", 0.0) < 0.05
        before = findings.seconds.get("turn_wait", 0.0)
        thread = threading.Thread(target=time_it)
        thread.start()
        time.sleep(0.1)
        assert check() is False              # not cancelled; the timing ran meanwhile
        thread.join(5)
    assert runner.paused == 1
    assert findings.seconds["turn_wait"] - before > 0.1
    exchange.turns.close()
    other.close()
