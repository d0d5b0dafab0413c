"""The pool's block table: block hash -> pool slot, with reference counts and LRU eviction.

The table itself is C++ (csrc/block_table.cpp), so that the per-block bookkeeping of a 4,096-block
batch costs microseconds; this wrapper turns engine block hashes into the 64-bit keys it uses and
gives the calls Python-friendly results.

Keys: engines hash blocks with long digests (vLLM: a SHA-256 chained over the prefix plus a group
index). We fold any hash to 64 bits with BLAKE2b; two different blocks then share a key with
probability about n^2 / 2^65 (n blocks held): under 1e-8 for a million blocks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from specgen.kv.extension import kv_extension


def block_key(block_hash: bytes | int) -> int:
    """The table key of an engine block hash (bytes of any length, or an int already 64-bit)."""
    if isinstance(block_hash, int):
        if not 0 <= block_hash < 1 << 64:
            raise ValueError(f"an integer block key must fit in 64 bits, got {block_hash}")
        return block_hash
    return int.from_bytes(hashlib.blake2b(block_hash, digest_size=8).digest(), "little")


def block_keys(hashes: Iterable[bytes | int]) -> np.ndarray:
    """Keys of several hashes, as the uint64 array the table takes."""
    return np.fromiter((block_key(h) for h in hashes), dtype=np.uint64)


@dataclass(frozen=True)
class StoreReservation:
    """Result of reserving slots for a store."""

    slots: np.ndarray          # per key: slot to write, or -1 (already held) / -2 (no room)
    evicted: np.ndarray        # keys dropped to make room

    def to_store(self) -> np.ndarray:
        """Positions (into the reserved keys) that must be copied."""
        return np.flatnonzero(self.slots >= 0)


@dataclass(frozen=True)
class RetireStep:
    """One pass of retiring a slot range (shrinking)."""

    moved_keys: np.ndarray     # blocks to copy from src_slots to dst_slots, then finish_moves
    src_slots: np.ndarray
    dst_slots: np.ndarray
    evicted: np.ndarray        # blocks dropped
    busy: int                  # blocks still pinned in the range: retire again after they are released


class BlockTable:
    """Block hash -> slot map over a slot space of `max_slots` slots, initially all switched off."""

    ALREADY_PRESENT = -1
    NO_ROOM = -2

    def __init__(self, max_slots: int) -> None:
        self._table = kv_extension().BlockTable(int(max_slots))

    @classmethod
    def of(cls, table) -> "BlockTable":
        """This wrapper around an extension table owned elsewhere (a PoolCore's)."""
        self = cls.__new__(cls)
        self._table = table
        return self

    @property
    def max_slots(self) -> int:
        return int(self._table.max_slots)

    def __len__(self) -> int:
        return len(self._table)

    def stats(self):  # -> extension BlockTableStats (entries, capacity, free, pinned, hits, ...)
        return self._table.stats()

    def enable_slots(self, lo: int, hi: int) -> None:
        """Slots [lo, hi) can hold blocks from now on."""
        self._table.enable_slots(int(lo), int(hi))

    def disable_slots(self, lo: int, hi: int) -> None:
        """Slots [lo, hi) take no new blocks and their blocks read as missing (a shrink is coming)."""
        self._table.disable_slots(int(lo), int(hi))

    def retire_slots(self, lo: int, hi: int, *, relocate: bool = True) -> RetireStep:
        """Stop using slots [lo, hi): hot blocks move elsewhere (relocate), the rest are evicted."""
        keys, src, dst, evicted, busy = self._table.retire_slots(int(lo), int(hi), relocate)
        return RetireStep(moved_keys=keys, src_slots=src, dst_slots=dst, evicted=evicted, busy=int(busy))

    def used_in_range(self, lo: int, hi: int) -> int:
        return int(self._table.used_in_range(int(lo), int(hi)))

    def finish_moves(self, keys: np.ndarray | Sequence[int], ok: bool = True) -> None:
        """The copies of moved blocks finished (ok) or failed (the blocks are dropped)."""
        self._table.finish_moves(np.asarray(keys, dtype=np.uint64), ok)

    def reserve(self, keys: np.ndarray | Sequence[int]) -> StoreReservation:
        """Reserve slots to store blocks not held yet (pinned until complete_store)."""
        slots, evicted = self._table.allocate(np.asarray(keys, dtype=np.uint64))
        return StoreReservation(slots=slots, evicted=evicted)

    def complete_store(self, keys: np.ndarray | Sequence[int], success: bool = True) -> None:
        self._table.complete_store(np.asarray(keys, dtype=np.uint64), success)

    def lookup(self, key: int) -> int:
        """MISS (0), HIT (1) or PENDING (2: its store is in flight)."""
        return int(self._table.lookup(int(key)))

    def peek(self, key: int) -> int:
        """Like lookup, without counting toward the hit rate."""
        return int(self._table.peek(int(key)))

    def lookup_prefix(self, keys: np.ndarray | Sequence[int]) -> int:
        """How many leading keys are complete blocks in the pool."""
        return int(self._table.lookup_prefix(np.asarray(keys, dtype=np.uint64)))

    def acquire_prefix(self, keys: np.ndarray | Sequence[int]) -> np.ndarray:
        """Pin the leading keys that are complete blocks (up to the first that is not); their slots."""
        return self._table.acquire_prefix(np.asarray(keys, dtype=np.uint64))

    def acquire(self, keys: np.ndarray | Sequence[int]) -> np.ndarray:
        """Pin complete blocks for loading; their slots."""
        return self._table.acquire(np.asarray(keys, dtype=np.uint64))

    def release(self, keys: np.ndarray | Sequence[int]) -> None:
        self._table.release(np.asarray(keys, dtype=np.uint64))

    def touch(self, keys: np.ndarray | Sequence[int]) -> None:
        self._table.touch(np.asarray(keys, dtype=np.uint64))

    def slot_of(self, key: int) -> int:
        return int(self._table.slot_of(int(key)))

    def remove(self, keys: np.ndarray | Sequence[int]) -> np.ndarray:
        return self._table.remove(np.asarray(keys, dtype=np.uint64))

    def clear(self) -> np.ndarray:
        return self._table.clear()


MISS = 0
HIT = 1
PENDING = 2
