"""A runner: a process forked from the template (eval/template.py) that serves one role.

* **reference**: executes the problem's module only (never a candidate's), builds `Model`, and
  owns the arena (eval/arena.py): it makes every call's inputs and hands them over there, reads
  every call's outputs there itself and judges them against its own call and the accurate value
  (eval/compare.py); it also runs calls of its own for the reference's timing. It lives as long as
  its worker keeps evaluating candidates of its problem: what it holds is that problem's reference.
* **candidate**: executes the problem's module (and builds its `Model`: the judge times the
  reference here before any candidate code is loaded), then the candidate's, builds `ModelNew`,
  maps the reference runner's arena and calls a model on its inputs when told, leaving the outputs
  there. It serves one candidate, then its tree is killed. Nothing it replies is a verdict field.
* **build**: executes a candidate's module once with `load_inline` compiling for real into its
  private /tmp, and sends back the records and the libraries; then exits.

Every request gets exactly one reply; anything the candidate does (raise, exit, print) becomes
that reply's error, never a crash of the loop. The loop ends when the judge closes the channel.
"""
from __future__ import annotations

import math
import os
import platform
import resource
import select
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from specgen.eval.protocol import Channel, ChannelClosed
from specgen.eval.arena import Arena
from specgen.messages import (Arg, ArenaMade, ArenaMapped, Awake, Build, BuildResult, BuiltLibrary,
                              Call, Called, Hand, Handed, LoadCandidate, LoadProblem, Look, Looked,
                              MakeArena, MapArena, ParamsSet, ProblemLoaded, Read, ReadDone,
                              RunnerReady, SetParams, Slot, Wake)

_SPIN_S = 0.05            # after a call, wait for the next request without sleeping this long


_work_root: Path | None = None


def work_root() -> Path:
    """This runner's own directory for module sources and builds: in the private /tmp of its
    sandbox, or (unsandboxed) a fresh directory of the host's temporary space."""
    global _work_root
    if _work_root is None:
        _work_root = Path(tempfile.mkdtemp(prefix="specgen-run-"))
    return _work_root


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _watch(channel: Channel) -> None:
    """Exit once the judge is gone (a hang-up on the channel): no runner outlives its worker."""
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLHUP | select.POLLERR)
    while True:
        for _, event in poller.poll():
            if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(3)


class _Looked:
    """The outputs of the call last looked at: where they lie, and their digests then."""

    def __init__(self, request: Look, outputs: list[Any], digests: list[float]) -> None:
        self.request = request
        self.outputs = outputs
        self.digests = digests


class _Held:
    """The inputs the reference runner handed over last, kept until the call's outputs are read:
    its own call runs on these, and the arena's copy must still equal them afterwards."""

    def __init__(self, index: int, shape: dict[str, int], inputs: list[Any],
                 ref: list[Any] | None) -> None:
        self.index = index
        self.shape = shape
        self.inputs = inputs
        self.ref = ref                  # its own outputs when computed early (an untimed call)


def _args(inputs: list[Any], slots: list[Slot]) -> list[Arg] | str:
    """The inputs as a call's arguments: tensors by their slots, plain values as they are."""
    import torch

    args, tensors = [], iter(slots)
    for value in inputs:
        if isinstance(value, torch.Tensor):
            args.append(Arg(slot=next(tensors)))
        elif value is None or isinstance(value, (bool, int, float, str)):
            args.append(Arg(value=value))
        else:
            return f"get_inputs() returns a {type(value).__name__}, which cannot be handed over"
    return args


def _call(model: Any, arena: Arena, args: list[Arg], device: str,
          null_like: list[Any] | None = None) -> Called | list[Any]:
    """Call `model` on the arena's inputs and copy its output tensors into the arena's outputs
    (`null_like` instead of a call: a call of nothing), the device synchronized: the outputs'
    leaves, or a reply saying why they are not there."""
    from specgen.eval.arena import lay_out, put
    from specgen.eval.calls import flatten, synchronize

    inputs = [arena.inputs.view(a.slot) if a.slot is not None else a.value for a in args]
    leaves = list(null_like or []) if model is None else flatten(model(*inputs))
    tensors = [leaf for leaf in leaves if _is_tensor(leaf)]
    slots, need = lay_out(tensors)
    if need > arena.outputs.size:
        return Called(index=-1, error=f"its outputs take {need} bytes, more than the "
                                      f"{arena.outputs.size} the reference's outputs take "
                                      f"(shapes {[list(t.shape) for t in tensors][:4]})")
    put(arena.outputs, slots, tensors)
    synchronize(device)
    return leaves


class ReferenceRole:
    """See the module doc. `model` is the problem as written; `accurate` its accurate value. It
    owns the arena (eval/arena.py) and judges what a call left there."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.problem: Any = None
        self.model: Any = None
        self.accurate: Any = None
        self.compiled: Any = None
        self.params: Any = None
        self.null_like: list[Any] = []
        self.arena: Arena | None = None
        self.held: _Held | None = None
        self.looked: _Looked | None = None
        self.mutates = False                # the problem's Model changes its own inputs
        self.ref_error_norms: list[float] = []   # its own error, largest seen per output

    def load(self, request: LoadProblem) -> ProblemLoaded:
        import torch

        from specgen.eval import params as param_tools
        from specgen.eval.arena import lay_out
        from specgen.eval.calls import ProblemModule, flatten, input_digests
        from specgen.eval.compare import AccurateModel

        try:
            self.problem = ProblemModule(request, self.device, work_root() / "job")
        except BaseException as exc:  # noqa: BLE001 - the problem's module may raise anything
            return ProblemLoaded(error=f"problem {request.problem_name} failed to load: {_error(exc)}")
        if not self.device.startswith("cuda"):
            # A GPU-sized problem on a CPU host is refused at once, saying how to run it small,
            # rather than after minutes of making its inputs and timing its reference.
            from specgen.eval.problem_size import refusal_for

            refusal = refusal_for(self.problem, request.scale)
            if refusal:
                return ProblemLoaded(error=refusal)
        try:
            self.model = self.problem.build(self.problem.module.Model)
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"problem {request.problem_name}: Model(*get_init_inputs()) "
                                       f"raised {_error(exc)}")
        described = param_tools.describe(self.model)
        if described:
            self.params = param_tools.ParamState(list(self.model.parameters()), described)
        try:
            inputs = self.problem.inputs(request.init_seed + 1, {})
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"problem {request.problem_name}: get_inputs() raised "
                                       f"{_error(exc)}")
        # One call now: the size of its outputs (the arena's), and whether the Model changes its
        # own inputs (then a candidate's call may change them too).
        try:
            before = input_digests(inputs, 1, self.device)
            outputs = flatten(self.model(*inputs))
            self.mutates = before != input_digests(inputs, 1, self.device)
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"problem {request.problem_name}: Model raised {_error(exc)}")
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()) \
            if isinstance(self.model, torch.nn.Module) else 0
        self.accurate = AccurateModel(self.model, sum(
            t.numel() * 8 for t in [*tensors, *outputs] if _is_tensor(t) and t.is_floating_point()))
        return ProblemLoaded(
            params=described, input_bytes=lay_out(tensors)[1], output_bytes=lay_out(outputs)[1],
            param_bytes=param_bytes,
            half=any(x.dtype in (torch.float16, torch.bfloat16) for x in tensors),
            flops=self.problem.flops(), shape_constants=self.problem.shape_constants())

    def _model(self, compiled: bool) -> Any:
        if not compiled:
            return self.model
        if self.compiled is None:
            import torch
            self.compiled = torch.compile(self.model)
        return self.compiled

    # ------------------------------------------------------------------ the arena
    def make_arena(self, request: MakeArena) -> tuple[ArenaMade, tuple[int, ...]]:
        from specgen.eval.arena import Region

        arena = self.arena
        if arena is None:
            self.arena = Arena.make(self.device, request.input_bytes, request.output_bytes)
        else:
            if arena.inputs.size < request.input_bytes:
                arena.inputs.close()
                arena.inputs = Region(self.device, request.input_bytes)
            if arena.outputs.size < request.output_bytes:
                arena.outputs.close()
                arena.outputs = Region(self.device, request.output_bytes)
        return (ArenaMade(input_bytes=self.arena.inputs.size,
                          output_bytes=self.arena.outputs.size), self.arena.fds)

    def hand(self, request: Hand) -> tuple[Handed, tuple[int, ...]]:
        from specgen.eval.arena import lay_out, put
        from specgen.eval.calls import flatten, synchronize

        self.held = None
        arena = self.arena
        if arena is None:
            return Handed(index=request.index, error="the reference runner has no arena"), ()
        try:
            inputs = self.problem.inputs(request.seed, request.shape)
        except BaseException as exc:  # noqa: BLE001
            return Handed(index=request.index, error=f"problem {self.problem.name}: get_inputs() "
                                                     f"raised {_error(exc)}"), ()
        tensors = [x for x in inputs if _is_tensor(x)]
        slots, need = lay_out(tensors)
        args = _args(inputs, slots)
        if isinstance(args, str):
            return Handed(index=request.index, error=f"problem {self.problem.name}: {args}"), ()
        grown = need > arena.inputs.size
        if grown:
            self.make_arena(MakeArena(input_bytes=need, output_bytes=0))
        put(arena.inputs, slots, tensors)
        synchronize(self.device)
        ref, out_need = None, 0
        if request.early:
            # An untimed call: the reference's outputs now, so that the arena can be grown to
            # hold them before the call that must fill it.
            try:
                own = [x.clone() if _is_tensor(x) else x for x in inputs] if self.mutates else inputs
                ref = flatten(self.model(*own))
            except BaseException as exc:  # noqa: BLE001
                return Handed(index=request.index, error=f"problem {self.problem.name}: Model "
                                                         f"raised {_error(exc)}"), ()
            out_need = lay_out(ref)[1]
            if out_need > arena.outputs.size:
                self.make_arena(MakeArena(input_bytes=0, output_bytes=out_need))
                grown = True
        self.held = _Held(request.index, request.shape, inputs, ref)
        sizes = [arena.inputs.size, arena.outputs.size] if grown else []
        return (Handed(index=request.index, args=args, input_bytes=need, output_bytes=out_need,
                       grown=grown, arena=sizes), arena.fds if grown else ())

    def call(self, request: Call) -> Called:
        from specgen.eval.calls import output_meta

        if self.arena is None:
            return Called(index=request.index, error="the reference runner has no arena")
        try:
            done = _call(None if request.null else self._model(request.compiled), self.arena,
                         request.args, self.device, self.null_like)
        except BaseException as exc:  # noqa: BLE001
            return Called(index=request.index, error=f"problem {self.problem.name}: Model raised "
                                                     f"{_error(exc)}")
        if isinstance(done, Called):
            done.index = request.index
            return done
        if not request.null:
            self.null_like = _null_like(self.null_like, done)
        return Called(index=request.index)

    def look(self, request: Look) -> Looked:
        """Read the outputs where the runner says the call left them (eval/arena.py, step 3): their
        digests now, the rest in the Read that follows."""
        from specgen.eval.arena import check_slots, views
        from specgen.eval.calls import output_digests

        self.looked = None
        arena = self.arena
        if arena is None:
            return Looked(index=request.index, error="the reference runner has no arena")
        unreadable = check_slots(request.outputs, arena.outputs.size)
        if unreadable:
            return Looked(index=request.index, error=f"its outputs cannot be read: {unreadable}")
        cand = views(arena.outputs, request.outputs)
        self.looked = _Looked(request, cand, output_digests(cand, request.digest_seed, self.device))
        return Looked(index=request.index)

    def read(self, request: Read) -> ReadDone:
        """Judge the outputs looked at (eval/arena.py, step 3)."""
        import torch

        from specgen.eval.calls import flatten, output_digests, output_meta
        from specgen.eval.compare import compare_outputs, digest_bound

        held, looked, arena, index = self.held, self.looked, self.arena, request.index
        if held is None or held.index != index or looked is None or looked.request.index != index \
                or arena is None:
            return ReadDone(index=index, problem_error="no inputs or outputs of that call are held")
        device, seed = self.device, looked.request.digest_seed
        cand, first = looked.outputs, looked.digests
        inputs_changed = not self.mutates and any(
            not torch.equal(arena.inputs.view(slot), value)
            for slot, value in zip(self._handed_slots(held), held.inputs) if slot is not None)
        try:
            # The accurate value before the Model's own call, which may change its inputs.
            accurate = self.accurate.outputs(held.inputs) if request.full else None
            ref = held.ref if held.ref is not None else flatten(self.model(*held.inputs))
        except BaseException as exc:  # noqa: BLE001
            return ReadDone(index=index, problem_error=f"problem {self.problem.name}: Model raised "
                                                       f"{_error(exc)}")
        tensors = [leaf for leaf in ref if _is_tensor(leaf)]
        done = ReadDone(index=index, outputs=output_meta(ref), inputs_changed=inputs_changed,
                        reference_mutates=self.mutates)
        done.reason = _structure_differs(looked.request.outputs, tensors)
        if done.reason is None and accurate is not None:
            acc = [a for a, leaf in zip(accurate, ref) if _is_tensor(leaf)]
            result = compare_outputs(cand, tensors, acc, request.atol, request.rtol)
            done.reason = None if result.ok else result.reason
            done.max_abs, done.max_rel, done.half_ok = result.max_abs, result.max_rel, result.half_ok
            done.accurate = self.accurate.how
            if result.ok and not held.shape:
                self._keep_ref_error(result.ref_error_norms)
        elif done.reason is None:
            ref_digests = output_digests(tensors, seed, device)
            kept = self.ref_error_norms
            for k, (c, r, tensor) in enumerate(zip(first, ref_digests, tensors)):
                error = 2 * kept[k] if k < len(kept) else 0.0
                bound = digest_bound(tensor, error, r, request.atol, request.rtol)
                if not math.isfinite(c) or abs(c - r) > bound:
                    done.reason = (f"output {k} is not the reference's: its digest {c:.6g} is "
                                   f"{abs(c - r):.3g} from the reference's {r:.6g}, beyond the "
                                   f"{bound:.3g} a right output stays within")
                    break
        done.changed = not _same_reading(first, output_digests(cand, seed, device))
        done.ok = done.reason is None and not done.changed
        if self.device.startswith("cuda") and request.full:
            torch.cuda.empty_cache()
        return done

    def _handed_slots(self, held: _Held) -> list[Slot | None]:
        """The arena's slot of each of `held`'s inputs (None for a plain value)."""
        from specgen.eval.arena import lay_out

        slots = iter(lay_out(held.inputs)[0])
        return [next(slots) if _is_tensor(x) else None for x in held.inputs]

    def _keep_ref_error(self, norms: list[float]) -> None:
        kept = self.ref_error_norms
        if len(kept) != len(norms):
            kept[:] = list(norms)
        else:
            kept[:] = [max(a, b) for a, b in zip(kept, norms)]

    def set_params(self, request: SetParams) -> ParamsSet:
        if self.params is None:
            return ParamsSet()
        self.params.load(request.seed)
        self.accurate.invalidate()
        self.compiled = None
        return ParamsSet()


def _same_reading(first: list[float], last: list[float]) -> bool:
    """Two digests of one output, read at Look and again at the end of Read: the same values
    (NaN and infinities, which the comparison rejects for what they are, read the same too)."""
    from specgen.eval.compare import same_digests

    return len(first) == len(last) and all(
        (math.isnan(a) and math.isnan(b)) or a == b or same_digests([a], [b])
        for a, b in zip(first, last))


def _structure_differs(slots: list[Slot], tensors: list[Any]) -> str | None:
    """Why the outputs a runner says it left are not shaped as the reference's (None: they are)."""
    from specgen.eval.arena import dtype_name

    if len(slots) != len(tensors):
        return f"returned {len(slots)} output tensors, the reference returns {len(tensors)}"
    for k, (slot, tensor) in enumerate(zip(slots, tensors)):
        label = f"output {k}" if len(tensors) > 1 else "output"
        if list(slot.shape) != list(tensor.shape):
            return f"{label} has shape {tuple(slot.shape)}, expected {tuple(tensor.shape)}"
        if slot.dtype != dtype_name(tensor.dtype):
            return f"{label} has dtype {slot.dtype}, expected {dtype_name(tensor.dtype)}"
    return None


def _null_like(held: list[Any], leaves: list[Any]) -> list[Any]:
    """What a call of nothing copies: tensors shaped like the last call's outputs (`held`,
    kept while the shapes stay the same)."""
    import torch

    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if [tuple(t.shape) for t in held] == [tuple(t.shape) for t in tensors]:
        return held
    return [torch.zeros_like(t) for t in tensors]


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


class CandidateRole:
    """See the module doc."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.problem: Any = None
        self.model: Any = None
        self.ledger: Any = None
        self.params: Any = None
        self.loaded_problem: LoadProblem | None = None
        self.reference_model: Any = None
        self.null_like: list[Any] = []
        self.arena: Arena | None = None

    def load_problem(self, request: LoadProblem, model: bool = True) -> ProblemLoaded:
        """The problem alone, before any candidate, with its Model built (`model`): the judge
        times the reference here while this process has run no candidate code
        (Profiler.measure_local)."""
        from specgen.eval.calls import ProblemModule

        if self.loaded_problem is not None:
            return ProblemLoaded(error="the candidate's runner has a problem loaded already")
        try:
            self.problem = ProblemModule(request, self.device, work_root() / "job")
            self.loaded_problem = request
            if model:
                self.reference_model = self.problem.build(self.problem.module.Model)
        except BaseException as exc:  # noqa: BLE001 - the problem's module may raise anything
            return ProblemLoaded(error=f"problem {request.problem_name} failed to load in the "
                                       f"candidate's runner: {_error(exc)}")
        return ProblemLoaded()

    def map_arena(self, request: MapArena, fds: list[int]) -> ArenaMapped:
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        try:
            self.arena = Arena.mapped(self.device, request.input_bytes, request.output_bytes, fds)
        except BaseException as exc:  # noqa: BLE001
            return ArenaMapped(error=f"the arena could not be mapped: {_error(exc)}")
        return ArenaMapped()

    def load(self, request: LoadCandidate) -> ProblemLoaded:
        from specgen.eval import extensions
        from specgen.eval.extensions import KernelLedger
        from specgen.eval.guards.dynamic import LaunchCounter
        from specgen.eval.loader import candidate_from_text, exec_source

        if self.loaded_problem is None:        # not timed here first (a validation)
            loaded = self.load_problem(request.problem, model=False)
            if loaded.error:
                return loaded
        elif self.loaded_problem != request.problem:
            return ProblemLoaded(error="the candidate's runner has another problem loaded")
        self.ledger = KernelLedger()
        try:
            candidate = candidate_from_text(request.candidate_source)
        except Exception as exc:  # noqa: BLE001 - checked by the worker already
            return ProblemLoaded(error=f"candidate source: {exc}")
        extensions.install("run", Path(request.cache_dir), work_root() / "build", self.ledger,
                           scope=candidate.sha256, device=self.device)
        LaunchCounter(self.ledger).install()
        kinds = list(candidate.kernel_kinds)
        try:
            module = exec_source(candidate, f"specgen_candidate_{candidate.sha256[:12]}",
                                 work_root() / "job")
            model_new = module.ModelNew
        except BaseException as exc:  # noqa: BLE001 - the candidate's module may raise anything
            return ProblemLoaded(error=f"candidate failed to load: {_error(exc)}{self._build_errors()}",
                                 builds=self.ledger.builds, kernel_kinds=kinds)
        try:
            self.model = self.problem.build(model_new)
            if self.device.startswith("cuda"):
                import torch
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"ModelNew(*get_init_inputs()) raised {_error(exc)}"
                                       f"{self._build_errors()}",
                                 builds=self.ledger.builds, kernel_kinds=kinds)
        return ProblemLoaded(builds=self.ledger.builds, kernel_kinds=kinds)

    def _build_errors(self) -> str:
        failed = [b for b in self.ledger.builds if not b.ok]
        return "".join(f"; extension {b.name} failed to build: {b.error}" for b in failed)

    def call(self, request: Call) -> Called:
        """A call on the arena's inputs: the candidate's ModelNew, or (Call.reference, Call.null)
        the problem's Model or a call of nothing, timed here before the candidate's code is
        loaded and between its calls."""
        from specgen.eval.calls import output_meta

        if self.arena is None:
            return Called(index=request.index, error="the candidate's runner has no arena")
        if request.reference or request.null:
            try:
                if self.reference_model is None and not request.null:
                    self.reference_model = self.problem.build(self.problem.module.Model)
                done = _call(None if request.null else self.reference_model, self.arena,
                             request.args, self.device, self.null_like)
            except BaseException as exc:  # noqa: BLE001 - the candidate's process may break anything
                return Called(index=request.index, error=f"Model raised: {_error(exc)}")
            if isinstance(done, Called):
                done.index = request.index
                return done
            if not request.null:
                self.null_like = _null_like(self.null_like, done)
            return Called(index=request.index, outputs=output_meta(done))
        if self.model is None:
            return Called(index=request.index, error="the candidate's runner has no candidate loaded")

        launches, errors = self.ledger.launches, len(self.ledger.errors)
        try:
            done = _call(self.model, self.arena, request.args, self.device)
        except BaseException as exc:  # noqa: BLE001 - a candidate may raise anything
            done = Called(index=-1, error=f"ModelNew raised: {_error(exc)}" + self._build_errors())
        reply = done if isinstance(done, Called) else Called(index=-1, outputs=output_meta(done))
        reply.index = request.index
        reply.launches = self.ledger.launches - launches
        reply.kernel_errors = self.ledger.errors[errors:errors + 3]
        return reply

    def set_params(self, request: SetParams) -> ParamsSet:
        from specgen.eval import params as param_tools

        try:
            if self.params is None:
                matched = param_tools.match(request.reference, self.model)
                if isinstance(matched, str):
                    return ParamsSet(error=f"parameter-mismatch: {matched}")
                self.params = param_tools.ParamState(matched, request.reference)
            self.params.load(request.seed)
        except BaseException as exc:  # noqa: BLE001
            return ParamsSet(error=f"loading parameters failed: {_error(exc)}")
        return ParamsSet()


def build(request: Build) -> BuildResult:
    """Every load_inline call of the candidate: its module's, its constructor's and its first
    forward's (eval/discovery.py), compiled here so that its runs compile nothing."""
    from specgen.eval import discovery, extensions
    from specgen.eval.extensions import KernelLedger
    from specgen.eval.loader import candidate_from_text, exec_source

    began = time.monotonic()
    ledger = KernelLedger()
    build_dir = work_root() / "build"
    candidate = candidate_from_text(request.candidate_source)
    session = extensions.install("build", Path(request.cache_dir), build_dir, ledger,
                                 scope=candidate.sha256)
    module_error = None
    try:
        module = exec_source(candidate, f"specgen_candidate_{candidate.sha256[:12]}",
                             build_dir / "sources")
    except BaseException as exc:  # noqa: BLE001 - the candidate's module may raise anything
        module_error = _error(exc)[:2000]
    else:
        assert session is not None
        discovery.discover(session, candidate, module, request.problem, build_dir / "sources")
    libraries = []
    for record, path in zip(ledger.builds, ledger.libraries):
        if record.ok and path:
            try:
                libraries.append(BuiltLibrary(key=record.key, name=record.name,
                                              data=Path(path).read_bytes()))
            except OSError:
                continue
    return BuildResult(records=ledger.builds, module_error=module_error,
                       seconds=time.monotonic() - began, libraries=libraries)


def _ready(role: str, device: str, started: float) -> RunnerReady:
    import torch

    capability, name, triton_version = "", _cpu_name(), ""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and role != "build":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        major, minor = torch.cuda.get_device_capability(device)
        capability = f"{major}.{minor}"
        name = torch.cuda.get_device_name(device)
        warm = torch.ones(64, 64, device=device)
        (warm @ warm).sum().item()  # creates the cuBLAS handle now, not in the first trial
    return RunnerReady(role=role, pid=os.getpid(), device=device, device_name=name,
                       capability=capability, torch_version=str(torch.__version__),
                       triton_version=str(triton_version), startup_s=time.monotonic() - started)


def serve(role: str, channel: Channel, device: str, started: float, address_space_mb: int,
          gpu_memory_fraction: float = 0.9) -> None:
    """Answer requests until the judge closes the channel (see the module doc)."""
    import torch

    threading.Thread(target=_watch, args=(channel,), daemon=True, name="specgen-judge-watch").start()
    channel.send(_ready(role, device, started))
    if device.startswith("cuda") and role != "build":
        torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction, device)
    if address_space_mb and not device.startswith("cuda"):
        # Without a control group for the tree, a per-process cap (CUDA's reservations rule it
        # out on GPUs, where the allocator's fraction caps device memory).
        limit = _vm_bytes() + address_space_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    handler: Any = ReferenceRole(device) if role == "reference" else CandidateRole(device)
    spin = 0.0
    with torch.no_grad():
        while True:
            try:
                received = channel.recv(spin_s=spin)
            except ChannelClosed:
                break
            if received is None:
                break
            message, fds = received.message, received.fds
            spin = 0.0
            if isinstance(message, Build) and role == "build":
                reply: Any = build(message)
                _flush()
                channel.send(reply)
                break
            sent: tuple[int, ...] = ()
            try:
                reply = _dispatch(role, handler, message, fds)
                if isinstance(reply, tuple):          # a reply that carries the arena's descriptors
                    reply, sent = reply
            except BaseException as exc:  # noqa: BLE001 - one reply per request, whatever happens
                reply = Called(index=-1, error=f"the {role} runner failed: {_error(exc)}")
            if isinstance(message, (Hand, Wake, Call, Look, Read)):
                # The next request of a timing comes at once: wait for it without sleeping, so
                # that waking up is not in a window (a call's window spans a request to each
                # runner). The spin yields its core to any other runnable process.
                spin = _SPIN_S
            if isinstance(message, MapArena):
                fds = []          # handed to (and closed by) the handler
            for fd in fds:
                os.close(fd)
            _flush()
            try:
                channel.send(reply, fds=sent)
            except ChannelClosed:
                break
    _flush()
    os._exit(0)


def _dispatch(role: str, handler: Any, message: Any, fds: list[int]) -> Any:
    """The handler's reply to one request: a reply, or (a reply, the descriptors it carries).
    MapArena takes the descriptors sent with it."""
    loaded = handler.problem is not None
    if isinstance(message, Wake):
        return Awake()
    if isinstance(message, LoadProblem) and role == "reference":
        return handler.load(message)
    if isinstance(message, LoadProblem) and role == "candidate":
        return handler.load_problem(message)
    if isinstance(message, LoadCandidate) and role == "candidate":
        return handler.load(message)
    if isinstance(message, MakeArena) and role == "reference" and loaded:
        return handler.make_arena(message)
    if isinstance(message, MapArena) and role == "candidate":
        return handler.map_arena(message, fds)
    if isinstance(message, Hand) and role == "reference" and loaded:
        return handler.hand(message)
    if isinstance(message, Call):
        if not loaded:
            return Called(index=message.index, error=f"the {role} runner has nothing loaded")
        return handler.call(message)
    if isinstance(message, Look) and role == "reference" and loaded:
        return handler.look(message)
    if isinstance(message, Read) and role == "reference" and loaded:
        return handler.read(message)
    if isinstance(message, SetParams) and loaded:
        return handler.set_params(message)
    return Called(index=-1, error=f"a {role} runner takes no {type(message).__name__} now")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
