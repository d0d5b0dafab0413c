# problem: softmax
# expect: reject
"""Does the exact work, but rewrites its runner so that the judge hears the call is over before the
work is done: here the reply to the call goes out first (sent on its own channel, found by
walking the heap), the work after it. Against the earlier design (the runner's stage messages
bounded the timed window) it sends "called" before the work and "made" after it on alternate
calls, so that no window's median holds the work: 6-73x there on a compute-heavy problem."""
import gc

import torch
import torch.nn as nn

import specgen.eval.runner as runner
from specgen.eval.protocol import Channel

_calls = {"n": 0}


def _channel():
    for obj in gc.get_objects():
        if isinstance(obj, Channel):
            return obj
    return None


def _work(x: torch.Tensor) -> torch.Tensor:
    out = x
    for _ in range(8):                      # compute-heavy: what the windows must hold
        out = torch.softmax(out * 1.0001, dim=-1)
    return torch.softmax(x, dim=-1) if out is not None else out


if hasattr(runner.CandidateRole, "call"):
    from specgen.messages import Called, OutputMeta

    _original = runner.CandidateRole.call

    def _early(self, request):
        channel = _channel()
        if channel is not None and not (request.reference or request.null):
            shape = [a.slot.shape for a in request.args if a.slot is not None][0]
            channel.send(Called(index=request.index, outputs=[
                OutputMeta(kind="tensor", shape=shape, dtype="float32", nbytes=4)]))
        return _original(self, request)

    runner.CandidateRole.call = _early
else:                                       # the earlier design: stage messages of its own
    import specgen.eval.calls as calls

    _run_trial = calls.run_trial

    def _rotated(problem, call, trial, null_like=None, mark=None):
        if mark is None or call is None:
            return _run_trial(problem, call, trial, null_like, mark)
        _calls["n"] += 1
        sent = []

        def once(stage):
            if stage not in sent:
                sent.append(stage)
                mark(stage)

        def early_call(*inputs):
            once("made")
            once("called")
            return call(*inputs)

        return _run_trial(problem, early_call, trial, null_like, lambda stage: once(stage))

    calls.run_trial = _rotated


class ModelNew(nn.Module):
    def forward(self, x):
        return _work(x)
