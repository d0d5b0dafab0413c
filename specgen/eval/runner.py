"""A runner: a process forked from the template (eval/template.py) that serves one role.

* **reference**: executes the problem's module only (never a candidate's), builds `Model`, and
  for the judge runs trials (timed reference calls, calls of nothing for the overhead, digests
  of calls for the candidate's timed trials) and compares a candidate's shipped output with its
  accurate value (eval/compare.py). It lives as long as its worker keeps evaluating candidates of
  its problem: what it holds is that problem's reference.
* **candidate**: executes the problem's module (and builds its `Model`: the judge times the
  reference here before any candidate code is loaded), then the candidate's, builds `ModelNew`,
  and runs trials as it is told, replying with digests; it copies an output into the shared
  buffer when the judge asks. It serves one candidate, then its tree is killed. Nothing it replies is
  believed beyond what the judge checks against the reference.
* **build**: executes a candidate's module once with `load_inline` compiling for real into its
  private /tmp, and sends back the records and the libraries; then exits.

Every request gets exactly one reply (a staged trial's `TrialStage`s come before it); anything
the candidate does (raise, exit, print) becomes that reply's error, never a crash of the loop. The
loop ends when the judge closes the channel.
"""
from __future__ import annotations

import mmap
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
from specgen.messages import (Build, BuildResult, BuiltLibrary, Compare, Compared, LoadCandidate,
                              LoadProblem, OutputSlot, ParamsSet, ProblemLoaded, RunnerReady,
                              SetParams, Ship, Shipped, Trial, TrialDone, TrialStage)

_SPIN_S = 0.05            # after a trial, wait for the next request without sleeping this long
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
           "uint8", "bool", "complex64", "complex128")


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


def _tensor_dtype(name: str) -> Any:
    import torch

    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not one a shipped output may have")
    return getattr(torch, name)


class SharedBuffer:
    """The judge's memfd, mapped here (outputs travel from the candidate to the reference)."""

    def __init__(self, fd: int) -> None:
        self.size = os.fstat(fd).st_size
        # Mapped with its pages populated in one call rather than faulted in page by page as the
        # copy touches them (a 256 MB copy into a fresh mapping: 45 ms instead of 56 ms, CPU VM).
        self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE) \
            if self.size else None
        os.close(fd)

    def view(self, slot: OutputSlot) -> Any:
        import torch

        if slot.offset < 0 or slot.nbytes < 0 or slot.offset + slot.nbytes > self.size:
            raise ValueError(f"slot {slot.offset}+{slot.nbytes} lies outside the {self.size}-byte buffer")
        dtype = _tensor_dtype(slot.dtype)
        numel = 1
        for dim in slot.shape:
            numel *= dim
        if numel * torch.empty((), dtype=dtype).element_size() != slot.nbytes:
            raise ValueError(f"slot of {slot.nbytes} bytes does not hold {slot.shape} {slot.dtype}")
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=dtype)
        raw = torch.frombuffer(self.map, dtype=torch.uint8, count=slot.nbytes, offset=slot.offset)
        return raw.view(dtype).reshape(slot.shape)

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass          # a tensor still views it; it goes with the process


class ReferenceRole:
    """See the module doc. `model` is the problem as written; `accurate` its accurate value."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.problem: Any = None
        self.model: Any = None
        self.accurate: Any = None
        self.compiled: Any = None
        self.params: Any = None
        self.null_like: list[Any] = []

    def load(self, request: LoadProblem) -> ProblemLoaded:
        import torch

        from specgen.eval import params as param_tools
        from specgen.eval.calls import ProblemModule
        from specgen.eval.compare import AccurateModel

        try:
            self.problem = ProblemModule(request, self.device, work_root() / "job")
        except BaseException as exc:  # noqa: BLE001 - the problem's module may raise anything
            return ProblemLoaded(error=f"problem {request.problem_name} failed to load: {_error(exc)}")
        try:
            self.model = self.problem.build(self.problem.module.Model)
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"problem {request.problem_name}: Model(*get_init_inputs()) "
                                       f"raised {_error(exc)}")
        self.accurate = AccurateModel(self.model)
        described = param_tools.describe(self.model)
        if described:
            self.params = param_tools.ParamState(list(self.model.parameters()), described)
        try:
            inputs = self.problem.inputs(request.init_seed + 1, {})
        except BaseException as exc:  # noqa: BLE001
            return ProblemLoaded(error=f"problem {request.problem_name}: get_inputs() raised "
                                       f"{_error(exc)}")
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()) \
            if isinstance(self.model, torch.nn.Module) else 0
        return ProblemLoaded(
            params=described, input_bytes=sum(x.numel() * x.element_size() for x in tensors),
            param_bytes=param_bytes,
            half=any(x.dtype in (torch.float16, torch.bfloat16) for x in tensors),
            flops=self.problem.flops(), shape_constants=self.problem.shape_constants())

    def _call(self, compiled: bool) -> Any:
        if not compiled:
            return self.model
        if self.compiled is None:
            import torch
            self.compiled = torch.compile(self.model)
        return self.compiled

    def trial(self, trial: Trial, mark: Any = None) -> TrialDone:
        from specgen.eval.calls import run_trial
        from specgen.eval.compare import tol_norm

        if trial.refill_seed is not None:      # the reference computes what the refill leaves
            trial = Trial(index=trial.index, seed=trial.refill_seed, digest_seed=trial.digest_seed,
                          shape=trial.shape, bounds=trial.bounds, compiled=trial.compiled)
        try:
            done = run_trial(self.problem, None if trial.null else self._call(trial.compiled),
                             trial, self.null_like, mark)
        except BaseException as exc:  # noqa: BLE001
            return TrialDone(index=trial.index, error=f"problem {self.problem.name}: Model raised "
                                                      f"{_error(exc)}")
        reply = TrialDone(index=trial.index, digests=done.digests, outputs=done.metas,
                          input_digests=done.input_digests)
        if not trial.null:
            self.null_like = _null_like(self.null_like, done.leaves)
        if trial.bounds:
            reply.tol_norms = [tol_norm(leaf, None, None) for leaf in done.leaves
                               if _is_tensor(leaf)]
        return reply

    def compare(self, request: Compare, fds: list[int]) -> Compared:
        import torch

        from specgen.eval.calls import flatten, input_digests, output_digests, output_meta
        from specgen.eval.compare import compare_outputs

        buffer = SharedBuffer(fds[0]) if fds else None
        trial = request.trial
        seed = trial.refill_seed if trial.refill_seed is not None else trial.seed
        try:
            try:
                cand = [buffer.view(s).to(self.device) if buffer is not None else None
                        for s in request.slots]
                cand = [c.clone() if c is not None and self.device == "cpu" else c for c in cand]
            except (ValueError, RuntimeError) as exc:
                return Compared(reason=f"the candidate's shipped output is unreadable: {exc}")
            finally:
                if buffer is not None:
                    buffer.close()
            try:
                inputs = self.problem.inputs(seed, trial.shape)
                kept = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                pristine = input_digests(kept, trial.digest_seed, self.device)
                ref = flatten(self.model(*inputs))
                after = input_digests(inputs, trial.digest_seed, self.device)
                del inputs
                ref_digests = output_digests(ref, trial.digest_seed, self.device)
                accurate = self.accurate.outputs(kept)
                del kept
            except BaseException as exc:  # noqa: BLE001
                return Compared(problem_error=f"problem {self.problem.name}: Model raised "
                                              f"{_error(exc)}")
            tensors = [leaf for leaf in ref if _is_tensor(leaf)]
            if len(cand) != len(tensors):
                return Compared(reason=f"returned {len(cand)} output tensors, the reference "
                                       f"returns {len(tensors)}", digests=ref_digests,
                                outputs=output_meta(ref))
            # The candidate's numbers (not tensors) are checked by the judge from its reply.
            acc_tensors = [a for a, leaf in zip(accurate, ref) if _is_tensor(leaf)]
            result = compare_outputs(cand, tensors, acc_tensors, request.atol, request.rtol)
            return Compared(ok=result.ok, reason=result.reason, max_abs=result.max_abs,
                            max_rel=result.max_rel, digests=ref_digests,
                            tol_norms=result.tol_norms, ref_error_norms=result.ref_error_norms,
                            accurate=self.accurate.how, outputs=output_meta(ref),
                            half_ok=result.half_ok, input_digests=after,
                            pristine_digests=pristine)
        finally:
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()

    def set_params(self, request: SetParams) -> ParamsSet:
        if self.params is None:
            return ParamsSet()
        self.params.load(request.seed)
        self.accurate.invalidate()
        self.compiled = None
        return ParamsSet()


def _null_like(held: list[Any], leaves: list[Any]) -> list[Any]:
    """What a call of nothing digests: tensors shaped like the last call's outputs (`held`,
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
        self.last: Any = None
        self.last_index = -1
        self.params: Any = None
        self.loaded_problem: LoadProblem | None = None
        self.reference_model: Any = None
        self.null_like: list[Any] = []

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

    def trial(self, trial: Trial, mark: Any = None) -> TrialDone:
        from specgen.eval.calls import run_trial

        if trial.reference or trial.null:
            return self._reference_trial(trial, mark)
        launches, errors = self.ledger.launches, len(self.ledger.errors)
        self.last, self.last_index = None, -1
        try:
            done = run_trial(self.problem, self.model, trial, mark=mark)
        except BaseException as exc:  # noqa: BLE001 - a candidate may raise anything
            return TrialDone(index=trial.index, error=f"ModelNew raised: {_error(exc)}"
                             + self._build_errors(),
                             launches=self.ledger.launches - launches,
                             kernel_errors=self.ledger.errors[errors:errors + 3])
        self.last, self.last_index = done, trial.index
        return TrialDone(index=trial.index, digests=done.digests, outputs=done.metas,
                         input_digests=done.input_digests,
                         launches=self.ledger.launches - launches,
                         kernel_errors=self.ledger.errors[errors:errors + 3])

    def _reference_trial(self, trial: Trial, mark: Any) -> TrialDone:
        """The problem's Model (Trial.reference), or a call of nothing shaped like its last
        outputs (Trial.null), as a trial here."""
        from specgen.eval.calls import run_trial

        try:
            if self.reference_model is None and not trial.null:
                self.reference_model = self.problem.build(self.problem.module.Model)
            done = run_trial(self.problem, None if trial.null else self.reference_model, trial,
                             self.null_like, mark)
        except BaseException as exc:  # noqa: BLE001 - the candidate's process may break anything
            return TrialDone(index=trial.index, error=f"Model raised: {_error(exc)}")
        if not trial.null:
            self.null_like = _null_like(self.null_like, done.leaves)
        return TrialDone(index=trial.index, digests=done.digests, outputs=done.metas)

    def ship(self, request: Ship, fds: list[int]) -> Shipped:
        import torch

        if not fds:
            return Shipped(index=request.index, error="no shared buffer came with the request")
        buffer = SharedBuffer(fds[0])
        try:
            if self.last is None or self.last_index != request.index:
                return Shipped(index=request.index, error="no output of that trial is kept")
            slots, offset = [], 0
            for leaf in self.last.leaves:
                if not isinstance(leaf, torch.Tensor):
                    continue
                nbytes = leaf.numel() * leaf.element_size()
                slot = OutputSlot(offset=offset, nbytes=nbytes, shape=list(leaf.shape),
                                  dtype=str(leaf.dtype).replace("torch.", ""))
                if offset + nbytes > buffer.size:
                    return Shipped(index=request.index, error="the outputs do not fit the buffer")
                if nbytes:
                    buffer.view(slot).copy_(leaf.detach().reshape(slot.shape))
                slots.append(slot)
                offset += (nbytes + 63) // 64 * 64
            return Shipped(index=request.index, slots=slots)
        except BaseException as exc:  # noqa: BLE001
            return Shipped(index=request.index, error=f"copying the output failed: {_error(exc)}")
        finally:
            buffer.close()

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
    from specgen.eval import extensions
    from specgen.eval.extensions import KernelLedger
    from specgen.eval.loader import candidate_from_text, exec_source

    began = time.monotonic()
    ledger = KernelLedger()
    build_dir = work_root() / "build"
    candidate = candidate_from_text(request.candidate_source)
    extensions.install("build", Path(request.cache_dir), build_dir, ledger, scope=candidate.sha256)
    module_error = None
    try:
        exec_source(candidate, f"specgen_candidate_{candidate.sha256[:12]}", build_dir / "sources")
    except BaseException as exc:  # noqa: BLE001 - the candidate's module may raise anything
        module_error = _error(exc)[:2000]
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
            try:
                reply = _dispatch(role, handler, message, fds, channel)
            except BaseException as exc:  # noqa: BLE001 - one reply per request, whatever happens
                reply = TrialDone(index=-1, error=f"the {role} runner failed: {_error(exc)}")
            if isinstance(message, Trial) and message.staged:
                # The next timed call comes at once (the judge times one runner at a time): wait
                # for it without sleeping, so that waking up is not in its first window.
                spin = _SPIN_S
            if isinstance(message, (Ship, Compare)):
                fds = []          # handed to (and closed by) the handler
            for fd in fds:
                os.close(fd)
            _flush()
            try:
                channel.send(reply)
            except ChannelClosed:
                break
    _flush()
    os._exit(0)


def _dispatch(role: str, handler: Any, message: Any, fds: list[int], channel: Channel) -> Any:
    """The handler's reply to one request (Ship and Compare take the fds sent with them; a staged
    trial tells the judge its stages on `channel` as it goes)."""
    loaded = handler.problem is not None
    if isinstance(message, LoadProblem) and role == "reference":
        return handler.load(message)
    if isinstance(message, LoadProblem) and role == "candidate":
        return handler.load_problem(message)
    if isinstance(message, LoadCandidate) and role == "candidate":
        return handler.load(message)
    if isinstance(message, Trial):
        if not loaded:
            return TrialDone(index=message.index, error=f"the {role} runner has nothing loaded")
        index = message.index

        def mark(stage: str) -> None:
            channel.send(TrialStage(index=index, stage=stage))

        return handler.trial(message, mark if message.staged else None)
    if isinstance(message, Ship) and role == "candidate":
        return handler.ship(message, fds)
    if isinstance(message, Compare) and role == "reference" and loaded:
        return handler.compare(message, fds)
    if isinstance(message, SetParams) and loaded:
        return handler.set_params(message)
    return TrialDone(index=-1, error=f"a {role} runner takes no {type(message).__name__} now")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
