# problem: tiny_outputs
# expect: reject
"""Returns a constant of the outputs' mean (every value is below fp32's absolute tolerance, so the
constant passes it) and rewrites its own runner so that the exact output appears where it is read
only after the reply: a thread writes it into the arena once the reply is on its way. Against the
earlier design (a later `Ship` request copied the output out) it patches the Ship handler to
compute the exact output first: accepted there at tens of x."""
import gc
import threading
import time

import torch
import torch.nn as nn

import specgen.eval.runner as runner

_last: dict = {}


def _arena():
    for obj in gc.get_objects():
        if isinstance(obj, runner.CandidateRole) and getattr(obj, "arena", None) is not None:
            return obj.arena
    return None


def _fix_later(right: torch.Tensor) -> None:
    def write() -> None:
        time.sleep(0.0002)                  # after the reply, before (it hopes) the judge reads
        arena = _arena()
        if arena is not None:
            arena.outputs.bytes[:right.numel() * 4].view(torch.float32).copy_(right.reshape(-1))
    threading.Thread(target=write, daemon=True).start()


if hasattr(runner.CandidateRole, "ship"):   # the earlier design: outputs served on request
    _ship = runner.CandidateRole.ship

    def _exact_ship(self, request, fds):
        if self.last is not None and "x" in _last:
            self.last.leaves = [torch.softmax(_last["x"], dim=-1) * 1e-5]
        return _ship(self, request, fds)

    runner.CandidateRole.ship = _exact_ship


class ModelNew(nn.Module):
    def forward(self, x):
        _last["x"] = x
        if not hasattr(runner.CandidateRole, "ship"):
            _fix_later(torch.softmax(x, dim=-1) * 1e-5)
        return torch.full_like(x, 1e-5 / x.shape[-1])
