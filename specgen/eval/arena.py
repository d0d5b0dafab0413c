"""The arena: the memory a call's inputs are handed over in and its outputs are read back from.

A candidate owns its whole process, runner code included, so nothing its process reports about its
outputs can be believed: not a digest it computed, not a copy it serves on a later request, not the
time it says a stage ended. So the trusted side holds the data. The **reference runner** (which
runs the problem's code only) owns the arena: two regions, the inputs and the outputs, on the
device (a GPU's memory shared by file descriptor through CUDA's virtual memory management,
`csrc/arena/`; on the CPU a sealed memfd). The candidate's runner maps both. One call (eval/
exchange.py) is:

1. `Hand`: the reference runner makes the inputs from a seed the judge drew (the problem's own
   `get_inputs()`), keeps them, and copies them into the input region; the judge's window starts
   as it sends this, so nothing of the inputs exists anywhere before the window opens;
2. `Call`: the runner calls its model on views of the input region and copies the outputs into the
   output region, synchronizing the device before its reply, whose arrival ends the window;
3. `Read`: the reference runner reads the output region itself (a digest with signs the judge
   drew after the call, never sent to the candidate's process), re-reads the input region against
   the inputs it kept (a call that changed them), computes its own output on the kept inputs,
   compares, and reads the outputs again last: outputs that changed in between were still being
   written after the call returned.

The regions keep their addresses from call to call, so a result cached by pointer comes back
stale on the next inputs. The layout (`pack`) is a pure function of shapes and dtypes, so the
judge can check what a runner says of its outputs without torch: every slot within the region,
a bounded count of tensors and dimensions, known dtypes.

This module imports torch only inside the functions that need it (runners); the judge uses
`pack`, `nbytes` and `check_slots`.
"""
from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any, Sequence

from specgen.messages import OutputMeta, Slot

ALIGN = 512                     # torch's allocator's alignment: kernels may assume it of inputs
MAX_TENSORS = 64                # tensors of one call's inputs or outputs
MAX_DIMS = 8
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "int16": 2,
               "int32": 4, "int64": 8, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


def nbytes(slot: Slot) -> int:
    count = 1
    for dim in slot.shape:
        count *= dim
    return count * DTYPE_SIZES[slot.dtype]


def pack(described: Sequence[tuple[Sequence[int], str]]) -> tuple[list[Slot], int]:
    """Slots for tensors of these (shape, dtype), one after another at ALIGN boundaries, and the
    bytes they take."""
    slots, offset = [], 0
    for shape, dtype in described:
        slot = Slot(offset=offset, shape=list(shape), dtype=dtype)
        slots.append(slot)
        offset += -(-nbytes(slot) // ALIGN) * ALIGN
    return slots, offset


def check_slots(slots: Sequence[Slot], capacity: int) -> str | None:
    """Why these slots cannot be read from a region of `capacity` bytes (None: they can)."""
    if len(slots) > MAX_TENSORS:
        return f"{len(slots)} tensors, more than {MAX_TENSORS}"
    end = 0
    for index, slot in enumerate(slots):
        if slot.dtype not in DTYPE_SIZES:
            return f"tensor {index} has dtype {slot.dtype[:40]!r}, not one the arena holds"
        if len(slot.shape) > MAX_DIMS or any(d < 0 or d > capacity for d in slot.shape):
            return f"tensor {index} has shape {slot.shape[:MAX_DIMS + 1]}"
        if slot.offset < end or slot.offset % ALIGN:
            return f"tensor {index} lies at offset {slot.offset}, not after the one before it"
        end = slot.offset + nbytes(slot)
        if end > capacity:
            return f"tensor {index} ends at byte {end}, beyond the region's {capacity}"
    return None


def claimed(outputs: Sequence[OutputMeta], capacity: int) -> list[Slot] | str:
    """The slots of the output tensors a runner says its call left (packed as `pack` lays them
    out), or why they cannot be read from an output region of `capacity` bytes."""
    tensors = [m for m in outputs if m.kind == "tensor"]
    if len(tensors) > MAX_TENSORS:
        return f"{len(tensors)} tensors, more than {MAX_TENSORS}"
    for index, meta in enumerate(tensors):
        if meta.dtype not in DTYPE_SIZES:
            return f"tensor {index} has dtype {meta.dtype[:40]!r}, not one the arena holds"
        if len(meta.shape) > MAX_DIMS or any(d < 0 or d > capacity for d in meta.shape):
            return f"tensor {index} has shape {meta.shape[:MAX_DIMS + 1]}"
    slots, _ = pack([(m.shape, m.dtype) for m in tensors])
    return check_slots(slots, capacity) or slots


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class _DevicePointer:
    """A raw device range as torch's `as_tensor` takes it (the CUDA array interface)."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


class Region:
    """One region of an arena in this process: made here (`fd=None`: the reference runner) or
    mapped from a descriptor another process made (the candidate's runner)."""

    def __init__(self, device: str, size: int, fd: int | None = None) -> None:
        import torch

        self.device = device
        self.cuda = device.startswith("cuda")
        self.index = (torch.device(device).index or 0) if self.cuda else 0
        self.owner = fd is None
        self.map: mmap.mmap | None = None
        self.ptr = 0
        if self.cuda:
            from specgen.eval import _arena  # type: ignore[attr-defined]

            if fd is None:
                self.fd, self.ptr, self.size = _arena.create(self.index, max(size, 1))
            else:
                _, self.ptr, self.size = _arena.open(self.index, fd, size)
                os.close(fd)
                self.fd = -1
            self.bytes = torch.as_tensor(_DevicePointer(self.ptr, self.size), device=device)
            return
        if fd is None:
            fd = os.memfd_create("specgen-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            self.size = -(-max(size, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
            os.ftruncate(fd, self.size)
            # Sealed against resizing: a runner holding the descriptor cannot shrink it under
            # the reference runner's mapping (a read past its end would kill the reference).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_SEAL)
        else:
            self.size = os.fstat(fd).st_size
            if self.size < size:
                os.close(fd)
                raise ValueError(f"the arena's region holds {self.size} bytes, not {size}")
        self.fd = fd
        self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        if not self.owner:
            os.close(fd)
            self.fd = -1
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)

    def view(self, slot: Slot) -> Any:
        import torch

        end = slot.offset + nbytes(slot)
        if end > self.size:
            raise ValueError(f"a tensor ending at byte {end} lies beyond the region's {self.size}")
        raw = self.bytes[slot.offset:end]
        return raw.view(getattr(torch, slot.dtype)).view(slot.shape)

    def close(self) -> None:
        self.bytes = None
        if self.cuda and self.ptr:
            from specgen.eval import _arena  # type: ignore[attr-defined]

            _arena.close(self.index, self.ptr, self.size)
            self.ptr = 0
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass            # a tensor still views it; it goes with the process
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Arena:
    """The two regions (see the module doc)."""

    def __init__(self, inputs: Region, outputs: Region) -> None:
        self.inputs = inputs
        self.outputs = outputs

    @classmethod
    def make(cls, device: str, input_bytes: int, output_bytes: int) -> Arena:
        return cls(Region(device, input_bytes), Region(device, output_bytes))

    @classmethod
    def mapped(cls, device: str, input_bytes: int, output_bytes: int, fds: list[int]) -> Arena:
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"an arena comes with 2 descriptors, not {len(fds)}")
        try:
            inputs = Region(device, input_bytes, fds[0])
        except BaseException:
            os.close(fds[1])
            raise
        return cls(inputs, Region(device, output_bytes, fds[1]))

    @property
    def fds(self) -> tuple[int, int]:
        return self.inputs.fd, self.outputs.fd

    def close(self) -> None:
        self.inputs.close()
        self.outputs.close()


def lay_out(values: Sequence[Any]) -> tuple[list[Slot], int]:
    """The slots of the tensors among `values` (the tensors as `pack` lays them out)."""
    import torch

    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    return pack([(tuple(t.shape), dtype_name(t.dtype)) for t in tensors])


def put(region: Region, slots: Sequence[Slot], tensors: Sequence[Any]) -> None:
    """Copy `tensors` into their slots of `region` (contiguous there, whatever their strides)."""
    for slot, tensor in zip(slots, tensors):
        if nbytes(slot):
            region.view(slot).copy_(tensor.detach().reshape(slot.shape))


def views(region: Region, slots: Sequence[Slot]) -> list[Any]:
    return [region.view(slot) for slot in slots]
