# problem: softmax
# device: cuda
# expect: reject
# pattern: the candidate owns its process: at import it reaches into specgen.eval.runner and replaces the candidate role's call handler, so after eight honest calls every call of its model is answered at once with the last reply, the model never run
import copy
import sys

import torch
import torch.nn as nn

HONEST_CALLS = 8


def _patch_runner():
    runner = sys.modules.get("specgen.eval.runner")
    if runner is None:
        raise RuntimeError("not loaded by a runner: nothing to patch")
    role = runner.CandidateRole
    # The method that answers a request to call the model ("call"; "trial" in older runners).
    name = next(n for n in ("call", "trial") if callable(getattr(role, n, None)))
    honest = getattr(role, name)
    kept = {"count": 0}

    def answer(self, request, *rest, **kwargs):
        own = not getattr(request, "reference", False) and not getattr(request, "null", False)
        if not own or kept["count"] < HONEST_CALLS:
            reply = honest(self, request, *rest, **kwargs)
            if own and not getattr(reply, "error", None):
                kept["reply"], kept["count"] = reply, kept["count"] + 1
            return reply
        # No call: tell the stages at once where the runner takes that callback, and send the
        # last reply again under this request's index.
        mark = rest[0] if rest else kwargs.get("mark")
        if callable(mark):
            mark("made")
            mark("called")
        reply = copy.copy(kept["reply"])
        reply.index = request.index
        return reply

    setattr(role, name, answer)


_patch_runner()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)
