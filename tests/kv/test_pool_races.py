"""Eviction costs a miss, never a wrong KV: threads load from a host-memory RemoteKvPool while others
store new blocks (evicting and rewriting slots), clear it, and shrink and grow it. Every block a load
copies must hold exactly the bytes stored under its key; everything else must be reported missed."""
from __future__ import annotations

import random
import sys
import threading
import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specgen.kv.block_table import block_keys
from specgen.kv.layout import KvLayout
from specgen.kv.pool import RemoteKvPool
from tests.kv.kv_helpers import cache_tensors

KEYS = 96                 # more blocks than the pool holds: stores keep evicting
SLOTS_PER_SEGMENT = 8
SEGMENTS = 4


def _pool(num_blocks: int) -> tuple[RemoteKvPool, list[torch.Tensor]]:
    tensors = cache_tensors("cpu032", num_blocks, "cpu", layers=2)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    pool = RemoteKvPool(layout, devices=(-1,), segment_bytes=SLOTS_PER_SEGMENT * layout.slot_bytes,
                        max_bytes=SEGMENTS * SLOTS_PER_SEGMENT * layout.slot_bytes)
    pool.grow()
    return pool, tensors


def _content(key_index: int, like: torch.Tensor) -> torch.Tensor:
    # Distinct per key and per position: a slot mix-up or a torn copy cannot match.
    return (torch.arange(like.numel(), dtype=torch.float32).reshape(like.shape) + key_index * 1e5)


def _fill(tensors: list[torch.Tensor], block: int, key_index: int) -> None:
    for layer, t in enumerate(tensors):
        t[block].copy_(_content(key_index, t[block]) + layer)


def _holds(tensors: list[torch.Tensor], block: int, key_index: int) -> bool:
    return all(torch.equal(t[block], _content(key_index, t[block]) + layer) for layer, t in enumerate(tensors))


HASHES = [f"block-{i}".encode() for i in range(KEYS)]
KEY_ARRAY = block_keys(HASHES)


def test_loads_racing_evictions_rewrites_and_shrinks_get_the_stored_bytes_or_a_miss() -> None:
    pool, tensors = _pool(num_blocks=64)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"loaded": 0, "wrong": 0, "late_missed": 0, "stores": 0, "shrinks": 0, "clears": 0}
    wrong: list[tuple[int, int]] = []

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:   # reported by the main thread
                errors.append(exc)
                stop.set()
        return run

    def loader(first_block: int, seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            i = rng.randrange(KEYS - 4)
            run = list(range(i, i + 4))
            found = pool.lookup(KEY_ARRAY[run])
            if found == 0:
                continue
            dst = list(range(first_block, first_block + found))
            for b in dst:                  # poison: a load that copies nothing must not look right
                for t in tensors:
                    t[b].fill_(-1.0)
            copy = pool.load(KEY_ARRAY[run[:found]], dst)
            copy.wait()
            assert len(copy.keys) + len(copy.missed) == found
            counts["late_missed"] += len(copy.missed)
            for k, b in zip(run[:len(copy.keys)], dst):
                counts["loaded"] += 1
                if not _holds(tensors, b, k):
                    counts["wrong"] += 1
                    wrong.append((k, b))

    def writer(src_block: int, seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            k = rng.randrange(KEYS)
            _fill(tensors, src_block, k)
            pool.store(KEY_ARRAY[[k]], [src_block]).wait()
            counts["stores"] += 1
            if rng.random() < 0.01:
                pool.clear()
                counts["clears"] += 1

    def shrinker() -> None:
        while not stop.is_set():
            pool.shrink(pool.segment_bytes, timeout_s=10.0)
            counts["shrinks"] += 1
            time.sleep(0.001)
            pool.grow()

    threads = [threading.Thread(target=guarded(lambda: loader(0, 1))),
               threading.Thread(target=guarded(lambda: loader(8, 2))),
               threading.Thread(target=guarded(lambda: writer(40, 3))),
               threading.Thread(target=guarded(lambda: writer(41, 4))),
               threading.Thread(target=guarded(shrinker))]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)            # switch threads often: more interleavings per second
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not stop.is_set():
            if counts["loaded"] > 3000 and counts["late_missed"] > 20 and counts["shrinks"] > 50:
                break
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(old_interval)
    if errors:
        raise errors[0]
    assert counts["wrong"] == 0, f"loads returned other bytes: {wrong[:5]} ({counts})"
    # The race was really run: blocks loaded, blocks gone between lookup and load, segments given back.
    assert counts["loaded"] > 500 and counts["late_missed"] > 0 and counts["shrinks"] > 10, counts
    pool.wait_all()
    stats = pool.stats()
    assert stats.pinned_blocks == 0 and stats.misses >= counts["late_missed"]
    pool.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "load", "evict", "shrink", "grow", "clear"]),
                          st.integers(0, KEYS - 1)), max_size=60))
def test_any_sequence_of_pool_operations_loads_the_stored_bytes_or_misses(ops) -> None:
    """One thread, any order: a lookup, then the table changing, then the load it planned."""
    pool, tensors = _pool(num_blocks=16)
    planned: tuple[int, int] | None = None           # (key index, blocks found) by the last lookup
    for op, k in ops:
        if op == "store":
            _fill(tensors, 0, k)
            pool.store(KEY_ARRAY[[k]], [0]).wait()
        elif op == "load":
            if planned is None:
                planned = (k, pool.lookup(KEY_ARRAY[[k]]))
                continue
            key, found = planned
            planned = None
            if not found:
                continue
            for t in tensors:
                t[5].fill_(-1.0)
            copy = pool.load(KEY_ARRAY[[key]], [5])
            copy.wait()
            assert len(copy.keys) + len(copy.missed) == 1
            if len(copy.keys):
                assert _holds(tensors, 5, key)
        elif op == "evict":
            pool.table.remove(KEY_ARRAY[[k]])
        elif op == "shrink":
            pool.shrink(pool.segment_bytes)
        elif op == "grow":
            pool.grow()
        else:
            pool.clear()
    assert pool.stats().pinned_blocks == 0
    pool.close()
