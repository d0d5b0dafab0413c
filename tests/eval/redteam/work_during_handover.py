# problem: softmax
# expect: honest-speed 0.5
"""A thread watches the arena's input region and starts the work (the softmax three times and 2 ms
more, as in work_after_call_returned.py) the moment the reference runner writes new inputs there,
before its call is even requested: the handover is inside the window, so the work is too."""
import gc
import threading
import time

import torch
import torch.nn as nn

import specgen.eval.runner as runner

_done: dict = {}
_started = threading.Event()


def _arena():
    for obj in gc.get_objects():
        if isinstance(obj, runner.CandidateRole) and obj.arena is not None:
            return obj.arena
    return None


def _watch() -> None:
    last = None
    while True:
        arena = _arena()
        shape = _done.get("shape")
        if arena is None or shape is None:
            time.sleep(0.0005)
            continue
        count = shape[0] * shape[1]
        x = arena.inputs.bytes[:count * 4].view(torch.float32).reshape(shape)
        key = float(x[0, 0])
        if key != last:
            last = key
            out = torch.empty_like(x)
            for _ in range(3):
                torch.softmax(x, dim=-1, out=out)
            time.sleep(0.002)
            _done[key] = out


class ModelNew(nn.Module):
    def forward(self, x):
        _done["shape"] = tuple(x.shape)
        if not _started.is_set():
            _started.set()
            threading.Thread(target=_watch, daemon=True).start()
        key = float(x[0, 0])
        for _ in range(2000):
            if key in _done:
                return _done.pop(key)
            time.sleep(0.0001)
        return torch.softmax(x, dim=-1)
