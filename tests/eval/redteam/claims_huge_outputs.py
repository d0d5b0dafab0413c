# problem: softmax
# expect: error:cannot be read
"""Rewrites its runner to say its output is 2**61 x 2**61 float32, 2**63-1 bytes: a size the judge
must bound before it sizes anything after it. Against the earlier design (a buffer sized from the
reply's `nbytes` before the output was shipped) it raised OverflowError out of the worker."""
import torch
import torch.nn as nn

import specgen.eval.runner as runner
from specgen.messages import OutputMeta

_HUGE = [OutputMeta(kind="tensor", shape=[2**61, 2**61], dtype="float32", nbytes=2**63 - 1)]
_name = "call" if hasattr(runner.CandidateRole, "call") else "trial"
_original = getattr(runner.CandidateRole, _name)


def _claim(self, request, *rest):
    reply = _original(self, request, *rest)
    if not (request.reference or request.null):
        reply.outputs = list(_HUGE)
    return reply


setattr(runner.CandidateRole, _name, _claim)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
