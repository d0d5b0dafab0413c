"""The physical floor: no correct kernel can run faster than its minimum traffic or arithmetic allows.

floor = max((bytes the call must read - L2 size) / peak memory bandwidth, flops / peak rate). The
bytes are the inputs and the model's parameters (every one of them must be read at least once;
outputs are left out because a small output can still sit in L2 when the call returns). Each
call's inputs are made right before it (eval/calls.py), so up to the L2's size of them may still
be in the cache: that much is not counted. Flops come from the problem's optional `get_flops()`
(bundled problems define it). Peaks are datasheet figures, an upper bound on what any kernel
reaches: a candidate timed below the floor did not do the work and is flagged `beyond-floor`.
"""
from __future__ import annotations

# Substring of torch.cuda.get_device_name() -> (memory GB/s, dense TFLOP/s for fp32 via TF32,
# dense TFLOP/s for fp16/bf16, L2 MB). Datasheet values (SXM parts).
_PEAKS: list[tuple[str, float, float, float, float]] = [
    ("H200", 4800.0, 495.0, 990.0, 50.0),
    ("H100", 3350.0, 495.0, 990.0, 50.0),
    ("A100", 2039.0, 156.0, 312.0, 40.0),
    ("L40S", 864.0, 183.0, 366.0, 96.0),
]


def device_peaks(device_name: str) -> tuple[float, float, float, float] | None:
    for key, bandwidth, tf32, half, l2 in _PEAKS:
        if key in device_name:
            return bandwidth, tf32, half, l2
    return None


def floor_ms(bytes_read: int, flops: int | None, device_name: str, dtype_is_half: bool,
             peak_bandwidth_gbs: float | None = None, peak_tflops: float | None = None
             ) -> float | None:
    """The least time a correct kernel can take, or None where the peaks are unknown."""
    peaks = device_peaks(device_name)
    bandwidth = peak_bandwidth_gbs or (peaks[0] if peaks else None)
    rate = peak_tflops or (peaks[2 if dtype_is_half else 1] if peaks else None)
    if bandwidth is None:
        return None
    l2_bytes = (peaks[3] if peaks else 0.0) * 1e6
    floor = max(bytes_read - l2_bytes, 0.0) / (bandwidth * 1e9) * 1e3
    if flops and rate:
        floor = max(floor, flops / (rate * 1e12) * 1e3)
    return floor
