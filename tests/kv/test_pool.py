"""RemoteKvPool: store/load by block hash, LRU eviction, pins while copies are in flight, elastic
size (grow with headroom, shrink that keeps hot blocks), and the stats the scheduler reads."""
from __future__ import annotations

import msgspec
import pytest
import torch

from specgen.kv.block_table import block_keys
from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout
from specgen.kv.pool import RemoteKvPool
from specgen.kv.pool_errors import KvPoolError, KvPoolTimeout
from specgen.messages import KvPoolStats
from tests.kv.kv_helpers import ByteViews, cache_tensors, synchronize_all


def _pool(num_blocks: int = 64, segments: int = 2, slots_per_segment: int = 4, device: str = "cpu",
          pool_devices: tuple[int, ...] = (-1,), **kwargs):
    tensors = cache_tensors("cpu032", num_blocks, device, layers=2)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    pool = RemoteKvPool(layout, devices=pool_devices, segment_bytes=slots_per_segment * layout.slot_bytes,
                        max_bytes=segments * slots_per_segment * layout.slot_bytes, **kwargs)
    return pool, tensors, ByteViews(tensors, layout)


def test_store_then_load_by_hash_restores_the_blocks() -> None:
    pool, tensors, views = _pool()
    assert pool.grow() == pool.max_bytes
    hashes = [f"h{i}".encode() for i in range(6)]
    originals = [views.block(b).clone() for b in range(6)]
    pool.store(hashes, range(6)).wait()
    assert pool.lookup(hashes) == 6
    assert pool.lookup(hashes[:3] + [b"unknown"] + hashes[3:]) == 3
    for t in tensors:
        t.zero_()
    pool.load(hashes, range(10, 16)).wait()
    for i in range(6):
        assert torch.equal(views.block(10 + i), originals[i])
    stats = pool.stats()
    assert (stats.stores, stats.loads, stats.used_blocks, stats.pinned_blocks) == (6, 6, 6, 0)
    assert (stats.hits, stats.misses) == (6 + 3, 4)
    assert stats.hit_rate == pytest.approx(9 / 13)
    pool.close()


def test_storing_a_held_block_again_copies_nothing() -> None:
    pool, _, _ = _pool()
    pool.grow()
    pool.store([b"a", b"b"], [0, 1]).wait()
    again = pool.store([b"a", b"c"], [0, 2])
    again.wait()
    assert len(again.keys) == 1
    assert pool.stats().stores == 3
    pool.close()


def test_full_pool_evicts_least_recently_used_unpinned_blocks() -> None:
    pool, _, _ = _pool(segments=1, slots_per_segment=4)
    pool.grow()
    pool.store([b"0", b"1", b"2", b"3"], [0, 1, 2, 3]).wait()
    pool.load([b"0"], [10]).wait()                      # b"0" becomes the most recently used
    pool.store([b"4", b"5"], [4, 5]).wait()             # evicts b"1" and b"2"
    assert [pool.lookup([h]) for h in (b"0", b"1", b"2", b"3", b"4", b"5")] == [1, 0, 0, 1, 1, 1]
    assert pool.stats().evictions == 2
    pool.close()


def test_blocks_being_loaded_are_pinned_and_never_evicted() -> None:
    pool, _, _ = _pool(segments=1, slots_per_segment=2)
    pool.grow()
    pool.store([b"a", b"b"], [0, 1]).wait()
    pinned = block_keys([b"a", b"b"])
    pool.table.acquire(pinned)                  # what a load in flight holds
    copy = pool.store([b"c"], [2])
    assert len(copy.skipped) == 1 and len(copy.keys) == 0, "a pinned block was evicted"
    pool.table.release(pinned)
    copy = pool.store([b"c"], [2])
    copy.wait()
    assert len(copy.keys) == 1 and pool.stats().evictions == 1
    pool.close()


def test_a_block_gone_since_the_lookup_is_a_miss_and_ends_the_prefix() -> None:
    pool, _, _ = _pool()
    pool.grow()
    pool.store([b"a", b"b", b"c"], [0, 1, 2]).wait()
    assert pool.lookup([b"a", b"b", b"c"]) == 3
    pool.table.remove(block_keys([b"b"]))        # evicted between the lookup and the load
    copy = pool.load([b"a", b"b", b"c"], [10, 11, 12])
    copy.wait()
    assert list(copy.keys) == list(block_keys([b"a"]))
    assert list(copy.missed) == list(block_keys([b"b", b"c"]))
    stats = pool.stats()
    assert (stats.hits, stats.misses, stats.pinned_blocks) == (1, 2, 0)
    assert len(pool.load([b"nothing"], [0]).missed) == 1
    with pytest.raises(KvPoolError, match="2 hashes but 1 engine blocks"):
        pool.store([b"a", b"b"], [0])
    pool.close()


def test_shrink_keeps_hot_blocks_and_drops_cold_ones() -> None:
    pool, tensors, views = _pool(segments=2, slots_per_segment=4)
    pool.grow()
    hashes = [bytes([i]) for i in range(8)]
    originals = {h: views.block(i).clone() for i, h in enumerate(hashes)}
    pool.store(hashes, range(8)).wait()
    # Give back the segment holding blocks 0..3 after making them the most recently used.
    pool.load(hashes[:4], range(20, 24)).wait()
    hot_segment = pool.table.slot_of(int(block_keys(hashes[:1])[0])) // pool.slots_per_segment
    assert {pool.table.slot_of(int(k)) // pool.slots_per_segment for k in block_keys(hashes[:4])} == {hot_segment}
    freed = pool.release_segment(hot_segment)
    assert freed == pool.segment_bytes
    stats = pool.stats()
    assert stats.segments == 1 and stats.capacity_blocks == 4 and stats.shrinks == 1
    # The hot blocks moved into the slots of the cold ones, which were evicted.
    held = [h for h in hashes if pool.lookup([h]) == 1]
    assert held == hashes[:4]
    assert (stats.moves, stats.evictions) == (4, 4)
    for t in tensors:
        t.zero_()
    pool.load(held, range(30, 34)).wait()
    for i, h in enumerate(held):
        assert torch.equal(views.block(30 + i), originals[h])
    pool.close()


def test_grow_back_after_shrink_and_stats_round_trip_the_wire() -> None:
    pool, _, _ = _pool(segments=2, slots_per_segment=4)
    assert pool.grow() == 2 * pool.segment_bytes
    assert pool.grow() == 0, "max_bytes reached: nothing more to take"
    pool.shrink(pool.segment_bytes)
    assert pool.stats().capacity_bytes == pool.segment_bytes
    assert pool.grow() == pool.segment_bytes
    stats = pool.stats()
    assert (stats.grows, stats.shrinks, stats.segments) == (3, 1, 2)
    assert stats.bytes_by_device == {-1: 2 * pool.segment_bytes}
    wire = msgspec.msgpack.encode(stats)
    assert msgspec.msgpack.decode(wire, type=KvPoolStats) == stats
    pool.close()


def test_shrink_times_out_naming_the_setting_while_a_copy_pins_blocks() -> None:
    pool, _, _ = _pool(segments=1, slots_per_segment=4)
    pool.grow()
    pool.store([b"a"], [0]).wait()
    pool.table.acquire(block_keys([b"a"]))
    with pytest.raises(KvPoolTimeout, match=r"timeout_s"):
        pool.shrink(1, timeout_s=0.05)
    pool.table.release(block_keys([b"a"]))
    assert pool.shrink(1) == pool.segment_bytes
    pool.close()


def test_a_give_back_reports_its_phases() -> None:
    pool, _, _ = _pool(segments=2, slots_per_segment=4)
    pool.grow()
    pool.store([bytes([i]) for i in range(8)], range(8)).wait()
    assert pool.shrink(2 * pool.segment_bytes) == 2 * pool.segment_bytes
    phases = pool.last_release
    assert phases["passes"] == 1 and phases["ended"] >= phases["began"]
    assert all(phases[k] >= 0.0 for k in ("retire_ms", "wait_ms", "free_ms"))
    pool.close()


def test_host_pool_requires_max_bytes() -> None:
    tensors = cache_tensors("cpu032", 8, "cpu")
    layout = KvLayout.from_tensors(tensors, 8)
    with pytest.raises(KvPoolError, match="needs max_bytes"):
        RemoteKvPool(layout, devices=[-1])
    with pytest.raises(KvPoolError, match="smaller than one block's slot"):
        RemoteKvPool(layout, devices=[-1], max_bytes=1 << 20, segment_bytes=16)


# ------------------------------------------------------------------ GPU


def _gpu_pool(pool_device: int, segments: int = 3, slots_per_segment: int = 256):
    num_blocks = 1024
    tensors = cache_tensors("flash033", num_blocks, "cuda:0", layers=8)    # 64 KiB per block
    layout = KvLayout.from_tensors(tensors, num_blocks)
    kv_extension().enable_peer_access(0, pool_device)     # whatever it costs is paid before measuring
    synchronize_all()
    free, _ = kv_extension().mem_get_info(pool_device)
    seg_bytes = slots_per_segment * layout.slot_bytes                      # 16 MiB
    # Headroom leaves room for exactly `segments` segments on the pool device.
    pool = RemoteKvPool(layout, devices=[pool_device], segment_bytes=seg_bytes,
                        headroom_bytes=free - segments * seg_bytes - seg_bytes // 2)
    return pool, tensors, ByteViews(tensors, layout)


def _gpu_pool_cycle(pool_device: int) -> None:
    pool, tensors, views = _gpu_pool(pool_device)
    assert pool.grow() == 3 * pool.segment_bytes, "grow must stop at the headroom"
    n = 700                                                           # of 768 slots
    hashes = [f"blk{i}".encode() for i in range(n)]
    originals = {h: views.block(i) for i, h in enumerate(hashes)}
    stream = torch.cuda.current_stream(0).cuda_stream
    pool.store(hashes, range(n), stream=stream).wait()
    hot = hashes[::7]                                                 # spread over every segment
    pool.load(hot, range(n, n + len(hot)), stream=stream).wait()
    synchronize_all()
    torch.cuda.empty_cache()
    free_before, _ = kv_extension().mem_get_info(pool_device)
    assert pool.shrink(1) == pool.segment_bytes
    free_after, _ = kv_extension().mem_get_info(pool_device)
    assert free_after - free_before >= pool.segment_bytes, "shrinking did not give the memory back"
    stats = pool.stats()
    assert stats.segments == 2 and stats.moves > 0
    held = [h for h in hashes if pool.lookup([h]) == 1]
    assert set(hot) <= set(held), "hot blocks were lost by shrinking"
    assert len(held) == 2 * 256
    for t in tensors:
        t.zero_()
    synchronize_all()
    pool.load(held, range(len(held)), stream=stream).wait()
    for i, h in enumerate(held):
        assert torch.equal(views.block(i), originals[h])
    # Grows back when the memory is there again (torch and CUDA's lazily loaded kernels took some of the
    # engine device's memory since, so the headroom is set afresh).
    synchronize_all()
    torch.cuda.empty_cache()
    pool.headroom_bytes = kv_extension().mem_get_info(pool_device)[0] - pool.segment_bytes - pool.segment_bytes // 2
    assert pool.grow() == pool.segment_bytes
    pool.close()
    assert pool.stats().segments == 0


@pytest.mark.gpu
def test_gpu_pool_on_the_engine_device() -> None:
    _gpu_pool_cycle(0)


@pytest.mark.gpu2
def test_gpu_pool_on_a_peer_device() -> None:
    _gpu_pool_cycle(1)


@pytest.mark.gpu
def test_gpu_pool_fetches_a_few_blocks_through_the_persistent_copier() -> None:
    """A fork's small fetch without a kernel launch: the pool's transfer runs the persistent
    copier, loads by hash go through it, and a shrink while it runs re-points its segment table."""
    pool_device = 1 if torch.cuda.device_count() > 1 else 0
    pool, tensors, views = _gpu_pool(pool_device)
    pool.grow()
    hashes = [f"blk{i}".encode() for i in range(600)]
    originals = {h: views.block(i) for i, h in enumerate(hashes)}
    pool.store(hashes, range(600)).wait()
    synchronize_all()
    pool.transfer.start_persistent(idle_us=1000)
    try:
        for start in range(0, 40, 4):
            few = hashes[start * 13:start * 13 + 4]
            pool.load(few, range(700, 704), method="persistent").wait()
            for i, h in enumerate(few):
                assert torch.equal(views.block(700 + i), originals[h]), f"block {h!r}"
        assert pool.shrink(1) == pool.segment_bytes                   # moves blocks while the copier runs
        held = [h for h in hashes if pool.lookup([h]) == 1][-4:]
        pool.load(held, range(700, 704), method="persistent").wait()
        for i, h in enumerate(held):
            assert torch.equal(views.block(700 + i), originals[h]), f"after shrink: block {h!r}"
    finally:
        pool.transfer.stop_persistent()
        pool.close()
