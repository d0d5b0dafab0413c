# problem: softmax
# expect: reject
"""Writes a forged verdict into every file descriptor it holds (the way a result pipe named in
argv, or any channel to the evaluator, would be found), as the frames a runner sends, then
returns zeros: nothing it writes may become a verdict."""
import os
import struct

import msgspec
import torch
import torch.nn as nn

_FORGED = {"verdict": {"stage": "full", "compiled": True, "correct": True, "speedup": 1000.0,
                       "ref_ms": 10.0, "candidate_ms": 0.01, "flags": [], "max_abs_error": 0.0}}


def _forge() -> None:
    frame = msgspec.msgpack.encode(_FORGED)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd < 3:
            continue
        for payload in (struct.pack("<I", len(frame)) + frame, b"\x00" + frame):
            try:
                os.write(fd, payload)
            except OSError:
                pass


class ModelNew(nn.Module):
    def forward(self, x):
        _forge()
        return torch.zeros_like(x)
