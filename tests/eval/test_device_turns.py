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
