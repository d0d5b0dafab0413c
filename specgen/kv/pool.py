"""The remote KV pool: prefix blocks kept in spare memory of validation/profiling GPUs.

`RemoteKvPool` lives in the process that copies (the engine's worker). Its state is C++
(`PoolCore`, csrc/pool_core.h): a block table (block hash -> slot, reference counts, LRU eviction,
pins while a copy is in flight), the memory segments (allocated here on pool devices by `grow`, or
lent by another process and `attach`ed), and the copies in flight. This class is its Python face,
with a `KvTransfer` bound to the engine's cache layout.

Size is elastic. `grow` takes spare memory on the pool devices in whole segments while the device
keeps `headroom_bytes` free (and the pool stays under `max_bytes`). `shrink` gives segments back when a
profiler needs memory for a candidate: the segments holding the fewest blocks go first. They all stop
taking blocks at once, and their blocks stop being found (no new load pins them); blocks more recently
used than the pool's least recently used ones move into free or evicted slots elsewhere (one batched
copy), the rest are evicted, copies in flight that pin blocks are waited for, and only then is the
memory freed. The give-back runs in C++ with the interpreter released, and can be driven with no
Python thread of this process in the way at all: `pool_agent.PoolAgentProcess` serves the control
channel from a process of its own and hands resizes to the pool's native give-back thread. The
scheduler reads size and hit rate from `stats()` (a `KvPoolStats`).

Threads: any thread may store, load, shrink or grow (a profiler's give-back runs beside the engine's
fetches); every C++ call is atomic. A block evicted between `lookup` and `load` is a miss
(`PoolCopy.missed`), never an error and never another block's bytes: a slot's block is pinned from
`acquire` until its copy is finished, so nothing rewrites or frees it.

A fork fetching a few blocks can skip the kernel launch: with `pool.transfer.start_persistent()`,
`load(..., method="persistent")` hands up to 14 blocks to resident CTAs (about 8 us end to end for a
64 KiB block on H200, against ~14 us for a launched copy); it is not ordered with any stream.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from specgen.kv.block_table import BlockTable, block_keys
from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout
from specgen.kv.pool_errors import KvPoolError, KvPoolTimeout
from specgen.kv.segments import HOST, SegmentMemory, host_device_index, release_segments
from specgen.kv.transfer import KvTransfer
from specgen.messages import KvPoolStats

DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_HEADROOM_BYTES = 8 << 30
# The SM copy kernel takes the segment table by value; this many segments fit.
MAX_SEGMENTS = 128


@dataclass(eq=False)
class PoolCopy:
    """A store or load submitted through the pool. Its blocks stay pinned until it is finished."""

    kind: str                   # "store" | "load"
    keys: np.ndarray            # blocks copied (pinned until completion)
    event: Any                  # the extension's CopyEvent
    skipped: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))  # not stored: no room
    # Load: asked-for blocks not copied because they left the pool after the caller's lookup (the
    # prefix stops at the first such block); the engine recomputes them.
    missed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    _core: Any = None
    _id: int = 0
    _finished: bool = False

    def done(self) -> bool:
        """True once the copy finished (and its blocks are committed or released)."""
        if not self._finished and self.event.done():
            self._finish()
        return self._finished

    def wait(self) -> None:
        """Block until the copy finished."""
        if not self._finished:
            self.event.wait()
            self._finish()

    def _finish(self) -> None:
        # A give-back waiting for this copy may have finished it already: the core unpins once.
        if self._core is not None:
            self._core.finish(self._id)
        self._finished = True


class RemoteKvPool:
    """Block table + elastic pool memory + copies, for one engine cache layout."""

    def __init__(
        self,
        layout: KvLayout,
        *,
        devices: Sequence[int] = (HOST,),
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_bytes: int | None = None,
        headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
        max_segments: int = MAX_SEGMENTS,
        pool_id: str = "",
        copy_stream: int = 0,
    ) -> None:
        if not 0 < max_segments <= MAX_SEGMENTS:
            raise KvPoolError(f"max_segments must be in 1..{MAX_SEGMENTS}, got {max_segments}")
        if segment_bytes < layout.slot_bytes:
            raise KvPoolError(f"segment_bytes={segment_bytes} is smaller than one block's slot ({layout.slot_bytes} "
                              "bytes): raise segment_bytes")
        if HOST in devices and max_bytes is None:
            raise KvPoolError("a pool in host memory needs max_bytes (there is no free-memory figure to size it by)")
        self.layout = layout
        self.pool_id = pool_id
        self.devices = tuple(int(d) for d in devices)
        self.slots_per_segment = int(segment_bytes // layout.slot_bytes)
        self.segment_bytes = self.slots_per_segment * layout.slot_bytes
        self.max_bytes = max_bytes
        self.max_segments = int(max_segments)
        self.copy_stream = int(copy_stream)
        self.transfer = KvTransfer(layout, slots_per_segment=self.slots_per_segment, max_segments=self.max_segments)
        self._core = kv_extension().PoolCore(self.transfer.native, self.max_segments, self.slots_per_segment,
                                             int(headroom_bytes), -1 if max_bytes is None else int(max_bytes),
                                             list(self.devices))
        self._headroom_bytes = int(headroom_bytes)
        self.table = BlockTable.of(self._core.table)
        # Segments lent by another process (attach), by serial: this process closes their mappings.
        self._lent: dict[int, SegmentMemory] = {}
        self._closed = False
        # Where the last give-back's time went (ms per phase, `began`/`ended` on time.perf_counter's
        # clock; tools/pool_release_bench.py reports it).
        self.last_release: dict[str, float] = {}

    # ------------------------------------------------------------------ memory

    @property
    def native(self) -> Any:
        """The C++ pool (PoolCore) this object drives; pool_agent serves it from a native thread."""
        return self._core

    @property
    def headroom_bytes(self) -> int:
        """GPU memory `grow` leaves free on each pool device."""
        return self._headroom_bytes

    @headroom_bytes.setter
    def headroom_bytes(self, value: int) -> None:
        self._headroom_bytes = int(value)
        self._core.set_headroom(int(value))

    @property
    def capacity_bytes(self) -> int:
        return int(self._core.capacity_bytes)

    def grow(self, nbytes: int | None = None, *, device: int | None = None) -> int:
        """Take up to `nbytes` more (all that is allowed when None) in whole segments; bytes added."""
        if device is not None and device not in self.devices:
            raise KvPoolError(f"device {device} is not one of this pool's devices {self.devices}")
        return int(self._core.grow(-1 if nbytes is None else int(nbytes),
                                   kv_extension().ANY_DEVICE if device is None else int(device)))

    def attach(self, memory: SegmentMemory) -> int:
        """Add a segment lent by another process (see segments.open_segment); its index."""
        if memory.nbytes < self.segment_bytes:
            raise KvPoolError(f"segment {memory.segment_id} has {memory.nbytes} bytes; this pool's segments need "
                              f"{self.segment_bytes}")
        try:
            index, serial = self._core.add_segment(memory.address, memory.device, memory.nbytes, False)
        except kv_extension().KvTransferError as exc:
            raise KvPoolError(str(exc)) from None
        self._lent[int(serial)] = memory
        return int(index)

    def shrink(self, nbytes: int, *, device: int | None = None, timeout_s: float = 30.0,
               relocate: bool = True) -> int:
        """Give back at least `nbytes` (whole segments, on `device` if given); bytes freed.

        Waits for copies in flight on the chosen segments, at most `timeout_s` seconds."""
        report = self._core.shrink(int(nbytes), kv_extension().ANY_DEVICE if device is None else int(device),
                                   float(timeout_s), bool(relocate), True)
        return self._released(report, timeout_s)

    def release_segment(self, index: int, *, timeout_s: float = 30.0, relocate: bool = True) -> int:
        """Retire segment `index` (moving or evicting its blocks) and free or close its memory; bytes freed."""
        try:
            report = self._core.release_segment(int(index), float(timeout_s), bool(relocate))
        except kv_extension().KvTransferError as exc:
            raise KvPoolError(str(exc)) from None
        return self._released(report, timeout_s)

    def _released(self, report: Any, timeout_s: float) -> int:
        """Close the lent segments a give-back retired, record its phases; raise if it timed out."""
        release_segments(self._lent.pop(int(serial)) for serial in report.lent)
        self.last_release = {"retire_ms": report.retire_ms, "wait_ms": report.wait_ms, "free_ms": report.free_ms,
                             "passes": report.passes, "began": report.began_s, "ended": report.ended_s}
        if report.timed_out:
            raise KvPoolTimeout(f"{report.busy} blocks still had copies in flight after {timeout_s} s; "
                                f"{report.freed_bytes} bytes were given back (shrink/release_segment timeout_s)")
        return int(report.freed_bytes)

    def segment_indices(self) -> list[int]:
        """Indices of the segments held now."""
        return [int(s.index) for s in self._core.segments()]

    # ------------------------------------------------------------------ blocks

    def lookup(self, hashes: Iterable[bytes | int] | np.ndarray) -> int:
        """How many leading blocks of `hashes` (a prefix, in order) the pool holds complete."""
        return self.table.lookup_prefix(_keys(hashes))

    def store(self, hashes: Iterable[bytes | int] | np.ndarray, engine_blocks: Sequence[int] | np.ndarray, *,
              stream: int = 0, after: int | None = None, method: str = "auto") -> PoolCopy:
        """Copy engine blocks into the pool under their hashes (blocks already held are skipped)."""
        keys = _keys(hashes)
        blocks = np.ascontiguousarray(engine_blocks, dtype=np.int64)
        if len(keys) != len(blocks):
            raise KvPoolError(f"store: {len(keys)} hashes but {len(blocks)} engine blocks")
        reservation = self.table.reserve(keys)
        positions = reservation.to_store()
        skipped = keys[reservation.slots == BlockTable.NO_ROOM]
        stored = keys[positions]
        # The reserved slots are pinned and unreadable until the copy is finished.
        try:
            event = self.transfer.store(blocks[positions], reservation.slots[positions], stream=stream, after=after,
                                        method=method)
        except Exception:
            self.table.complete_store(stored, success=False)
            raise
        return PoolCopy("store", stored, event, skipped=skipped, _core=self._core,
                        _id=self._core.track(event, stored, True))

    def load(self, hashes: Iterable[bytes | int] | np.ndarray, engine_blocks: Sequence[int] | np.ndarray, *,
             stream: int = 0, after: int | None = None, method: str = "auto") -> PoolCopy:
        """Copy pool blocks into engine blocks (the hashes a lookup found).

        Blocks that left the pool since that lookup (evicted, or given back with their segment) are
        not copied: from the first of them on, the rest of the prefix is in `PoolCopy.missed` and
        counts as missed; `PoolCopy.keys` are the blocks copied, which are the leading ones."""
        keys = _keys(hashes)
        blocks = np.ascontiguousarray(engine_blocks, dtype=np.int64)
        if len(keys) != len(blocks):
            raise KvPoolError(f"load: {len(keys)} hashes but {len(blocks)} engine blocks")
        slots = self._core.acquire_prefix(keys)
        held = len(slots)
        loaded, missed = keys[:held], keys[held:]
        # Pinned from acquire until finished: no eviction, store or give-back touches these slots meanwhile.
        try:
            event = self.transfer.load(blocks[:held], slots, stream=stream, after=after, method=method)
        except Exception:
            self.table.release(loaded)
            raise
        return PoolCopy("load", loaded, event, missed=missed, _core=self._core,
                        _id=self._core.track(event, loaded, False))

    def poll(self) -> int:
        """Finish the copies that completed; how many are still in flight."""
        return int(self._core.poll())

    def wait_all(self) -> None:
        self._core.wait_all()

    def clear(self) -> int:
        """Drop every block not pinned by a copy in flight; how many were dropped."""
        return len(self.table.clear())

    # ------------------------------------------------------------------ reporting and teardown

    def stats(self) -> KvPoolStats:
        c = self._core.counters()
        t = c.table
        return pool_stats(
            capacity_bytes=c.capacity_bytes, segments=c.segments, grows=c.grows, shrinks=c.shrinks,
            late_misses=c.late_misses, entries=t.entries, capacity_blocks=t.capacity, pinned=t.pinned,
            hits=t.hits, misses=t.misses, stores=t.stores, loads=t.loads, evictions=t.evictions, moves=t.moves,
            bytes_by_device=dict(c.bytes_by_device), pool_id=self.pool_id, slot_bytes=self.layout.slot_bytes,
            devices=self.devices)

    def close(self) -> None:
        """Wait for copies in flight, then free or close every segment."""
        if self._closed:
            return
        self._closed = True
        release_segments(self._lent.pop(int(serial)) for serial in self._core.close())

    def __enter__(self) -> "RemoteKvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pool_stats(*, capacity_bytes: int, segments: int, grows: int, shrinks: int, late_misses: int, entries: int,
               capacity_blocks: int, pinned: int, hits: int, misses: int, stores: int, loads: int, evictions: int,
               moves: int, bytes_by_device: dict[int, int], pool_id: str, slot_bytes: int,
               devices: Sequence[int]) -> KvPoolStats:
    """The `KvPoolStats` of a pool's counters (PoolCore's, read here or by the pool's agent process)."""
    # A block found by lookup but gone by its load was, in the end, a miss.
    hits, misses = max(0, hits - late_misses), misses + late_misses
    looked_up = hits + misses
    return KvPoolStats(
        pool_id=pool_id,
        capacity_bytes=int(capacity_bytes),
        used_bytes=int(entries) * slot_bytes,
        slot_bytes=slot_bytes,
        capacity_blocks=int(capacity_blocks),
        used_blocks=int(entries),
        pinned_blocks=int(pinned),
        segments=int(segments),
        bytes_by_device={int(d): int(b) for d, b in bytes_by_device.items()},
        hits=int(hits),
        misses=int(misses),
        hit_rate=(hits / looked_up) if looked_up else 0.0,
        stores=int(stores),
        loads=int(loads),
        evictions=int(evictions),
        moves=int(moves),
        shrinks=int(shrinks),
        grows=int(grows),
        # Where the memory is, in terms the scheduler can match with its workers' devices.
        host=socket.gethostname(),
        devices=sorted({host_device_index(d) for d in (*devices, *bytes_by_device)}),
    )


def _keys(hashes: Iterable[bytes | int] | np.ndarray) -> np.ndarray:
    if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
        return hashes
    return block_keys(hashes)
