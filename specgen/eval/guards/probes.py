"""Probes: what the evaluation flow (`specgen.eval.harness`) checks by running the candidate.

Each function takes the running `Evaluation` and records what it finds as flags (or notes, when a
probe cannot apply); the flow decides when each runs. Most of them need the candidate and the
reference side by side: the same inputs, a second call, other parameter values, a second shape,
a profiler. The list of every guard and what it stops is in `specgen.eval.guards`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from specgen.eval.compare import compare, flatten
from specgen.eval.floor import floor_ms
from specgen.eval.guards.dynamic import precision_state, restore_precision

if TYPE_CHECKING:
    from specgen.eval.harness import Evaluation


def check_globals(ev: Evaluation) -> None:
    """After the module loads and after each call: what the sentinels and the precision state
    saw changed (both are put back, so the rest of the evaluation runs on trusted functions)."""
    changed = ev.sentinels.check()
    if changed:
        problem = [c for c in changed if c.startswith("problem")]
        timers = [c for c in changed if any(w in c for w in (
            "time.", "Event", "synchronize", "elapsed_time", "perf_counter", "do_bench"))]
        if problem:
            ev.flag(f"problem-namespace: changed {', '.join(problem[:5])}")
        if timers:
            ev.flag(f"timer-patch: replaced {', '.join(timers[:5])}")
        rest = [c for c in changed if c not in problem and c not in timers]
        if rest:
            ev.flag(f"monkey-patch: replaced {', '.join(rest[:5])}")
    now = precision_state()
    diff = [k for k, v in now.items() if ev.precision0.get(k) != v]
    if diff:
        ev.flag(f"precision: changed {', '.join(diff)}")
        restore_precision(ev.precision0)


def trial_guards(ev: Evaluation, out_c: Any, out_r: Any, cand_in: list[Any],
                 ref_in: list[Any], pristine: list[Any], previous: list[Any], what: str) -> None:
    """Per correctness trial: where the outputs live and whether the inputs survived; a
    mutation or aliasing the reference itself does counts as the problem's, not a cheat."""
    cand_outs = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]
    ref_outs = [t for t in flatten(out_r) if isinstance(t, torch.Tensor)]
    cand_inputs = [x for x in cand_in if isinstance(x, torch.Tensor)]
    ref_inputs = [x for x in ref_in if isinstance(x, torch.Tensor)]
    ref_mutates = any(not _same(a, b) for a, b in zip(ref_in, pristine))
    if not ref_mutates and any(not _same(a, b) for a, b in zip(cand_in, pristine)):
        ev.flag(f"mutated-inputs: the candidate changed its input tensors on {what}")
    ref_aliases = any(_overlap(o, x) for o in ref_outs for x in ref_inputs)
    if not ref_aliases and any(_overlap(o, x) for o in cand_outs for x in cand_inputs):
        ev.flag(f"output-aliases-input: the output shares memory with an input on {what}")
    persistent = _module_tensors(ev.cand)
    if any(_overlap(o, p) for o in cand_outs for p in persistent):
        ev.flag(f"output-aliases-persistent: the output shares memory with a tensor "
                f"the module keeps, on {what}")
    if any(_overlap(o, r) for o in cand_outs for r in ref_outs):
        ev.flag(f"reads-reference-output: the output is the reference's output on {what}")
    if any(_overlap(o, p) for o in cand_outs for p in previous):
        ev.flag(f"same-output-buffer: {what} returned the storage of the previous call's "
                "output, which was still alive")


def memo_probe(ev: Evaluation) -> None:
    """Same input buffers, new values: a result cached by pointer or shape comes back stale."""
    what = "inputs refreshed in place"
    inputs = ev.clone(ev.make_inputs(ev.base_seed + 2000))
    if not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        ev.notes.append("memoization probe skipped: no floating-point inputs")
        return
    first = [t.clone() for t in flatten(ev.call_candidate(inputs, what))
             if isinstance(t, torch.Tensor)]
    fresh = ev.make_inputs(ev.base_seed + 2001)
    for held, new in zip(inputs, fresh):
        if isinstance(held, torch.Tensor):
            held.copy_(new)
    out_c = ev.call_candidate(inputs, what)
    out_r = ev.call_reference(ev.clone(fresh))
    result = compare(out_c, out_r, ev.options.atol, ev.options.rtol)
    if result.ok:
        return
    second = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]
    if len(second) == len(first) and all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, second)):
        ev.flag("memoized: the output did not change when the input values changed in "
                "place (a result cached by data pointer, shape or call)")
    else:
        ev.compare_outputs(out_c, out_r, what)


def randomized_params_trial(ev: Evaluation) -> None:
    """The same random parameter values in both models: outputs baked in for the initial
    weights, or parameters that do not line up with the reference's, show."""
    if not isinstance(ev.cand, torch.nn.Module):
        ev.notes.append("randomized-parameter trial skipped: ModelNew is not an nn.Module")
        return
    ref_params = list(ev.ref.named_parameters())
    cand_params = list(ev.cand.named_parameters())
    if not ref_params and not cand_params:
        return
    pairs = _match_parameters(ref_params, cand_params)
    if pairs is None:
        ev.flag("parameter-mismatch: Model has " + _describe_params(ref_params) +
                "; ModelNew has " + _describe_params(cand_params))
        return
    generator = torch.Generator(device="cpu").manual_seed(ev.base_seed + 3000)
    for ref_p, cand_p in pairs:
        noise = torch.randn(ref_p.shape, generator=generator, dtype=torch.float32)
        factor = 0.5 + torch.rand(ref_p.shape, generator=generator, dtype=torch.float32)
        spread = float(ref_p.detach().float().std()) if ref_p.numel() > 1 else 0.0
        spread = spread if spread > 0 else 1.0
        new = (ref_p.detach().float().cpu() * factor + 0.1 * spread * noise)
        ref_p.data.copy_(new.to(ref_p.dtype).to(ref_p.device))
        cand_p.data.copy_(new.to(cand_p.dtype).reshape(cand_p.shape).to(cand_p.device))
    what = "randomized parameters"
    inputs = ev.make_inputs(ev.base_seed + 3001)
    out_c = ev.call_candidate(ev.clone(inputs), what)
    out_r = ev.call_reference(ev.clone(inputs))
    result = compare(out_c, out_r, ev.options.atol, ev.options.rtol)
    if not result.ok:
        ev.flag(f"initial-params-only: with random parameter values loaded into both "
                f"models the outputs differ ({result.reason})")


def second_shape_trial(ev: Evaluation) -> None:
    """The problem's shape constants changed (read only by get_inputs): a kernel hard-coded to
    the one shape fails; a shape the reference rejects is skipped with a note."""
    names = _shape_constants(ev.problem)
    if not names:
        ev.notes.append("second shape skipped: no module constant is read only by "
                        "get_inputs()")
        return
    saved = {name: getattr(ev.problem, name) for name in names}
    changed = {name: _other_size(value) for name, value in saved.items()}
    what = "second shape " + ", ".join(f"{k}={v}" for k, v in changed.items())
    try:
        for name, value in changed.items():
            setattr(ev.problem, name, value)
        try:
            ev.seed(ev.base_seed + 4000)
            inputs = ev.generate()
            out_r = ev.ref(*ev.clone(inputs))
            ev.sync()
        except BaseException as exc:  # noqa: BLE001
            ev.notes.append(f"second shape skipped: the reference rejects {what} "
                            f"({type(exc).__name__})")
            ev.sync_or_stop()
            return
        launches, errors = ev.ledger.launches, len(ev.ledger.errors)
        try:
            out_c = ev.cand(*ev.clone(inputs))
            ev.sync()
        except BaseException as exc:  # noqa: BLE001
            ev.launches += ev.ledger.launches - launches
            ev.sync_or_stop()
            ev.flag(f"hard-coded-shape: ModelNew raised on {what}: "
                    f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        ev.launches += ev.ledger.launches - launches
        if len(ev.ledger.errors) > errors:
            ev.flag(f"kernel-error-fallback: its kernel raised on {what} and the call still "
                    f"returned: {ev.ledger.errors[errors]}")
        result = compare(out_c, out_r, ev.options.atol, ev.options.rtol)
        if not result.ok:
            ev.flag(f"hard-coded-shape: wrong on {what}: {result.reason}")
    finally:
        for name, value in saved.items():
            setattr(ev.problem, name, value)


def kernels_ran(ev: Evaluation) -> None:
    """A candidate that defines kernels must have run one (a failed build falls back silently)."""
    failed = [b for b in ev.ledger.builds if not b.ok]
    if failed:
        ev.flag(f"custom-kernel-not-run: extension {failed[0].name} failed to build "
                f"({(failed[0].error or '')[:300]}) and the candidate ran without it")
    elif ev.candidate.claims_custom_kernels and ev.launches == 0:
        kinds = " and ".join(ev.candidate.kernel_kinds)
        ev.flag(f"custom-kernel-not-run: the candidate defines {kinds} kernels but none "
                "of them ran")


def profiler_probe(ev: Evaluation) -> None:
    """Which kernels, on which streams: compared with what the reference launches."""
    from torch.profiler import ProfilerActivity, profile

    # The flow's own stop must pass through; importing it at module level would be circular.
    from specgen.eval.harness import _Stop as Stop

    inputs = ev.make_inputs(ev.base_seed + 5000)

    def kernels(call: Callable[[], Any]) -> list[tuple[str, int]]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        found = []
        for event in prof.profiler.kineto_results.events():
            if str(event.device_type()).endswith("CUDA"):
                found.append((event.name(), int(event.device_resource_id())))
        return found

    ref_in, cand_in = ev.clone(inputs), ev.clone(inputs)  # copies outside the window
    ev.sync()
    try:
        ref_k = kernels(lambda: ev.call_reference(ref_in))
        cand_k = kernels(lambda: ev.call_candidate(cand_in, "profiled call"))
    except Stop:
        raise
    except Exception as exc:  # noqa: BLE001 - the profiler is optional evidence
        ev.notes.append(f"profiler probe skipped: {type(exc).__name__}: {exc}")
        return
    ref_streams = {s for _, s in ref_k}
    extra = sorted({s for _, s in cand_k} - ref_streams)
    if ref_streams and extra:
        names = sorted({n for n, s in cand_k if s in extra})[:3]
        ev.flag(f"side-stream: kernels ran on stream(s) {extra}, the current stream is "
                f"{sorted(ref_streams)} ({', '.join(names)})")
    cand_names, ref_names = {n for n, _ in cand_k}, {n for n, _ in ref_k}
    if ev.candidate.claims_custom_kernels and cand_names and cand_names <= ref_names:
        ev.flag("custom-kernel-not-run: it launched only kernels the reference launches ("
                + ", ".join(sorted(cand_names)[:3]) + ")")
    ev.candidate_kernels = sorted(cand_names)


def floor_check(ev: Evaluation, inputs: list[Any], candidate_ms: float) -> None:
    """No honest kernel beats reading its inputs and parameters once at peak bandwidth, or its
    flops at peak rate: a time below that means work the timer did not see."""
    bytes_read = sum(x.numel() * x.element_size() for x in inputs
                     if isinstance(x, torch.Tensor))
    bytes_read += sum(p.numel() * p.element_size() for p in ev.ref.parameters())
    flops = None
    get_flops = getattr(ev.problem, "get_flops", None)
    if callable(get_flops):
        try:
            flops = int(get_flops())
        except Exception:  # noqa: BLE001
            flops = None
    half = any(isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16)
               for x in inputs)
    floor = floor_ms(bytes_read, flops, ev.device_name, half,
                     ev.options.peak_bandwidth_gbs, ev.options.peak_tflops)
    if floor is None:
        ev.notes.append(f"floor check skipped: no peak figures for {ev.device_name}")
        return
    ev.verdict.floor_ms = floor
    if candidate_ms < floor:
        ev.flag(f"beyond-floor: {candidate_ms:.4f} ms is below the physical floor "
                f"{floor:.4f} ms ({bytes_read} bytes"
                + (f", {flops} flops" if flops else "") + f" on {ev.device_name})")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return True


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    if t.numel() == 0:
        return None
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if storage.nbytes() else None


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    sa, sb = _span(a), _span(b)
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def _module_tensors(module: Any) -> list[torch.Tensor]:
    """Tensors a module keeps between calls: parameters, buffers and plain tensor attributes."""
    if not isinstance(module, torch.nn.Module):
        return []
    found = list(module.parameters()) + list(module.buffers())
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found += [v for v in value if isinstance(v, torch.Tensor)]
            elif isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, torch.Tensor)]
    return found


def _match_parameters(ref: list[tuple[str, torch.Tensor]], cand: list[tuple[str, torch.Tensor]]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Pairs of (reference, candidate) parameters, by name, else by order; same number of
    elements required (a flattened copy of a parameter lines up, a differently sized one not)."""
    if len(ref) != len(cand):
        return None
    ref_by_name, cand_by_name = dict(ref), dict(cand)
    if set(ref_by_name) == set(cand_by_name) and all(
            ref_by_name[n].numel() == cand_by_name[n].numel() for n in ref_by_name):
        return [(ref_by_name[n], cand_by_name[n]) for n in ref_by_name]
    if all(r.numel() == c.numel() for (_, r), (_, c) in zip(ref, cand)):
        return [(r, c) for (_, r), (_, c) in zip(ref, cand)]
    return None


def _describe_params(params: list[tuple[str, torch.Tensor]]) -> str:
    if not params:
        return "no parameters"
    shown = ", ".join(f"{name}{tuple(p.shape)}" for name, p in params[:6])
    return shown + (f" and {len(params) - 6} more" if len(params) > 6 else "")


def _shape_constants(problem: Any) -> list[str]:
    """Module-level ints read by get_inputs() but not by get_init_inputs() or Model."""
    def names_read(fn: Any) -> set[str]:
        code = getattr(fn, "__code__", None)
        found: set[str] = set()
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            found |= set(c.co_names)
            stack += [k for k in c.co_consts if hasattr(k, "co_names")]
        return found

    by_inputs = names_read(problem.get_inputs)
    by_init = names_read(problem.get_init_inputs)
    model = problem.Model
    for value in vars(model).values():
        by_init |= names_read(value)
    return sorted(n for n in by_inputs - by_init
                  if isinstance(getattr(problem, n, None), int)
                  and not isinstance(getattr(problem, n), bool))


def _other_size(value: int) -> int:
    """A different size of the same kind: 3/4 of it (kept even), or one more when small."""
    if value < 4:
        return value + 1
    other = (value * 3) // 4
    if value % 2 == 0 and other % 2:
        other += 1
    return other if other != value else value + 2
