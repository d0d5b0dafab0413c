"""BlockTable: hash keys, slot reservation, pins, LRU eviction, retiring slot ranges."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgen.kv.block_table import HIT, MISS, PENDING, BlockTable, block_key, block_keys
from specgen.kv.extension import kv_extension


def _table(slots: int = 4) -> BlockTable:
    table = BlockTable(slots)
    table.enable_slots(0, slots)
    return table


def test_block_key_folds_hashes_to_64_bits_deterministically() -> None:
    assert block_key(b"abc") == block_key(b"abc") != block_key(b"abd")
    assert 0 <= block_key(b"x" * 40) < 1 << 64
    assert block_key(12345) == 12345
    with pytest.raises(ValueError, match="fit in 64 bits"):
        block_key(1 << 64)
    assert block_keys([b"a", 7]).dtype == np.uint64


def test_reserve_pins_until_store_completes_and_lookup_reports_pending() -> None:
    table = _table()
    r = table.reserve([10, 11])
    assert list(r.slots) == [0, 1] and list(r.to_store()) == [0, 1]
    assert table.lookup(10) == PENDING
    assert table.stats().pinned == 2
    table.complete_store([10, 11])
    assert table.lookup(10) == HIT and table.lookup(99) == MISS
    assert table.stats().pinned == 0 and table.stats().stores == 2
    again = table.reserve([10, 12])
    assert list(again.slots) == [BlockTable.ALREADY_PRESENT, 2]


def test_failed_store_frees_the_slot() -> None:
    table = _table(1)
    table.reserve([1])
    table.complete_store([1], success=False)
    assert len(table) == 0
    assert list(table.reserve([2]).slots) == [0]


def test_lru_eviction_skips_pinned_and_in_flight_blocks() -> None:
    table = _table(3)
    table.reserve([1, 2, 3])
    table.complete_store([1, 2])          # 3 stays in flight
    table.acquire([1])                    # 1 is being loaded
    r = table.reserve([4])
    assert list(r.evicted) == [2] and list(r.slots) == [table.slot_of(4)]
    r = table.reserve([5])
    assert list(r.slots) == [BlockTable.NO_ROOM] and len(r.evicted) == 0
    table.release([1])
    table.complete_store([3])
    table.touch([1])                      # 3 is now the least recently used complete block
    assert list(table.reserve([5]).evicted) == [3]


def test_lookup_prefix_counts_hits_and_misses() -> None:
    table = _table()
    table.reserve([1, 2, 3])
    table.complete_store([1, 2, 3])
    assert table.lookup_prefix([1, 2, 9, 3]) == 2
    stats = table.stats()
    assert (stats.hits, stats.misses) == (2, 2)
    assert table.peek(1) == HIT and table.stats().hits == 2


def test_acquire_of_missing_or_pending_blocks_pins_nothing() -> None:
    table = _table()
    table.reserve([1, 2])
    table.complete_store([1])
    error = kv_extension().KvTransferError
    with pytest.raises(error, match="block 2 is still being stored"):
        table.acquire([1, 2])
    with pytest.raises(error, match="block 7 is not in the pool"):
        table.acquire([7])
    assert table.stats().pinned == 1      # only block 2's store
    with pytest.raises(error, match="not pinned for loading"):
        table.release([1])


def test_retire_keeps_the_most_recently_used_blocks() -> None:
    table = BlockTable(8)
    table.enable_slots(0, 4)
    table.enable_slots(4, 8)
    early = [100, 101, 102, 103]              # stored first, into slots 4..7
    late = [104, 105, 106, 107]               # stored last, into slots 0..3
    table.reserve(early + late)
    table.complete_store(early + late)
    assert sorted(table.slot_of(k) for k in late) == [0, 1, 2, 3]
    table.touch([104, 105])
    step = table.retire_slots(0, 4)
    # The four most recently used blocks are the retiring ones: they move into the slots of the four
    # older blocks, which are evicted.
    assert sorted(step.moved_keys) == late
    assert sorted(step.src_slots) == [0, 1, 2, 3] and sorted(step.dst_slots) == [4, 5, 6, 7]
    assert sorted(step.evicted) == early and step.busy == 0
    assert table.lookup(104) == PENDING       # unreadable until its copy is confirmed
    table.finish_moves(step.moved_keys)
    assert table.lookup(104) == HIT
    assert table.used_in_range(0, 4) == 0 and table.stats().capacity == 4 and table.stats().moves == 4
    # The retired range takes nothing new until switched on again.
    assert list(table.reserve([1]).slots) != [0]
    table.enable_slots(0, 4)
    assert sorted(table.reserve([2, 3]).slots) == [0, 1]


def test_blocks_in_disabled_slots_are_not_found_and_not_pinned_again() -> None:
    table = _table(8)
    table.reserve([1, 2, 3])
    table.complete_store([1, 2, 3])
    table.acquire([2])                        # a load in flight pins 2
    table.disable_slots(0, 4)                 # a shrink is coming for slots 0..3
    assert table.lookup(1) == MISS and table.lookup_prefix([1, 2]) == 0
    with pytest.raises(kv_extension().KvTransferError, match="giving back"):
        table.acquire([2])                    # no new pin: the load in flight is the last
    step = table.retire_slots(0, 4, relocate=False)
    assert sorted(step.evicted) == [1, 3] and step.busy == 1
    table.release([2])
    assert list(table.retire_slots(0, 4, relocate=False).evicted) == [2]


def test_retiring_several_ranges_never_moves_a_block_into_one_of_them() -> None:
    table = BlockTable(12)
    for lo in (0, 4, 8):
        table.enable_slots(lo, lo + 4)
    keys = list(range(100, 112))
    table.reserve(keys)
    table.complete_store(keys)
    table.touch([table_key for table_key in keys if table.slot_of(table_key) < 8])   # ranges 0..7 are hot
    table.disable_slots(0, 4)
    table.disable_slots(4, 8)
    moved = []
    for lo in (0, 4):
        step = table.retire_slots(lo, lo + 4)
        moved += list(step.dst_slots)
        table.finish_moves(step.moved_keys)
    assert moved and all(slot >= 8 for slot in moved)
    assert table.used_in_range(0, 8) == 0 and table.stats().capacity == 4


def test_finish_moves_checks_every_key_before_changing_any() -> None:
    table = _table(8)
    table.reserve([1, 2])
    table.complete_store([1, 2])
    table.touch([1, 2])
    table.enable_slots(4, 8)
    step = table.retire_slots(0, 4)
    assert sorted(step.moved_keys) == [1, 2]
    with pytest.raises(kv_extension().KvTransferError, match="no move in flight"):
        table.finish_moves([1, 99])
    assert table.lookup(1) == PENDING         # unchanged by the refused call
    table.finish_moves([1, 2], ok=False)      # failed copies drop the blocks
    assert table.lookup(1) == MISS and len(table) == 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_retire_matches_a_reference_model(data) -> None:
    """Retiring a range keeps the hottest blocks, as a plain model of the policy does: each
    candidate (hottest first) takes a free slot outside the range, else the slot of the least recently
    used evictable block older than itself, else is evicted."""
    segments, per = 4, data.draw(st.integers(2, 12), label="slots per segment")
    table = BlockTable(segments * per)
    table.enable_slots(0, segments * per)
    count = data.draw(st.integers(1, segments * per), label="blocks")
    keys = list(range(1, count + 1))
    table.reserve(keys)
    table.complete_store(keys)
    order = list(keys)                                        # least recently used first
    for key in data.draw(st.lists(st.sampled_from(keys), max_size=3 * count), label="touches"):
        table.touch([key])
        order.remove(key)
        order.append(key)
    pinned = set(data.draw(st.lists(st.sampled_from(keys), max_size=count // 2, unique=True), label="pinned"))
    for key in pinned:
        table.acquire([key])
        order.remove(key)
        order.append(key)
    retired = data.draw(st.integers(0, segments - 1), label="retired segment")
    lo, hi = retired * per, (retired + 1) * per
    slot = {key: table.slot_of(key) for key in keys}
    inside = {k for k in keys if lo <= slot[k] < hi}
    free = segments * per - count - sum(1 for s in range(lo, hi) if s not in slot.values())

    # The reference model.
    rank = {key: i for i, key in enumerate(order)}
    candidates = sorted((k for k in inside if k not in pinned), key=rank.get, reverse=True)
    gone, moved, evicted = set(), set(), set()
    for key in candidates:
        if free > 0:
            free -= 1
            moved.add(key)
            continue
        victim = next((k for k in order if rank[k] < rank[key] and k not in inside and k not in pinned
                       and k not in gone), None)
        if victim is not None:
            gone.add(victim)
            evicted.add(victim)
            moved.add(key)
        else:
            gone.add(key)
            evicted.add(key)

    step = table.retire_slots(lo, hi)
    assert set(step.moved_keys.tolist()) == moved
    assert set(step.evicted.tolist()) == evicted
    assert step.busy == len(inside & pinned)
    assert all(not lo <= s < hi for s in step.dst_slots.tolist())


def test_retire_evicts_cold_blocks_in_the_range() -> None:
    table = BlockTable(8)
    table.enable_slots(0, 4)
    table.enable_slots(4, 8)
    keys = list(range(100, 108))
    table.reserve(keys)
    table.complete_store(keys)
    table.touch(list(range(100, 104)))       # the blocks outside the range are the hot ones
    step = table.retire_slots(0, 4)
    assert len(step.moved_keys) == 0 and sorted(step.evicted) == [104, 105, 106, 107]


def test_retire_without_relocation_evicts_and_reports_pinned_blocks() -> None:
    table = _table(4)
    table.reserve([1, 2])
    table.complete_store([1])             # 2 in flight
    step = table.retire_slots(0, 4, relocate=False)
    assert list(step.evicted) == [1] and step.busy == 1 and len(step.moved_keys) == 0
    table.complete_store([2])
    step = table.retire_slots(0, 4, relocate=False)
    assert list(step.evicted) == [2] and step.busy == 0 and table.used_in_range(0, 4) == 0


def test_clear_and_remove_keep_pinned_blocks() -> None:
    table = _table()
    table.reserve([1, 2, 3])
    table.complete_store([1, 2, 3])
    table.acquire([2])
    assert sorted(table.remove([1, 2])) == [1]
    assert sorted(table.clear()) == [3]
    assert len(table) == 1


def test_range_checks_name_the_bounds() -> None:
    table = BlockTable(4)
    with pytest.raises(kv_extension().KvTransferError, match=r"range \[2, 9\) is outside \[0, 4\)"):
        table.enable_slots(2, 9)
