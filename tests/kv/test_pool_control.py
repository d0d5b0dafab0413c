"""PoolControlAgent: a RemoteKvPool in host memory served on the control channel over real ZeroMQ
sockets: it reports where it lives and how big it is, and obeys resize requests in whole segments."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from specgen.kv.block_table import block_keys
from specgen.kv.layout import KvLayout
from specgen.kv.pool import RemoteKvPool
from specgen.kv.pool_control import KvPoolController, PoolControlAgent
from specgen.kv.pool_errors import KvPoolError
from tests.kv.kv_helpers import cache_tensors


def _host_pool(segments: int = 4) -> RemoteKvPool:
    layout = KvLayout.from_tensors(cache_tensors("cpu032", 16, "cpu"), 16)
    return RemoteKvPool(layout, devices=[-1], segment_bytes=4 * layout.slot_bytes,
                        max_bytes=segments * 4 * layout.slot_bytes, pool_id="pool-a")


def _step_until(agent: PoolControlAgent, count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(agent.applied) < count:
        assert time.monotonic() < deadline, f"the agent applied {len(agent.applied)} of {count} requests"
        agent.step()
        time.sleep(0.005)


def test_agent_reports_the_pool_and_applies_resizes_in_whole_segments() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    pool = _host_pool()
    pool.grow()
    seg = pool.segment_bytes
    agent = PoolControlAgent(pool, controller.endpoint, stats_interval_s=0.05)
    try:
        agent.step()
        stats = controller.wait_for("pool-a", lambda s: True, timeout_s=5)
        assert (stats.host, stats.devices, stats.capacity_bytes) == (socket.gethostname(), [-1], 4 * seg)
        controller.resize("pool-a", 3 * seg - 1, request_id="room")   # gives back at least what is asked
        _step_until(agent, 1)
        assert pool.capacity_bytes == 2 * seg
        controller.wait_for("pool-a", lambda s: s.capacity_bytes == 2 * seg and s.shrinks == 2, timeout_s=5)
        controller.resize("pool-a", 4 * seg - 1)                      # takes at most what is asked
        _step_until(agent, 2)
        assert pool.capacity_bytes == 3 * seg
        controller.resize("pool-a", None)                             # stats only
        _step_until(agent, 3)
        assert pool.capacity_bytes == 3 * seg
        assert [r.request_id for r, _ in agent.applied] == ["room", "", ""]
        # Shrunk to nothing, the pool still says where it lives (the scheduler pairs it by that).
        controller.resize("pool-a", 0)
        _step_until(agent, 4)
        empty = controller.wait_for("pool-a", lambda s: s.capacity_bytes == 0, timeout_s=5)
        assert empty.devices == [-1] and empty.bytes_by_device == {}
    finally:
        agent.close()
        controller.close()
        pool.close()


def test_a_shrink_held_up_by_a_copy_in_flight_still_reports_what_the_pool_holds(
        caplog: pytest.LogCaptureFixture) -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    pool = _host_pool(segments=1)
    pool.grow()
    pool.store([b"a"], [0]).wait()
    pool.table.acquire(block_keys([b"a"]))           # a load in flight pins the block
    agent = PoolControlAgent(pool, controller.endpoint, shrink_timeout_s=0.05)
    try:
        agent.step()
        controller.wait_for("pool-a", lambda s: True, timeout_s=5)
        controller.resize("pool-a", 0)
        _step_until(agent, 1)
        assert "incomplete" in caplog.text and "shrink_timeout_s" in caplog.text
        assert pool.capacity_bytes == pool.segment_bytes
        controller.wait_for("pool-a", lambda s: s.capacity_bytes == pool.segment_bytes and s.pinned_blocks == 1,
                            timeout_s=5)
    finally:
        pool.table.release(block_keys([b"a"]))
        agent.close()
        controller.close()
        pool.close()


def test_an_agent_needs_an_identity() -> None:
    layout = KvLayout.from_tensors(cache_tensors("cpu032", 4, "cpu"), 4)
    pool = RemoteKvPool(layout, devices=[-1], segment_bytes=layout.slot_bytes, max_bytes=layout.slot_bytes)
    with pytest.raises(KvPoolError, match="identity"):
        PoolControlAgent(pool, "tcp://127.0.0.1:1")


def test_a_resize_sent_before_the_agent_connected_waits_for_it_and_lands() -> None:
    """The resize is sent before the pool's agent exists at all (it connects 0.3 s later): the
    controller waits for the agent's connection instead of failing with no route to it."""
    controller = KvPoolController("tcp://127.0.0.1:*", connect_timeout_s=10)
    pool = _host_pool()
    pool.grow()
    seg = pool.segment_bytes
    agents: list[PoolControlAgent] = []
    late = threading.Timer(0.3, lambda: agents.append(PoolControlAgent(pool, controller.endpoint)))
    late.start()
    try:
        started = time.monotonic()
        controller.resize("pool-a", 2 * seg, request_id="early")
        assert time.monotonic() - started >= 0.25        # it waited for the agent, then went out
        late.join()
        _step_until(agents[0], 1)
        assert [r.request_id for r, _ in agents[0].applied] == ["early"] and pool.capacity_bytes == 2 * seg
    finally:
        late.cancel()
        late.join()
        for agent in agents:
            agent.close()
        controller.close()
        pool.close()


def test_a_resize_for_a_pool_whose_agent_never_connects_fails_naming_it() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*", connect_timeout_s=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(KvPoolError) as raised:
            controller.resize("pool-z", 0)
        assert 0.2 <= time.monotonic() - started < 3
        message = str(raised.value)
        assert message.startswith("pool 'pool-z' is not connected to tcp://127.0.0.1:")
        assert "its agent has not connected within 0.2 s (KvPoolController connect_timeout_s)" in message
        assert "unreachable" not in message.lower()
        with pytest.raises(KvPoolError, match="within 0.05 s"):     # one request's own bound
            controller.resize("pool-z", 0, connect_timeout_s=0.05)
    finally:
        controller.close()


def test_a_resize_for_a_pool_whose_agent_left_says_it_disconnected() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*", connect_timeout_s=0.2)
    pool = _host_pool()
    agent = PoolControlAgent(pool, controller.endpoint)
    try:
        agent.step()
        controller.wait_for("pool-a", lambda s: True, timeout_s=5)
        agent.close()
        deadline = time.monotonic() + 5
        while True:     # the ROUTER drops the route once it sees the connection close
            try:
                controller.resize("pool-a", None, connect_timeout_s=0)
            except KvPoolError as exc:
                assert "which reported stats before, has disconnected" in str(exc)
                break
            assert time.monotonic() < deadline, "the controller still routes to a closed agent"
            time.sleep(0.02)
    finally:
        agent.close()
        controller.close()
        pool.close()
