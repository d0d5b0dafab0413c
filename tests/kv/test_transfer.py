"""KvTransfer: batched block copies between an engine cache and pool segments, on host memory here
and on one or two GPUs (gpu / gpu2 markers) on the GPU machine."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from specgen.kv.extension import kv_extension
from specgen.kv.layout import KvLayout
from specgen.kv.transfer import KvTransfer
from tests.kv.kv_helpers import ByteViews, cache_tensors, synchronize_all


def _segments(layout: KvLayout, slots_per_segment: int, count: int, device: str) -> list[torch.Tensor]:
    # Poisoned, so a slot the copy should have written but did not is caught.
    return [torch.full((slots_per_segment * layout.slot_bytes,), 0xA5, dtype=torch.uint8, device=device)
            for _ in range(count)]


def _roundtrip(kind: str, cache_device: str, pool_device: str, method: str, num_blocks: int = 48,
               layers: int = 2) -> None:
    tensors = cache_tensors(kind, num_blocks, cache_device, layers=layers, seed=hash((kind, method)) % 1000)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    sps = 8
    segments = _segments(layout, sps, 3, pool_device)
    transfer = KvTransfer(layout, slots_per_segment=sps, max_segments=4)
    for index, seg in enumerate(segments):
        transfer.set_segment(index, seg.data_ptr())
    views = ByteViews(tensors, layout)
    rng = np.random.default_rng(7)
    blocks = rng.choice(num_blocks, size=20, replace=False)
    slots = rng.choice(3 * sps, size=20, replace=False)
    before = {int(b): views.block(int(b)) for b in blocks}
    synchronize_all()

    stream = torch.cuda.current_stream(cache_device).cuda_stream if cache_device != "cpu" else 0
    transfer.store(blocks, slots, stream=stream, method=method).wait()
    for b, s in zip(blocks, slots):
        assert torch.equal(views.slot(segments, sps, int(s)), before[int(b)]), f"slot {s} != block {b}"

    # Load into other blocks, overwritten with junk first.
    targets = rng.permutation(np.setdiff1d(np.arange(num_blocks), blocks))[:20]
    for t in tensors:
        t.zero_()
    synchronize_all()
    transfer.load(targets, slots, stream=stream, method=method).wait()
    for t_block, b in zip(targets, blocks):
        assert torch.equal(views.block(int(t_block)), before[int(b)]), f"block {t_block} != stored block {b}"


@pytest.mark.parametrize("kind", ["flash033", "split", "cpu032", "unaligned"])
def test_host_roundtrip_every_layout(kind: str) -> None:
    _roundtrip(kind, "cpu", "cpu", "auto")


def test_host_copy_rejects_out_of_range_indices_with_source_location() -> None:
    tensors = cache_tensors("flash033", 8, "cpu")
    layout = KvLayout.from_tensors(tensors, 8)
    transfer = KvTransfer(layout, slots_per_segment=4, max_segments=2)
    seg = _segments(layout, 4, 1, "cpu")[0]
    transfer.set_segment(0, seg.data_ptr())
    error = kv_extension().KvTransferError
    with pytest.raises(error, match=r"csrc/transfer\.cpp:\d+: engine block id 8 at position 1 is outside \[0, 8\)"):
        transfer.store([0, 8], [0, 1])
    with pytest.raises(error, match=r"pool slot 5 at position 0 is in segment 1, which has no memory"):
        transfer.load([0], [5])
    with pytest.raises(error, match=r"pool slot 9 .* outside \[0, 8\)"):
        transfer.load([0], [9])


def test_host_transfer_refuses_device_index_without_gpu() -> None:
    if kv_extension().device_count() > 0:
        pytest.skip("this machine has a GPU")
    tensors = cache_tensors("flash033", 4, "cpu")
    ext = kv_extension()
    region = ext.Region(tensors[0].data_ptr(), tensors[0].stride(0) * 2, tensors[0][0].numel() * 2, 0)
    with pytest.raises(ext.KvTransferError, match=r"region 0 lives on host memory but the transfer was created for "
                                                  r"CUDA device 0"):
        ext.Transfer(0, [region], 4, 1 << 16, 4, 1)


def test_move_slots_copies_whole_slots() -> None:
    tensors = cache_tensors("split", 8, "cpu")
    layout = KvLayout.from_tensors(tensors, 8)
    transfer = KvTransfer(layout, slots_per_segment=4, max_segments=2)
    segments = [torch.randint(0, 255, (4 * layout.slot_bytes,), dtype=torch.uint8) for _ in range(2)]
    for i, seg in enumerate(segments):
        transfer.set_segment(i, seg.data_ptr())
    rows = [s.view(4, layout.slot_bytes) for s in segments]
    expected = rows[0][1].clone()
    transfer.move_slots([1], [6]).wait()
    assert torch.equal(rows[1][2], expected)


def test_resolved_method_on_host_is_memcpy() -> None:
    tensors = cache_tensors("flash033", 4, "cpu")
    transfer = KvTransfer(KvLayout.from_tensors(tensors, 4), slots_per_segment=2, max_segments=1)
    assert transfer.resolved_method("auto") == "memcpy"
    with pytest.raises(ValueError, match="unknown copy method 'fast'"):
        transfer.store([0], [0], method="fast")


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kernel", "batch", "memcpy", "auto"])
@pytest.mark.parametrize("kind", ["flash033", "split", "unaligned"])
def test_gpu_roundtrip_same_device(kind: str, method: str) -> None:
    _roundtrip(kind, "cuda:0", "cuda:0", method)


@pytest.mark.gpu2
@pytest.mark.parametrize("method", ["kernel", "batch", "memcpy", "auto"])
@pytest.mark.parametrize("kind", ["flash033", "split", "unaligned"])
def test_gpu_roundtrip_peer_device(kind: str, method: str) -> None:
    _roundtrip(kind, "cuda:0", "cuda:1", method)


@pytest.mark.gpu2
@pytest.mark.parametrize("method", ["kernel", "batch"])
def test_gpu_many_layers_use_the_device_region_table(method: str) -> None:
    # 40 layers with split K/V: 80 regions, more than the kernel takes as parameters.
    _roundtrip("split", "cuda:0", "cuda:1", method, layers=40)


def _gpu_moves(kind: str, pool_device: str) -> None:
    # More moves than one launch takes (2,048), across segments, as a large shrink makes them.
    tensors = cache_tensors(kind, 4, "cuda:0", layers=1)
    layout = KvLayout.from_tensors(tensors, 4)
    sps, count = 4096, 3
    transfer = KvTransfer(layout, slots_per_segment=sps, max_segments=4)
    segments = [torch.randint(0, 255, (sps * layout.slot_bytes,), dtype=torch.uint8, device=pool_device)
                for _ in range(count)]
    for index, seg in enumerate(segments):
        transfer.set_segment(index, seg.data_ptr())
    rows = torch.cat([seg.view(sps, layout.slot_bytes) for seg in segments])
    before = rows.clone()
    rng = np.random.default_rng(3)
    picked = rng.permutation(count * sps)[:2 * 2500]
    src, dst = picked[:2500], picked[2500:]
    synchronize_all()
    transfer.move_slots(src, dst).wait()
    after = torch.cat([seg.view(sps, layout.slot_bytes) for seg in segments])
    assert torch.equal(after[torch.as_tensor(dst, device=pool_device)], before[torch.as_tensor(src, device=pool_device)])
    untouched = torch.as_tensor(np.setdiff1d(np.arange(count * sps), dst), device=pool_device)
    assert torch.equal(after[untouched], before[untouched])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["flash033", "unaligned"])
def test_gpu_move_slots_same_device(kind: str) -> None:
    _gpu_moves(kind, "cuda:0")


@pytest.mark.gpu2
def test_gpu_move_slots_peer_device() -> None:
    _gpu_moves("flash033", "cuda:1")


@pytest.mark.gpu
def test_gpu_copy_is_ordered_after_the_compute_stream() -> None:
    tensors = cache_tensors("flash033", 8, "cuda:0", layers=1)
    layout = KvLayout.from_tensors(tensors, 8)
    segment = _segments(layout, 4, 1, "cuda:0")[0]
    transfer = KvTransfer(layout, slots_per_segment=4, max_segments=1)
    transfer.set_segment(0, segment.data_ptr())
    compute = torch.cuda.Stream("cuda:0")
    copy_stream = torch.cuda.Stream("cuda:0")
    synchronize_all()
    with torch.cuda.stream(compute):
        torch.cuda._sleep(100_000_000)   # ~50 ms of GPU time before the cache is written
        tensors[0][3].fill_(7.0)
    event = transfer.store([3], [2], stream=copy_stream.cuda_stream, after=compute.cuda_stream)
    assert not event.done(), "the copy finished before the compute stream's work it waits for"
    event.wait()
    assert event.done()
    views = ByteViews(tensors, layout)
    assert torch.equal(views.slot([segment], 4, 2), views.block(3))
    assert torch.all(tensors[0][3] == 7.0)


@pytest.mark.gpu
def test_gpu_cuda_errors_carry_file_and_line() -> None:
    ext = kv_extension()
    with pytest.raises(ext.KvTransferError, match=r"csrc/cuda_ops\.cu:\d+: cudaIpcOpenMemHandle.* failed: cuda"):
        ext.ipc_open(0, b"\x00" * 64)
    with pytest.raises(ext.KvTransferError, match=r"CUDA device 99 does not exist"):
        ext.device_alloc(99, 1024)


def test_persistent_method_needs_a_gpu() -> None:
    tensors = cache_tensors("flash033", 4, "cpu")
    transfer = KvTransfer(KvLayout.from_tensors(tensors, 4), slots_per_segment=2, max_segments=1)
    error = kv_extension().KvTransferError
    with pytest.raises(error, match="persistent copier needs a CUDA device"):
        transfer.start_persistent()


def _persistent_cycle(pool_device: str) -> None:
    num_blocks = 256
    tensors = cache_tensors("flash033", num_blocks, "cuda:0", layers=2)
    layout = KvLayout.from_tensors(tensors, num_blocks)
    sps = 64
    segments = _segments(layout, sps, 2, pool_device)
    transfer = KvTransfer(layout, slots_per_segment=sps, max_segments=4)
    transfer.set_segment(0, segments[0].data_ptr())
    views = ByteViews(tensors, layout)
    synchronize_all()
    transfer.start_persistent(idle_us=1000)
    assert transfer.persistent_running
    error = kv_extension().KvTransferError
    with pytest.raises(error, match="cannot wait for `after`"):
        transfer.load([0], [0], method="persistent", after=torch.cuda.current_stream(0).cuda_stream)
    with pytest.raises(error, match="at most 14 blocks"):
        transfer.load(list(range(15)), list(range(15)), method="persistent")
    # A segment added while the copier runs is used by later requests.
    transfer.set_segment(1, segments[1].data_ptr())
    rng = np.random.default_rng(3)
    # More requests than the ring has entries, several in flight at once.
    for round_ in range(12):
        blocks = rng.choice(num_blocks // 2, size=int(rng.integers(1, 15)), replace=False)
        slots = rng.choice(2 * sps, size=len(blocks), replace=False)
        events = [transfer.store([b], [s], method="persistent") for b, s in zip(blocks, slots)]
        events.append(transfer.store(blocks, slots, method="persistent"))    # several blocks in one request
        for e in events:
            e.wait(timeout_s=10)
        assert all(e.done() for e in events)
        for b, s in zip(blocks, slots):
            assert torch.equal(views.slot(segments, sps, int(s)), views.block(int(b))), f"round {round_}: slot {s}"
        targets = num_blocks // 2 + rng.choice(num_blocks // 2, size=len(blocks), replace=False)
        transfer.load(targets, slots, method="persistent").wait(timeout_s=10)
        for t, b in zip(targets, blocks):
            assert torch.equal(views.block(int(t)), views.block(int(b)))
    cycles, ns = transfer.persistent_last_timing()
    assert cycles == 0 and ns > 0
    # Idle, the kernel leaves the GPU: device-wide synchronization returns, and the next request
    # brings the kernel back.
    launches = transfer.persistent_launches()
    time.sleep(0.01)
    torch.cuda.synchronize(0)
    transfer.load([num_blocks - 1], [0], method="persistent").wait(timeout_s=10)
    assert torch.equal(views.block(num_blocks - 1), views.slot(segments, sps, 0))
    assert transfer.persistent_launches() == launches + 1
    transfer.stop_persistent()
    assert not transfer.persistent_running
    with pytest.raises(error, match="start the persistent copier first"):
        transfer.load([0], [0], method="persistent")


@pytest.mark.gpu
def test_gpu_persistent_copier_same_device() -> None:
    _persistent_cycle("cuda:0")


@pytest.mark.gpu2
def test_gpu_persistent_copier_peer_device() -> None:
    _persistent_cycle("cuda:1")
