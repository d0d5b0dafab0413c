"""The remote KV pool: prefix blocks kept in spare memory of validation/profiling GPUs.

`RemoteKvPool` lives in the process that copies (the engine's worker). It holds
- a block table (block hash -> slot, reference counts, LRU eviction, pins while a copy is in flight),
- memory segments: allocated here on pool devices (`grow`), or lent by another process (`attach`),
- a `KvTransfer` bound to the engine's cache layout.

Size is elastic. `grow` takes spare memory on the pool devices in whole segments while the device
keeps `headroom_bytes` free (and the pool stays under `max_bytes`). `shrink` gives segments back when a
profiler needs memory for a candidate: the segments holding the fewest blocks go first. They all stop
taking blocks at once, and their blocks stop being found (no new load pins them); blocks more recently
used than the pool's least recently used ones move into free or evicted slots elsewhere (one batched
copy), the rest are evicted, blocks with a copy in flight are waited for, and only then is the memory
freed. The scheduler reads size and hit rate from `stats()` (a `KvPoolStats`).

Threads: one thread may load while another stores, shrinks or grows (a profiler's give-back runs
beside the engine's fetches). A lock guards the table, the segment list and the copies in flight;
stores, loads and the waits for pinned blocks run outside it, a shrink's moves inside it (one
critical section per pass, so the give-back does not queue behind every load). A block evicted between
`lookup` and `load` is a miss (`PoolCopy.missed`), never an error and never another block's bytes:
a slot's block is pinned from `acquire` until its load completes, so nothing rewrites or frees it.

A fork fetching a few blocks can skip the kernel launch: with `pool.transfer.start_persistent()`,
`load(..., method="persistent")` hands up to 14 blocks to resident CTAs (about 8 us end to end for a
64 KiB block on H200, against ~14 us for a launched copy); it is not ordered with any stream.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from specgen.kv.block_table import BlockTable, block_keys
from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout
from specgen.kv.pool_errors import KvPoolError, KvPoolTimeout
from specgen.kv.segments import HOST, SegmentMemory, allocate_segment, host_device_index, release_segments
from specgen.kv.transfer import KvTransfer
from specgen.messages import KvPoolStats

DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_HEADROOM_BYTES = 8 << 30
# The SM copy kernel takes the segment table by value; this many segments fit.
MAX_SEGMENTS = 128


@dataclass
class _Segment:
    index: int
    memory: SegmentMemory
    owned: bool                 # allocated here (freed on release) or lent by another process (closed)


@dataclass(eq=False)
class PoolCopy:
    """A store or load submitted through the pool. Its blocks stay pinned until it completes."""

    kind: str                   # "store" | "load"
    keys: np.ndarray            # blocks copied (pinned until completion)
    event: Any                  # the extension's CopyEvent
    skipped: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))  # not stored: no room
    # Load: asked-for blocks not copied because they left the pool after the caller's lookup (the
    # prefix stops at the first such block); the engine recomputes them.
    missed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    _pool: "RemoteKvPool | None" = None
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
        if self._pool is None:
            self._finished = True
            return
        with self._pool._lock:
            # Two threads may see the event done at once (a shrink polls everyone's copies): unpin once.
            if self._finished:
                return
            self._finished = True
            self._pool._complete(self)


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
        self.headroom_bytes = int(headroom_bytes)
        self.max_segments = int(max_segments)
        self.copy_stream = int(copy_stream)
        self.table = BlockTable(self.max_segments * self.slots_per_segment)
        self.transfer = KvTransfer(layout, slots_per_segment=self.slots_per_segment, max_segments=self.max_segments)
        self._segments: dict[int, _Segment] = {}
        self._inflight: list[PoolCopy] = []
        self._grows = 0
        self._shrinks = 0
        self._late_misses = 0
        self._lock = threading.RLock()
        # Where the last give-back's time went (ms per phase; tools/pool_release_bench.py reports it).
        self.last_release: dict[str, float] = {}

    # ------------------------------------------------------------------ memory

    @property
    def capacity_bytes(self) -> int:
        with self._lock:
            return sum(s.memory.nbytes for s in self._segments.values())

    def _slot_range(self, index: int) -> tuple[int, int]:
        return index * self.slots_per_segment, (index + 1) * self.slots_per_segment

    def _free_index(self) -> int | None:
        for index in range(self.max_segments):
            if index not in self._segments:
                return index
        return None

    def _add(self, memory: SegmentMemory, owned: bool) -> int:
        if memory.nbytes < self.segment_bytes:
            raise KvPoolError(f"segment {memory.segment_id} has {memory.nbytes} bytes; this pool's segments need "
                              f"{self.segment_bytes}")
        with self._lock:
            index = self._free_index()
            if index is None:
                raise KvPoolError(f"the pool already holds max_segments={self.max_segments} segments")
            self.transfer.set_segment(index, memory.address)
            self._segments[index] = _Segment(index, memory, owned)
            self.table.enable_slots(*self._slot_range(index))
            self._grows += 1
            return index

    def _device_room(self, device: int) -> int:
        """Bytes this pool may still take on `device` (headroom and max_bytes respected)."""
        room = (self.max_bytes - self.capacity_bytes) if self.max_bytes is not None else 1 << 62
        if device != HOST:
            free, _ = kv_extension().mem_get_info(device)
            room = min(room, free - self.headroom_bytes)
        return room

    def grow(self, nbytes: int | None = None, *, device: int | None = None) -> int:
        """Take up to `nbytes` more (all that is allowed when None) in whole segments; bytes added."""
        targets = [device] if device is not None else list(self.devices)
        for target in targets:
            if target not in self.devices:
                raise KvPoolError(f"device {target} is not one of this pool's devices {self.devices}")
        added = 0
        progress = True
        while progress and (nbytes is None or added + self.segment_bytes <= nbytes):
            progress = False
            # Spread segments over the devices with the most room first.
            for target in sorted(targets, key=self._device_room, reverse=True):
                if nbytes is not None and added + self.segment_bytes > nbytes:
                    break
                with self._lock:   # two growing threads must not both take the last room
                    if self._free_index() is None or self._device_room(target) < self.segment_bytes:
                        continue
                    try:
                        memory = allocate_segment(target, self.segment_bytes)
                    except kv_extension().KvTransferError:
                        continue  # someone else took the memory between the check and the allocation
                    self._add(memory, owned=True)
                added += self.segment_bytes
                progress = True
        return added

    def attach(self, memory: SegmentMemory) -> int:
        """Add a segment lent by another process (see segments.open_segment); its index."""
        return self._add(memory, owned=False)

    def shrink(self, nbytes: int, *, device: int | None = None, timeout_s: float = 30.0,
               relocate: bool = True) -> int:
        """Give back at least `nbytes` (whole segments, on `device` if given); bytes freed.

        Waits for copies in flight on the chosen segments, at most `timeout_s` seconds.
        """
        freed = 0
        while freed < nbytes:
            with self._lock:
                candidates = [s for s in self._segments.values() if device is None or s.memory.device == device]
                # Fewest blocks first: least data to move or lose.
                candidates.sort(key=lambda s: self.table.used_in_range(*self._slot_range(s.index)))
                victims, chosen = [], 0
                for segment in candidates:
                    if freed + chosen >= nbytes:
                        break
                    victims.append(segment)
                    chosen += segment.memory.nbytes
            if not victims:
                break
            released = self._release(victims, timeout_s=timeout_s, relocate=relocate)
            if released == 0 and not any(self._segments.get(s.index) is s for s in victims):
                continue    # another thread gave them back meanwhile: choose again
            freed += released
        return freed

    def release_segment(self, index: int, *, timeout_s: float = 30.0, relocate: bool = True) -> int:
        """Retire segment `index` (moving or evicting its blocks) and free or close its memory; bytes freed."""
        segment = self._segments.get(index)
        if segment is None:
            raise KvPoolError(f"the pool has no segment {index}")
        return self._release([segment], timeout_s=timeout_s, relocate=relocate)

    def _release(self, segments: list[_Segment], *, timeout_s: float, relocate: bool) -> int:
        """Retire `segments` together and free their memory; bytes freed.

        All of them stop taking blocks before any is retired, so no block moves into a segment that is
        going too, and the blocks that move go in one batched copy: the profiler waiting for this
        memory pays for one copy and one wait, not one per segment."""
        with self._lock:
            pending = [s for s in segments if self._segments.get(s.index) is s]
            for segment in pending:
                self.table.disable_slots(*self._slot_range(segment.index))
        deadline = time.monotonic() + timeout_s
        started = time.perf_counter()
        phases = {"retire_ms": 0.0, "wait_ms": 0.0, "free_ms": 0.0, "passes": 0, "began": started}
        released: list[_Segment] = []
        while pending:
            phases["passes"] += 1
            # One critical section per pass, the moves' copy included (on a GPU a few milliseconds for
            # a GiB): a loading thread waits that long, where a lock taken and dropped around each step
            # made the give-back queue behind every load for the interpreter and the lock in turn.
            with self._lock:
                pending = [s for s in pending if self._segments.get(s.index) is s]  # others may have freed some
                steps = [(s, self.table.retire_slots(*self._slot_range(s.index), relocate=relocate)) for s in pending]
                moved = [step for _, step in steps if len(step.moved_keys)]
                if moved:
                    keys = np.concatenate([step.moved_keys for step in moved])
                    try:
                        self.transfer.move_slots(np.concatenate([step.src_slots for step in moved]),
                                                 np.concatenate([step.dst_slots for step in moved]),
                                                 stream=self.copy_stream).wait()
                    except Exception:
                        self.table.finish_moves(keys, ok=False)
                        raise
                    self.table.finish_moves(keys, ok=True)
                done: list[_Segment] = []
                for segment, step in steps:
                    if step.busy == 0 and self.table.used_in_range(*self._slot_range(segment.index)) == 0:
                        # Empty and taking no blocks: nothing can copy into or out of it from here on.
                        self.transfer.set_segment(segment.index, 0)
                        del self._segments[segment.index]
                        self._shrinks += 1
                        done.append(segment)
            released.extend(done)
            pending = [s for s in pending if s not in done]
            now = time.perf_counter()
            phases["retire_ms"] += (now - started) * 1e3
            if not pending:
                break
            # Blocks in these segments are pinned by copies in flight: wait for those copies, with the
            # interpreter released once for all of them (a sleep-and-poll loop took it back after each
            # nap, behind whatever thread was loading).
            if time.monotonic() > deadline:
                busy = sum(step.busy for segment, step in steps if segment in pending)
                raise KvPoolTimeout(f"segments {sorted(s.index for s in pending)} still have {busy} blocks with "
                                    f"copies in flight after {timeout_s} s (shrink/release_segment timeout_s)")
            self._wait_copies(max(0.0, deadline - time.monotonic()))
            started = time.perf_counter()
            phases["wait_ms"] += (started - now) * 1e3
        # Outside the lock, all together: cudaFree waits for the device's work in flight.
        t0 = time.perf_counter()
        release_segments(s.memory for s in released)
        phases["ended"] = time.perf_counter()
        phases["free_ms"] = (phases["ended"] - t0) * 1e3
        self.last_release = phases
        return sum(s.memory.nbytes for s in released)

    def _wait_copies(self, timeout_s: float) -> None:
        """Wait for the copies in flight now, then finish them (their pins drop)."""
        with self._lock:
            copies = list(self._inflight)
        if not copies:
            time.sleep(0.0005)  # pinned by someone else's acquire, not a copy of this pool's: poll
            return
        try:
            kv_extension().wait_events([c.event for c in copies], timeout_s)
        except kv_extension().KvTransferError:
            pass    # not done in time: the caller's deadline check names what is still pinned
        for copy in copies:
            copy.done()

    def segment_ids(self) -> dict[int, str]:
        """Segment index -> segment id, for the segments held now."""
        return {index: s.memory.segment_id for index, s in self._segments.items()}

    # ------------------------------------------------------------------ blocks

    def lookup(self, hashes: Iterable[bytes | int] | np.ndarray) -> int:
        """How many leading blocks of `hashes` (a prefix, in order) the pool holds complete."""
        keys = _keys(hashes)
        with self._lock:
            return self.table.lookup_prefix(keys)

    def store(self, hashes: Iterable[bytes | int] | np.ndarray, engine_blocks: Sequence[int] | np.ndarray, *,
              stream: int = 0, after: int | None = None, method: str = "auto") -> PoolCopy:
        """Copy engine blocks into the pool under their hashes (blocks already held are skipped)."""
        keys = _keys(hashes)
        blocks = np.ascontiguousarray(engine_blocks, dtype=np.int64)
        if len(keys) != len(blocks):
            raise KvPoolError(f"store: {len(keys)} hashes but {len(blocks)} engine blocks")
        with self._lock:
            reservation = self.table.reserve(keys)
        positions = reservation.to_store()
        skipped = keys[reservation.slots == BlockTable.NO_ROOM]
        stored = keys[positions]
        # The reserved slots are pinned and unreadable until complete_store: copy without the lock.
        try:
            event = self.transfer.store(blocks[positions], reservation.slots[positions], stream=stream, after=after,
                                        method=method)
        except Exception:
            with self._lock:
                self.table.complete_store(stored, success=False)
            raise
        copy = PoolCopy("store", stored, event, skipped=skipped, _pool=self)
        with self._lock:
            self._inflight.append(copy)
        return copy

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
        with self._lock:
            try:
                slots = self.table.acquire(keys)
                held = len(keys)
            except kv_extension().KvTransferError:
                # acquire pins nothing when any block is missing: pin the prefix that is still there.
                held = 0
                while held < len(keys) and self.table.peek(int(keys[held])) == 1:
                    held += 1
                slots = self.table.acquire(keys[:held])
                self._late_misses += len(keys) - held
        loaded, missed = keys[:held], keys[held:]
        # Pinned from acquire until _complete: no eviction, store or shrink touches these slots meanwhile.
        try:
            event = self.transfer.load(blocks[:held], slots, stream=stream, after=after, method=method)
        except Exception:
            with self._lock:
                self.table.release(loaded)
            raise
        copy = PoolCopy("load", loaded, event, missed=missed, _pool=self)
        with self._lock:
            self._inflight.append(copy)
        return copy

    def poll(self) -> int:
        """Finish the copies that completed; how many are still in flight."""
        with self._lock:
            copies = list(self._inflight)
        for copy in copies:
            copy.done()
        return len(self._inflight)

    def wait_all(self) -> None:
        with self._lock:
            copies = list(self._inflight)
        for copy in copies:
            copy.wait()

    def _complete(self, copy: PoolCopy) -> None:
        if copy.kind == "store":
            self.table.complete_store(copy.keys, success=True)
        else:
            self.table.release(copy.keys)
        self._inflight.remove(copy)

    def clear(self) -> int:
        """Drop every block not pinned by a copy in flight; how many were dropped."""
        with self._lock:
            return len(self.table.clear())

    # ------------------------------------------------------------------ reporting and teardown

    def stats(self) -> KvPoolStats:
        with self._lock:
            t = self.table.stats()
            by_device: dict[int, int] = {}
            for s in self._segments.values():
                by_device[s.memory.device] = by_device.get(s.memory.device, 0) + s.memory.nbytes
            segments, capacity, late = len(self._segments), self.capacity_bytes, self._late_misses
        # A block found by lookup but gone by its load was, in the end, a miss.
        hits, misses = max(0, t.hits - late), t.misses + late
        looked_up = hits + misses
        return KvPoolStats(
            pool_id=self.pool_id,
            capacity_bytes=capacity,
            used_bytes=t.entries * self.layout.slot_bytes,
            slot_bytes=self.layout.slot_bytes,
            capacity_blocks=t.capacity,
            used_blocks=t.entries,
            pinned_blocks=t.pinned,
            segments=segments,
            bytes_by_device=by_device,
            hits=hits,
            misses=misses,
            hit_rate=(hits / looked_up) if looked_up else 0.0,
            stores=t.stores,
            loads=t.loads,
            evictions=t.evictions,
            moves=t.moves,
            shrinks=self._shrinks,
            grows=self._grows,
            # Where the memory is, in terms the scheduler can match with its workers' devices.
            host=socket.gethostname(),
            devices=sorted({host_device_index(d) for d in (*self.devices, *by_device)}),
        )

    def close(self) -> None:
        """Wait for copies in flight, then free or close every segment."""
        self.wait_all()
        with self._lock:
            segments = [self._segments.pop(index) for index in list(self._segments)]
            for segment in segments:
                self.transfer.set_segment(segment.index, 0)
        for segment in segments:
            segment.memory.release()

    def __enter__(self) -> "RemoteKvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _keys(hashes: Iterable[bytes | int] | np.ndarray) -> np.ndarray:
    if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
        return hashes
    return block_keys(hashes)
