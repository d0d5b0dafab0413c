"""The arena's layout (a pure function the judge checks claims with) and its CPU regions: sealed
memfds that a runner holding the descriptor can write but cannot resize."""
from __future__ import annotations

import os

import pytest
import torch

from specgen.eval.arena import ALIGN, Arena, Region, check_slots, nbytes, pack
from specgen.messages import Slot


def test_tensors_are_packed_at_aligned_offsets_one_after_another() -> None:
    slots, total = pack([([3], "float32"), ([2, 2], "float64"), ([0], "int8")])
    assert [s.offset for s in slots] == [0, ALIGN, 2 * ALIGN]
    assert total == 2 * ALIGN and nbytes(slots[1]) == 32
    assert check_slots(slots, total) is None
    assert "beyond" in check_slots(slots, total - 1)


def test_a_region_is_shared_through_its_descriptor_and_cannot_be_resized() -> None:
    owner = Region("cpu", 1000)
    mapped = Region("cpu", 1000, os.dup(owner.fd))
    slot = Slot(offset=0, shape=[10], dtype="float32")
    mapped.view(slot).copy_(torch.arange(10, dtype=torch.float32))
    assert torch.equal(owner.view(slot), torch.arange(10, dtype=torch.float32))
    # the candidate's runner holds the descriptor: shrinking it under the reference would kill it
    with pytest.raises(PermissionError):
        os.ftruncate(owner.fd, 0)
    with pytest.raises(ValueError):
        mapped.view(Slot(offset=owner.size, shape=[1], dtype="float32"))
    mapped.close()
    owner.close()


def test_an_arena_comes_with_two_descriptors_or_none_is_kept() -> None:
    arena = Arena.make("cpu", 64, 64)
    one = os.dup(arena.fds[0])
    with pytest.raises(ValueError):
        Arena.mapped("cpu", 64, 64, [one])
    with pytest.raises(OSError):
        os.fstat(one)                               # closed, not leaked
    arena.close()
