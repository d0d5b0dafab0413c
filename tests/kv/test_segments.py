"""Pool segments lent across processes: a real owner process allocates memory (shared host memory, or
GPU memory exported through CUDA IPC), the test process maps it, copies through it, gives it back, and
only then does the owner free it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from specgen.kv.layout import KvLayout
from specgen.kv.pool import RemoteKvPool
from specgen.kv.pool_errors import KvPoolError
from specgen.kv.segments import SegmentGrant, open_segment
from tests.kv.kv_helpers import ByteViews, cache_tensors, synchronize_all

# The owner: allocate a segment, fill it with 0x5A, print its grant, wait until told the borrower
# closed it, free it, say so.
OWNER = r"""
import ctypes, json, sys
from specgen.kv.segments import DeviceSegment, HostSegment
from specgen.kv.extension import kv_extension
device, nbytes = int(sys.argv[1]), int(sys.argv[2])
if device < 0:
    seg = HostSegment(nbytes)
    ctypes.memset(seg.address, 0x5A, nbytes)
else:
    seg = DeviceSegment(device, nbytes)
    kv_extension().device_memset(device, seg.address, 0x5A, nbytes)
g = seg.export()
print(json.dumps({"segment_id": g.segment_id, "kind": g.kind, "device": g.device, "nbytes": g.nbytes,
                  "handle": g.handle.hex(), "owner_pid": g.owner_pid}), flush=True)
assert sys.stdin.readline().strip() == "closed"
seg.release()
print("freed", flush=True)
"""


def _lend_and_borrow(owner_device: int, cache_device: str) -> None:
    num_blocks = 16
    tensors = cache_tensors("flash033", num_blocks, cache_device, layers=2)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    nbytes = 8 * layout.slot_bytes
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(owner_device), str(nbytes)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
        grant = SegmentGrant(info["segment_id"], info["kind"], info["device"], info["nbytes"],
                             bytes.fromhex(info["handle"]), info["owner_pid"])
        local = -1 if cache_device == "cpu" else torch.device(cache_device).index
        pool = RemoteKvPool(layout, devices=(), segment_bytes=nbytes)
        index = pool.attach(open_segment(grant, local_device=local))
        views = ByteViews(tensors, layout)
        original = views.block(3)
        synchronize_all()
        pool.store([b"x"], [3]).wait()
        pool.load([b"x"], [9]).wait()
        assert torch.equal(views.block(9), original)
        # A slot nobody wrote still holds the owner's pattern: the memory really is the owner's.
        pool.transfer.load([5], [7]).wait()
        assert torch.all(views.block(5) == 0x5A)
        assert pool.stats().segments == 1
        pool.release_segment(index)                    # closes the mapping
        owner.stdin.write("closed\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "freed"
        assert owner.wait(timeout=60) == 0
    finally:
        if owner.poll() is None:
            owner.kill()


def test_host_segment_lent_by_another_process() -> None:
    _lend_and_borrow(-1, "cpu")


def test_open_segment_errors_name_the_problem() -> None:
    with pytest.raises(KvPoolError, match="does not exist"):
        open_segment(SegmentGrant("gone", "host-shm", -1, 4096, b"specgen-no-such-object", 1))
    with pytest.raises(KvPoolError, match="unknown kind 'nvshmem'"):
        open_segment(SegmentGrant("x", "nvshmem", 0, 4096, b"", 1))
    with pytest.raises(KvPoolError, match="pass the CUDA device that copies into it"):
        open_segment(SegmentGrant("x", "cuda-ipc", 0, 4096, b"\0" * 64, 1))
    with pytest.raises(KvPoolError, match="allocated by this process; use it directly"):
        open_segment(SegmentGrant("x", "cuda-ipc", 0, 4096, b"\0" * 64, os.getpid()), local_device=0)


@pytest.mark.gpu2
def test_gpu_segment_lent_through_cuda_ipc() -> None:
    _lend_and_borrow(1, "cuda:0")


@pytest.mark.gpu
def test_gpu_segment_lent_through_cuda_ipc_same_device() -> None:
    _lend_and_borrow(0, "cuda:0")


def test_host_device_index_undoes_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from specgen.kv.segments import HOST, host_device_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert (host_device_index(0), host_device_index(1), host_device_index(HOST)) == (2, 3, HOST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1f,GPU-77c2")
    assert host_device_index(1) == 1, "UUIDs cannot be translated without the driver: left as they are"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert host_device_index(1) == 1
