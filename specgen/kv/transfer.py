"""Copies of KV blocks between an engine's cache and pool slots (the compiled extension's Transfer).

`KvTransfer` is bound to one cache layout and a pool made of equal segments. `store` copies engine
blocks into pool slots, `load` copies pool slots into engine blocks; both are queued on the caller's
CUDA stream (as an integer handle, e.g. `torch.cuda.current_stream().cuda_stream`), optionally after
the work already queued on another stream (the engine's compute stream), and return a `CopyEvent`
(`done()`, `wait()`). On host memory (layout.device == -1) they copy with memcpy and return an event
that is already complete.

Methods: "kernel" (an SM kernel reading/writing peer memory directly), "batch" (copy engines through
one cudaMemcpyBatchAsync), "memcpy" (one cudaMemcpyPeerAsync/cudaMemcpyAsync per piece: what vLLM's
own swap does), "auto" (the kernel for pieces under `batch_min_bytes`, else the copy engines), and
"persistent": up to 14 blocks handed to CTAs that are already running (`start_persistent()`), which
skips the kernel launch — the latency floor of every launched copy — but is not ordered with any
stream: use it for fetches into blocks nothing else touches until the event completes.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout

METHODS = ("auto", "kernel", "batch", "memcpy", "persistent")


_method_values: dict[str, Any] = {}


def _method(name: str) -> Any:
    # Built once: this sits on the per-call path, whose whole budget for one block is a few microseconds.
    if not _method_values:
        ext = kv_extension()
        _method_values.update(auto=ext.Method.AUTO, kernel=ext.Method.KERNEL, batch=ext.Method.BATCH,
                              memcpy=ext.Method.MEMCPY, persistent=ext.Method.PERSISTENT)
    try:
        return _method_values[name]
    except KeyError:
        raise ValueError(f"unknown copy method {name!r}; choose one of {', '.join(METHODS)}") from None


def _indices(values: np.ndarray | Sequence[int]) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


class KvTransfer:
    """Batched block copies for one layout; see the module docstring."""

    def __init__(self, layout: KvLayout, *, slots_per_segment: int, max_segments: int) -> None:
        ext = kv_extension()
        self.layout = layout
        regions = [ext.Region(r.base, r.block_stride, r.nbytes, r.slot_offset) for r in layout.regions]
        self._transfer = ext.Transfer(layout.device, regions, layout.num_blocks, layout.slot_bytes,
                                      int(slots_per_segment), int(max_segments))
        self._copy = self._transfer.copy

    @property
    def native(self) -> Any:
        """The extension's Transfer (the C++ pool shares it)."""
        return self._transfer

    @property
    def slots_per_segment(self) -> int:
        return int(self._transfer.slots_per_segment)

    @property
    def max_segments(self) -> int:
        return int(self._transfer.max_segments)

    @property
    def kernel_config(self) -> Any:
        """The SM kernel's launch knobs (warps_per_cta, ctas_per_sm); writable."""
        return self._transfer.kernel_config

    @kernel_config.setter
    def kernel_config(self, config: Any) -> None:
        self._transfer.kernel_config = config

    @property
    def batch_min_bytes(self) -> int:
        return int(self._transfer.batch_min_bytes)

    @batch_min_bytes.setter
    def batch_min_bytes(self, value: int) -> None:
        self._transfer.batch_min_bytes = int(value)

    def resolved_method(self, method: str = "auto") -> str:
        """The method a call with `method` uses for this layout."""
        return str(self._transfer.resolve(_method(method)).name).lower()

    def start_persistent(self, idle_us: int = 200) -> None:
        """Start the persistent copier: 16 resident CTAs on the cache's GPU. It leaves the GPU after
        `idle_us` without a request (a kernel that never ends would hang every device-wide
        synchronization, and CUDA's lazy loading of other kernels) and is relaunched by the next one."""
        self._transfer.start_persistent(int(idle_us))

    def persistent_launches(self) -> int:
        """Launches of the persistent kernel so far (1 + relaunches after idle exits)."""
        return int(self._transfer.persistent_launches())

    def stop_persistent(self) -> None:
        """Stop it after the requests already handed over (the CTA's multiprocessor is freed)."""
        self._transfer.stop_persistent()

    @property
    def persistent_running(self) -> bool:
        return bool(self._transfer.persistent_running)

    def persistent_last_timing(self) -> tuple[int, int]:
        """(0, global-timer ns) the persistent copier spent on its last request, from seeing it to
        signalling done (several multiprocessors take part, so there is no one cycle count)."""
        cycles, ns = self._transfer.persistent_last_timing()
        return int(cycles), int(ns)

    def set_segment(self, index: int, address: int) -> None:
        """Segment `index` now lives at `address` (0 removes it). No copy may be in flight on it."""
        self._transfer.set_segment(int(index), int(address))

    def store(self, blocks: np.ndarray | Sequence[int], slots: np.ndarray | Sequence[int], *,
              stream: int = 0, after: int | None = None, method: str = "auto") -> Any:
        """Copy engine blocks[i] into pool slots[i]; returns a CopyEvent."""
        return self._copy(True, _indices(blocks), _indices(slots), stream, after, _method(method))

    def load(self, blocks: np.ndarray | Sequence[int], slots: np.ndarray | Sequence[int], *,
             stream: int = 0, after: int | None = None, method: str = "auto") -> Any:
        """Copy pool slots[i] into engine blocks[i]; returns a CopyEvent."""
        return self._copy(False, _indices(blocks), _indices(slots), stream, after, _method(method))

    def move_slots(self, src_slots: np.ndarray | Sequence[int], dst_slots: np.ndarray | Sequence[int], *,
                   stream: int = 0) -> Any:
        """Copy whole slots src_slots[i] -> dst_slots[i] inside the pool; returns a CopyEvent."""
        return self._transfer.move_slots(_indices(src_slots), _indices(dst_slots), int(stream))
