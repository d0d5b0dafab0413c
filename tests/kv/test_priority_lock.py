"""PriorityLock: an urgent thread gets the lock before ordinary acquirers that arrive while it waits."""
from __future__ import annotations

import threading
import time

from specgen.kv.priority_lock import PriorityLock


def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_reentrant_for_ordinary_and_urgent_holders():
    lock = PriorityLock()
    with lock:
        with lock:
            pass
    with lock.urgent():
        with lock:
            with lock:
                pass
    # Released fully: another thread takes it at once.
    got = threading.Event()
    t = threading.Thread(target=lambda: (lock.acquire(), got.set(), lock.release()))
    t.start()
    t.join(5)
    assert got.is_set()


def test_urgent_waiter_goes_before_ordinary_ones_that_arrive_meanwhile():
    lock = PriorityLock()
    order: list[str] = []

    def take(name: str, urgent: bool) -> None:
        if urgent:
            with lock.urgent(), lock:
                order.append(name)
        else:
            with lock:
                order.append(name)

    lock.acquire()
    urgent = threading.Thread(target=take, args=("urgent", True))
    urgent.start()
    wait_until(lambda: lock._announced == 1)
    ordinary = [threading.Thread(target=take, args=(f"ordinary{i}", False)) for i in range(3)]
    for t in ordinary:
        t.start()
    time.sleep(0.05)            # the ordinary threads are at the gate by now (the order holds either way)
    lock.release()
    for t in (urgent, *ordinary):
        t.join(5)
    assert order[0] == "urgent" and sorted(order[1:]) == ["ordinary0", "ordinary1", "ordinary2"]


def test_holder_reenters_while_an_urgent_thread_waits():
    # The holder's nested acquisition must not queue behind the announcement (that would deadlock).
    lock = PriorityLock()
    lock.acquire()

    def take_urgently() -> None:
        with lock.urgent(), lock:
            pass

    urgent = threading.Thread(target=take_urgently)
    urgent.start()
    wait_until(lambda: lock._announced == 1)
    done = threading.Event()

    def nested() -> None:
        with lock:
            done.set()

    nested()
    assert done.is_set()
    lock.release()
    urgent.join(5)
    assert not urgent.is_alive()


def test_urgent_thread_is_not_starved_by_a_thread_that_takes_the_lock_without_pause():
    lock = PriorityLock()
    stop = threading.Event()
    spins = [0]

    def hammer() -> None:
        while not stop.is_set():
            with lock:
                spins[0] += 1

    t = threading.Thread(target=hammer)
    t.start()
    try:
        wait_until(lambda: spins[0] > 1000)
        waits = []
        for _ in range(50):
            t0 = time.perf_counter()
            with lock.urgent(), lock:
                waits.append(time.perf_counter() - t0)
            time.sleep(0.001)
        assert sorted(waits)[len(waits) // 2] < 0.05, waits
        assert spins[0] > 1000
    finally:
        stop.set()
        t.join(5)
