"""PoolAgentProcess: a RemoteKvPool served on the control channel from an agent process of its own,
its resizes applied by the pool's native give-back thread (real ZeroMQ, a real child process, a real
socket pair), while this process keeps loading blocks."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout
from specgen.kv.pool import RemoteKvPool
from specgen.kv.pool_agent import OP_RESIZE, OP_STATS, REPLY, REQUEST, PoolAgentProcess, PoolLink, decode_reply
from specgen.kv.pool_control import KvPoolController
from tests.kv.kv_helpers import ByteViews, cache_tensors

SLOTS = 8


def _host_pool(segments: int = 4, num_blocks: int = 64):
    tensors = cache_tensors("cpu032", num_blocks, "cpu")
    layout = KvLayout.from_tensors(tensors, num_blocks)
    pool = RemoteKvPool(layout, devices=[-1], segment_bytes=SLOTS * layout.slot_bytes,
                        max_bytes=segments * SLOTS * layout.slot_bytes, pool_id="pool-p")
    return pool, tensors, ByteViews(tensors, layout)


def test_the_agent_process_reports_and_resizes_the_pool() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    pool, _, _ = _host_pool()
    pool.grow()
    seg = pool.segment_bytes
    pool.store(np.arange(1, 3 * SLOTS + 1, dtype=np.uint64), np.arange(3 * SLOTS)).wait()
    agent = PoolAgentProcess(pool, controller.endpoint, stats_interval_s=0.05)
    try:
        agent.wait_started()
        stats = controller.wait_for("pool-p", lambda s: True, timeout_s=10)
        assert (stats.host, stats.devices, stats.capacity_bytes) == (socket.gethostname(), [-1], 4 * seg)
        assert stats.used_blocks == 3 * SLOTS and stats.stores == 3 * SLOTS and stats.segments == 4
        controller.resize("pool-p", 2 * seg - 1)                      # gives back at least what is asked
        shrunk = controller.wait_for("pool-p", lambda s: s.capacity_bytes == seg, timeout_s=10)
        assert pool.capacity_bytes == seg and shrunk.shrinks == 3 and shrunk.bytes_by_device == {-1: seg}
        # The blocks that fit in what is left moved there (the most recently used); the rest went.
        assert shrunk.used_blocks == SLOTS and pool.lookup(np.arange(2 * SLOTS + 1, 3 * SLOTS + 1,
                                                                     dtype=np.uint64)) == SLOTS
        controller.resize("pool-p", 3 * seg)                          # grows back
        controller.wait_for("pool-p", lambda s: s.capacity_bytes == 3 * seg, timeout_s=10)
        assert pool.capacity_bytes == 3 * seg
    finally:
        agent.close()
        controller.close()
        pool.close()
    assert agent.process.returncode == 0


def test_loads_in_flight_during_a_give_back_read_only_their_own_bytes() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    pool, tensors, views = _host_pool(segments=4, num_blocks=64)
    pool.grow()
    originals = {}
    keys = np.arange(1, 4 * SLOTS + 1, dtype=np.uint64)
    for i, key in enumerate(keys):
        originals[int(key)] = views.block(i).clone()
    pool.store(keys, np.arange(len(keys))).wait()
    stop = threading.Event()
    wrong, loaded = [], [0]

    def loader() -> None:
        rng = np.random.default_rng(0)
        dst = np.arange(48, 64, dtype=np.int64)
        while not stop.is_set():
            start = int(rng.integers(0, len(keys) - 4))
            ask = keys[start:start + 4]
            copy = pool.load(ask, dst[:4])
            copy.wait()
            for j, key in enumerate(copy.keys):
                loaded[0] += 1
                if not torch.equal(views.block(int(dst[j])), originals[int(key)]):
                    wrong.append(int(key))

    agent = PoolAgentProcess(pool, controller.endpoint, stats_interval_s=0.05)
    thread = threading.Thread(target=loader, daemon=True)
    try:
        agent.wait_started()
        thread.start()
        seg = pool.segment_bytes
        for target in (2 * seg, 4 * seg, seg, 4 * seg):
            controller.resize("pool-p", target)
            controller.wait_for("pool-p", lambda s, t=target: s.capacity_bytes == t, timeout_s=10)
            pool.store(keys, np.arange(len(keys))).wait()            # refill what was evicted
    finally:
        stop.set()
        thread.join(10)
        agent.close()
        controller.close()
        pool.close()
    assert loaded[0] > 0 and wrong == []


def test_the_agent_exits_when_the_pool_stops_serving() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    pool, _, _ = _host_pool()
    agent = PoolAgentProcess(pool, controller.endpoint)
    try:
        agent.wait_started()
        agent._server.stop()
        assert agent.process.wait(10) == 0
    finally:
        agent.close()
        controller.close()
        pool.close()


def test_the_give_back_thread_answers_a_malformed_request_with_what_is_wrong() -> None:
    pool, _, _ = _host_pool()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = kv_extension().PoolServer(pool.native, ours.detach(), 1.0)
    try:
        theirs.send(b"short")
        reply = decode_reply(theirs.recv(REPLY.size + 1))
        assert reply["status"] == "failed" and f"expected {REQUEST.size}" in reply["message"]
        theirs.send(REQUEST.pack(99, 1, 0))
        reply = decode_reply(theirs.recv(REPLY.size + 1))
        assert reply["status"] == "failed" and "unknown request op 99" in reply["message"]
        link = PoolLink(theirs)
        assert link.ask(OP_RESIZE, 2 * pool.segment_bytes)["added_bytes"] == 2 * pool.segment_bytes
        assert link.ask(OP_STATS)["capacity_bytes"] == 2 * pool.segment_bytes == pool.capacity_bytes
    finally:
        server.stop()
        theirs.close()
        pool.close()


def test_a_give_back_blocked_by_a_pin_times_out_and_says_so() -> None:
    pool, _, _ = _host_pool(segments=1)
    pool.grow()
    pool.store(np.array([7], dtype=np.uint64), [0]).wait()
    pool.table.acquire(np.array([7], dtype=np.uint64))              # a load in flight pins the block
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = kv_extension().PoolServer(pool.native, ours.detach(), 0.05)
    try:
        started = time.monotonic()
        reply = PoolLink(theirs).ask(OP_RESIZE, 0)
        assert reply["status"] == "timed out" and "shrink_timeout_s" in reply["message"]
        assert time.monotonic() - started < 5 and reply["capacity_bytes"] == pool.segment_bytes
    finally:
        pool.table.release(np.array([7], dtype=np.uint64))
        server.stop()
        theirs.close()
        pool.close()


@pytest.mark.parametrize("field", ["capacity_bytes", "hits"])
def test_reply_layout_matches_the_extension(field: str) -> None:
    ext = kv_extension()
    assert (REQUEST.size, REPLY.size) == (ext.POOL_REQUEST_BYTES, ext.POOL_REPLY_BYTES)
    pool, _, _ = _host_pool()
    pool.grow()
    pool.store(np.array([1, 2], dtype=np.uint64), [0, 1]).wait()
    pool.lookup(np.array([1, 2, 3], dtype=np.uint64))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = ext.PoolServer(pool.native, ours.detach(), 1.0)
    try:
        reply = PoolLink(theirs).ask(OP_STATS)
        assert reply[field] == getattr(pool.stats(), field)
    finally:
        server.stop()
        theirs.close()
        pool.close()


@pytest.mark.gpu
def test_gpu_give_back_through_the_agent_process_with_loads_in_flight() -> None:
    """The pool in GPU memory: the native thread frees segments with cudaFree while this process
    keeps loads in flight on the same device; every load reads only its own block's bytes."""
    num_blocks = 256
    tensors = cache_tensors("flash033", num_blocks, "cuda:0", layers=2)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    views = ByteViews(tensors, layout)
    slots = 64
    free, _ = kv_extension().mem_get_info(0)
    pool = RemoteKvPool(layout, devices=[0], segment_bytes=slots * layout.slot_bytes,
                        max_bytes=4 * slots * layout.slot_bytes, headroom_bytes=min(free // 2, 8 << 30),
                        pool_id="pool-g")
    assert pool.grow() == 4 * pool.segment_bytes
    keys = np.arange(1, 4 * slots + 1, dtype=np.uint64)
    originals = {int(k): views.block(i % 128).clone() for i, k in enumerate(keys)}
    stream = torch.cuda.current_stream(0).cuda_stream

    def refill() -> None:
        for i in range(0, len(keys), 128):
            pool.store(keys[i:i + 128], np.arange(128), stream=stream).wait()

    refill()
    controller = KvPoolController("tcp://127.0.0.1:*")
    stop = threading.Event()
    wrong, loaded = [], [0]

    def loader() -> None:
        rng = np.random.default_rng(1)
        dst = np.arange(192, 256, dtype=np.int64)
        while not stop.is_set():
            start = int(rng.integers(0, len(keys) - 8))
            copies = [pool.load(keys[start + j * 2:start + j * 2 + 2], dst[j * 2:j * 2 + 2], stream=stream,
                                method="kernel") for j in range(4)]
            for copy in copies:
                copy.wait()
            for j, copy in enumerate(copies):
                for n, key in enumerate(copy.keys):
                    loaded[0] += 1
                    if not torch.equal(views.block(int(dst[j * 2 + n])), originals[int(key)]):
                        wrong.append(int(key))

    agent = PoolAgentProcess(pool, controller.endpoint, stats_interval_s=0.05)
    thread = threading.Thread(target=loader, daemon=True)
    try:
        agent.wait_started()
        thread.start()
        seg = pool.segment_bytes
        for target in (seg, 4 * seg, 2 * seg, 4 * seg):
            controller.resize("pool-g", target)
            controller.wait_for("pool-g", lambda s, t=target: s.capacity_bytes == t, timeout_s=30)
            refill()
    finally:
        stop.set()
        thread.join(30)
        agent.close()
        controller.close()
        pool.close()
    assert loaded[0] > 0 and wrong == []
