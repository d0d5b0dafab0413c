"""Pool memory: segments of device or host memory, and their sharing between processes.

A pool is made of equal segments so that it can shrink and grow a segment at a time. A segment is
memory this process allocated (`DeviceSegment` on a GPU, `HostSegment` in shared host memory) or
memory another process lent it (`open_segment` on a `SegmentGrant`): a profiling worker that owns
spare GPU memory allocates a segment, `export()`s a grant (a CUDA IPC handle, or the name of a POSIX
shared-memory object for host memory), and the engine's process opens it and copies into it directly.
The owner frees the memory only after the borrower has closed it (CUDA IPC requires that order).
"""
from __future__ import annotations

import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from specgen.kv.extension import kv_extension
from specgen.kv.pool_errors import KvPoolError

HOST = -1  # device index used for host memory


def host_device_index(device: int) -> int:
    """The host-wide index (as nvidia-smi and specgen-node number GPUs) of this process's CUDA device.

    CUDA_VISIBLE_DEVICES renumbers GPUs per process, while the scheduler pairs a pool with the workers
    of the same GPU across processes. Host memory (-1) stays -1; a list that is not plain indices (GPU
    UUIDs) cannot be translated without the driver and is left as it is.
    """
    if device == HOST:
        return HOST
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible) and visible[device].isdigit():
        return int(visible[device])
    return device


@dataclass(frozen=True)
class SegmentGrant:
    """What a borrower needs to map a lent segment (it crosses a process boundary as plain data)."""

    segment_id: str          # unique name, chosen by the owner
    kind: str                # "cuda-ipc" | "host-shm"
    device: int              # CUDA device of the memory, or -1 for host memory
    nbytes: int
    handle: bytes            # CUDA IPC handle (64 bytes) or the shared-memory object's name
    owner_pid: int           # the process that allocated it


class SegmentMemory(ABC):
    """A piece of pool memory as seen from this process."""

    segment_id: str
    device: int
    nbytes: int
    address: int

    @abstractmethod
    def release(self) -> None:
        """Free the memory (owner) or unmap it (borrower). Idempotent."""

    def export(self) -> SegmentGrant:
        raise KvPoolError(f"segment {self.segment_id} cannot be shared with another process")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class DeviceSegment(SegmentMemory):
    """GPU memory allocated with cudaMalloc through the extension (IPC needs a whole allocation)."""

    def __init__(self, device: int, nbytes: int, segment_id: str | None = None) -> None:
        self.segment_id = segment_id or _new_id("kvseg")
        self.device = int(device)
        self.nbytes = int(nbytes)
        self.address = int(kv_extension().device_alloc(self.device, self.nbytes))

    def export(self) -> SegmentGrant:
        handle = kv_extension().ipc_export(self.device, self.address)
        return SegmentGrant(self.segment_id, "cuda-ipc", self.device, self.nbytes, bytes(handle), os.getpid())

    def release(self) -> None:
        if self.address:
            kv_extension().device_free(self.device, self.address)
            self.address = 0


class HostSegment(SegmentMemory):
    """Host memory in a POSIX shared-memory object, so another process can map it by name."""

    def __init__(self, nbytes: int, segment_id: str | None = None) -> None:
        self.segment_id = segment_id or _new_id("kvseg")
        self.device = HOST
        self.nbytes = int(nbytes)
        self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(create=True, size=self.nbytes)
        self._view: np.ndarray | None = np.frombuffer(self._shm.buf, dtype=np.uint8, count=self.nbytes)
        self.address = int(self._view.ctypes.data)

    def export(self) -> SegmentGrant:
        assert self._shm is not None, "segment already released"
        return SegmentGrant(self.segment_id, "host-shm", HOST, self.nbytes, self._shm.name.encode(), os.getpid())

    def release(self) -> None:
        if self._shm is None:
            return
        self._view = None           # drop the exported buffer before closing the mapping
        self._shm.close()
        self._shm.unlink()
        self._shm = None
        self.address = 0

    def __del__(self) -> None:
        # A pool that was never closed must not leave the object behind in /dev/shm.
        try:
            self.release()
        except Exception:
            pass


class _OpenedHostSegment(SegmentMemory):
    def __init__(self, grant: SegmentGrant) -> None:
        self.segment_id = grant.segment_id
        self.device = HOST
        self.nbytes = grant.nbytes
        name = grant.handle.decode()
        try:
            self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            raise KvPoolError(f"host segment {grant.segment_id}: shared-memory object {name!r} does not exist "
                              "(its owner released it or exited)") from None
        # The owner unlinks the object; without this, Python's resource tracker would unlink it when this
        # (borrowing) process exits, pulling it from under the owner.
        resource_tracker.unregister(self._shm._name, "shared_memory")  # type: ignore[attr-defined]
        self._view: np.ndarray | None = np.frombuffer(self._shm.buf, dtype=np.uint8, count=self.nbytes)
        self.address = int(self._view.ctypes.data)

    def release(self) -> None:
        if self._shm is None:
            return
        self._view = None
        self._shm.close()
        self._shm = None
        self.address = 0


class _OpenedDeviceSegment(SegmentMemory):
    def __init__(self, grant: SegmentGrant, local_device: int) -> None:
        self.segment_id = grant.segment_id
        self.device = grant.device
        self.nbytes = grant.nbytes
        self._local_device = int(local_device)
        self.address = int(kv_extension().ipc_open(self._local_device, grant.handle))

    def release(self) -> None:
        if self.address:
            kv_extension().ipc_close(self._local_device, self.address)
            self.address = 0


def open_segment(grant: SegmentGrant, *, local_device: int = HOST) -> SegmentMemory:
    """Map a segment another process lent. `local_device` is the CUDA device that will copy into it
    (the engine's GPU); CUDA IPC cannot map memory into the process that allocated it."""
    if grant.kind == "host-shm":
        return _OpenedHostSegment(grant)
    if grant.kind == "cuda-ipc":
        if grant.owner_pid == os.getpid():
            raise KvPoolError(f"segment {grant.segment_id} was allocated by this process; use it directly "
                              "instead of opening its CUDA IPC handle")
        if local_device < 0:
            raise KvPoolError(f"segment {grant.segment_id} is GPU memory: pass the CUDA device that copies into "
                              "it as local_device")
        return _OpenedDeviceSegment(grant, local_device)
    raise KvPoolError(f"segment {grant.segment_id} has unknown kind {grant.kind!r} (expected cuda-ipc or host-shm)")


class PrivateHostSegment(SegmentMemory):
    """Host memory only this process uses (nothing to clean up if the process is killed)."""

    def __init__(self, nbytes: int, segment_id: str | None = None) -> None:
        self.segment_id = segment_id or _new_id("kvseg")
        self.device = HOST
        self.nbytes = int(nbytes)
        self._buffer: np.ndarray | None = np.empty(self.nbytes, dtype=np.uint8)
        self.address = int(self._buffer.ctypes.data)

    def release(self) -> None:
        self._buffer = None
        self.address = 0


def release_segments(segments: Iterable[SegmentMemory]) -> None:
    """Release several segments: the GPU memory of each device in one extension call, so a thread
    giving memory back hands the interpreter over once per device, not once per segment."""
    by_device: dict[int, list[DeviceSegment]] = {}
    for segment in segments:
        if isinstance(segment, DeviceSegment) and segment.address:
            by_device.setdefault(segment.device, []).append(segment)
        else:
            segment.release()
    for device, owned in by_device.items():
        kv_extension().device_free_many(device, [s.address for s in owned])
        for segment in owned:
            segment.address = 0


def allocate_segment(device: int, nbytes: int, *, shareable: bool = False) -> SegmentMemory:
    """A new segment of `nbytes` on a CUDA device (always shareable through CUDA IPC), or in host memory
    for device -1 (a POSIX shared-memory object when `shareable`)."""
    if device != HOST:
        return DeviceSegment(device, nbytes)
    return HostSegment(nbytes) if shareable else PrivateHostSegment(nbytes)
