"""The digest of a trial's tensors: one number per tensor that only the right values give.

    digest(x) = sum over i of x_i * s_i, in float64,

over the tensor's elements in row-major order, where s_i is +1 or -1: the top bit of
splitmix64(t + (i + 1) * gamma), t the tensor's own seed (`tensor_seed`: the trial's digest seed,
a salt that keeps outputs' and inputs' signs apart, the tensor's position and its shape, so a
right value in the wrong shape does not match).

Why signs from a hash: the digest then reads the tensor once and writes nothing. Weights drawn
into a tensor of the output's size (as Gaussian weights must be) are written, read again and
multiplied into another temporary, which on a GPU was most of each timed call's overhead
(docs/evaluation.md, "Timing"). Signs test as well: with e = output - reference independent of
the signs, sum(e s) has mean 0, deviation |e| and sub-Gaussian tails (Hoeffding), the
assumptions of `output_checks.digest_bound`. The candidate's process can compute the signs, as
it could draw the weights; matching the reference's digest with a wrong output still needs the
reference's digest, which only the right output gives it.

Three paths give the same number, up to float64 rounding in the order of the sum: the compiled
module's CUDA kernel for tensors on a GPU, its host loop for tensors in memory (both from
csrc/digest/), and `torch_digest`, the same hash in torch operations, where the module is not
built (and as the other two's test oracle). Both runners of an evaluation are forks of one
template, so they take the same path.

Importing this module imports torch: it runs in runners only.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

OUTPUTS = 0                     # salt of an output's digest
INPUTS = 1                      # salt of an input's digest (after the call: did the call change it?)

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_CHUNK = 1 << 22                # elements per step of torch_digest (bounded temporaries)

_NATIVE = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


def splitmix64(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def tensor_seed(seed: int, salt: int, position: int, shape: tuple[int, ...]) -> int:
    """The seed of one tensor's signs (see the module doc)."""
    t = splitmix64(seed)
    for value in (salt, position, len(shape), *shape):
        t = splitmix64((t ^ (value & _MASK)) + _GAMMA)
    return t


_module: ModuleType | None = None
_loaded = False


def extension() -> ModuleType | None:
    """The compiled module (specgen.eval._digest), or None where it is not built."""
    global _module, _loaded
    if not _loaded:
        _loaded = True
        try:
            _module = importlib.import_module("specgen.eval._digest")
        except ImportError:
            _module = None
    return _module


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical shift of int64 values holding uint64 bits (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def torch_digest(values: torch.Tensor, seed: int) -> float:
    """The digest of a contiguous real tensor with the tensor seed `seed`, in torch operations
    (int64 arithmetic wraps as uint64 does; the sign is the top bit)."""
    flat = values.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    gamma, mix1, mix2, start = _signed(_GAMMA), _signed(_MIX1), _signed(_MIX2), _signed(seed)
    for begin in range(0, flat.numel(), _CHUNK):
        chunk = flat[begin:begin + _CHUNK]
        z = torch.arange(begin + 1, begin + 1 + chunk.numel(), dtype=torch.int64,
                         device=flat.device) * gamma + start
        z = (z ^ _shift_right(z, 30)) * mix1
        z = (z ^ _shift_right(z, 27)) * mix2
        z = z ^ _shift_right(z, 31)
        total += torch.where(z < 0, -chunk.to(torch.float64), chunk.to(torch.float64)).sum()
    return float(total)


def _prepared(leaf: torch.Tensor) -> torch.Tensor:
    """The tensor as the digest reads it: real, of a dtype the paths read natively, row-major."""
    values = torch.view_as_real(leaf).sum(-1) if leaf.is_complex() else leaf
    if values.dtype not in _NATIVE:
        values = values.to(torch.float64)      # integers and booleans exactly (below 2**53)
    return values.detach().contiguous()


def _on(leaf: torch.Tensor, device: torch.device) -> bool:
    return leaf.device.type == device.type and (device.index is None
                                                or leaf.device.index == device.index)


def digests(leaves: list[Any], seed: int, salt: int, device: str) -> list[float]:
    """The digest of each tensor among `leaves` (other leaves are skipped), in order; NaN for a
    tensor not on `device`. One device-to-host read for all of a GPU's."""
    target = torch.device(device)
    module = extension()
    out: list[float] = []
    queued: list[tuple[int, torch.Tensor, int]] = []  # (index in out, tensor, its seed): GPU kernel
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    for position, leaf in enumerate(tensors):
        t = tensor_seed(seed, salt, position, tuple(leaf.shape))
        if not _on(leaf, target):
            out.append(float("nan"))
            continue
        values = _prepared(leaf)
        if module is not None and values.device.type == "cpu":
            out.append(float(module.host_digest(values.data_ptr(), values.numel(),
                                                module.DType(_NATIVE[values.dtype]), t)))
        elif module is not None and values.device.type == "cuda" and module.cuda_compiled():
            out.append(0.0)
            queued.append((len(out) - 1, values, t))
        else:
            out.append(torch_digest(values, t))
    if queued:
        sums = torch.zeros(len(queued), dtype=torch.float64, device=queued[0][1].device)
        stream = torch.cuda.current_stream(sums.device).cuda_stream
        for k, (_, values, t) in enumerate(queued):
            module.device_digest(values.device.index, values.data_ptr(), values.numel(),
                                 module.DType(_NATIVE[values.dtype]), t, sums.data_ptr() + 8 * k,
                                 stream)
        for (index, _, _), value in zip(queued, sums.tolist()):
            out[index] = float(value)
    return out
