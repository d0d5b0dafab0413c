"""Frames between an evaluation worker (the judge, specgen/eval/judge.py) and the processes it forks
from its template (specgen/eval/template.py): a reference runner, candidate runners, build runners.

They never leave the host: length-limited packets over a SOCK_SEQPACKET socket pair
(specgen/eval/protocol.py). Requests form one tagged union (`RunnerRequest`), replies another
(`RunnerReply`); decoding is strict. Nothing a runner replies is believed beyond what the judge
checks: see docs/evaluation.md. `EvalOptions`, which every runner is started with, lives here too.
"""
from __future__ import annotations

from typing import Literal

import msgspec

# Bumped whenever the way a call is timed changes (part of the reference-timing cache key).
TIMING_METHOD = "j6"

# What a worker does where no sandbox can be made (`EvalOptions.sandbox`): "required" refuses
# candidates there; "optional" runs them unsandboxed (labelled sandbox "none"); "off" never
# sandboxes (trusted code only).
SandboxMode = Literal["required", "optional", "off"]

# What a runner forked from the template serves; the template itself says "template" when ready.
RunnerRole = Literal["reference", "candidate", "build"]

# One leaf of a call's output, as a runner describes it (`OutputMeta.kind`).
OutputKind = Literal["tensor", "number", "other"]


class EvalOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How to validate and profile a candidate. Defaults follow KernelBench where it is sound."""

    # --- correctness
    trials: int = 5                         # correctness trials, each with fresh inputs, compared in full
    seed: int | None = None                 # base of every trial seed; None draws fresh ones per evaluation
    atol: float | None = None               # override the per-dtype absolute tolerance
    rtol: float | None = None               # override the per-dtype relative tolerance
    second_shape: bool = True               # a trial on other input shapes when the problem allows it
    randomized_params: bool = True          # a trial with random parameters loaded into both models

    # --- profiling
    warmup: int = 3                         # timed calls whose times are not used
    timing_trials: int = 50                 # timed calls after the warm-up, each on fresh inputs
    overhead_trials: int = 15               # at least this many calls of nothing (one follows each of the reference's timed calls)
    checked_timed_trials: int = 2           # timed calls whose whole output is also compared
    timing_budget_s: float = 2.0            # timed calls stop once a model's have taken this long
    min_timing_trials: int = 10             # and at least this many were made (the budget's floor)
    ref_beside_trials: int = 15             # reference calls timed in the candidate's runner, before its
    #                                         code is loaded and again between its calls (0: none;
    #                                         the reference runner's own timing is used instead)
    compile_baseline: bool = False          # also time torch.compile(Model) as a second baseline
    cache_ref_timing: bool = True           # reuse the reference's timing per problem/device/settings
    floor_check: bool = True                # flag times below the memory-bandwidth/compute floor
    peak_bandwidth_gbs: float | None = None  # override the device's peak memory bandwidth (GB/s)
    peak_tflops: float | None = None        # override the device's peak rate for the problem's dtype

    # --- limits
    timeout_s: float = 300.0                # wall clock for one candidate's evaluation
    build_timeout_s: float = 900.0          # wall clock for one candidate's extension build
    spawn_timeout_s: float = 120.0          # a runner must be ready within this
    memory_limit_mb: int = 8192             # host memory a run's process tree may add after start-up
    build_memory_mb: int = 16384            # host memory a build's process tree may use
    gpu_memory_fraction: float = 0.9        # share of the GPU's memory a runner may allocate

    # --- isolation (eval/sandbox.py, eval/containment.py)
    sandbox: SandboxMode = "required"       # where no sandbox can be made: refuse, run unsandboxed
    #                                         (labelled sandbox "none"), or never sandbox (SandboxMode)
    scratch_mb: int = 1024                  # size of a run's private /tmp
    build_scratch_mb: int = 4096            # size of a build's private /tmp (its only writable place)
    max_processes: int = 512                # processes and threads a run's tree may have

    # --- where
    cache_dir: str | None = None            # shared build and reference-timing cache; None: work_dir/cache
    problem_scale: str = "auto"             # SPECGEN_PROBLEM_SCALE for the problem: auto = small on CPU

    def resolved_scale(self, device: str) -> str:
        if self.problem_scale != "auto":
            return self.problem_scale
        return "small" if device == "cpu" else "full"

    def timing_key(self) -> str:
        """The settings a reference timing depends on (part of its cache key)."""
        # TIMING_METHOD: a timing taken by an older method is never reused.
        return (f"{TIMING_METHOD}-w{self.warmup}-t{self.timing_trials}-o{self.overhead_trials}"
                f"-b{self.timing_budget_s:g}-m{self.min_timing_trials}-c{int(self.compile_baseline)}")


class RefTiming(msgspec.Struct, kw_only=True):
    """A reference timing, cached per problem source, device and timing settings."""

    ref_ms: float                           # median time of the reference Model, overhead subtracted
    ref_spread: float                       # (p75 - p25) / median of its timings
    ref_compiled_ms: float | None = None    # the same for torch.compile(Model), when asked for
    samples: int = 0                        # timed calls the median is taken over
    overhead_ms: float = 0.0                # the call window of a call of nothing (its median)
    resolution_ms: float = 0.0              # no finer time resolved (eval/timing.py)


class ParamInfo(msgspec.Struct, kw_only=True, array_like=True):
    """One parameter of a model, in `named_parameters()` order."""

    name: str
    shape: list[int]
    numel: int


class OutputMeta(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    """One leaf of a call's output (tensors and numbers, nested tuples/lists flattened)."""

    kind: OutputKind
    shape: list[int] = []                   # tensor: its shape
    dtype: str = ""                         # tensor: e.g. "float32"
    nbytes: int = 0                         # tensor: bytes of its data when contiguous
    plain: bool = True                      # tensor: exactly torch.Tensor, no subclass
    value: float | None = None              # number: its value
    text: str = ""                          # other: type name


class Slot(msgspec.Struct, kw_only=True, array_like=True):
    """One tensor in an arena region (eval/arena.py): contiguous, at `offset` bytes."""

    offset: int
    shape: list[int]
    dtype: str


class Arg(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    """One positional input of a call: a tensor in the arena's inputs, or a plain value."""

    slot: Slot | None = None
    value: bool | int | float | str | None = None


# -- requests (judge -> runner)

class LoadProblem(msgspec.Struct, kw_only=True, tag="load_problem"):
    """Execute the problem's module and build Model(*get_init_inputs()) after `init_seed`."""

    problem_source: str                     # KernelBench-format reference program
    problem_name: str                       # for messages and the module's name
    scale: str                              # SPECGEN_PROBLEM_SCALE while the module executes
    init_seed: int                          # seed both models are built after


class LoadCandidate(msgspec.Struct, kw_only=True, tag="load_candidate"):
    """Also execute the candidate's module and build ModelNew(*get_init_inputs())."""

    problem: LoadProblem                    # the candidate needs the problem's inputs
    candidate_source: str                   # the ModelNew program
    cache_dir: str                          # extension cache (read-only in a sandbox)


class MakeArena(msgspec.Struct, kw_only=True, tag="make_arena"):
    """Reference only: make (or grow to) an arena of at least these sizes; the reply carries its
    two descriptors (inputs, outputs), which the judge hands to the candidate's runner."""

    input_bytes: int
    output_bytes: int


class MapArena(msgspec.Struct, kw_only=True, tag="map_arena"):
    """Candidate only: map the reference runner's arena (sent with its two descriptors)."""

    input_bytes: int                        # the sizes the reference runner made them with
    output_bytes: int


class Hand(msgspec.Struct, kw_only=True, tag="hand"):
    """Reference only: make a call's inputs from `seed` (get_inputs() after seeding, module
    constants `shape` in force), keep them, and copy them into the arena's inputs. A timed call's
    window begins when the judge sends this."""

    index: int
    seed: int
    shape: dict[str, int] = {}
    early: bool = False                     # also compute the reference's output now (an untimed
    #                                         call): its size tells whether the arena holds it


class Wake(msgspec.Struct, kw_only=True, tag="wake"):
    """Sent to the runner that is about to be timed, just before a timed call's window opens: it
    answers and then waits for its call without sleeping, so that waking a blocked process (tens
    to hundreds of microseconds in a virtual machine) is in no window."""


class Call(msgspec.Struct, kw_only=True, tag="call"):
    """Call a model on the arena's inputs and copy its outputs into the arena's outputs, the device
    synchronized before the reply. The reply's arrival ends a timed call's window."""

    index: int
    args: list[Arg]                         # the inputs, as the reference runner laid them out
    null: bool = False                      # call nothing: copy tensors shaped like the last
    #                                         reference call's outputs (a call of nothing)
    reference: bool = False                 # candidate's runner: call the problem's Model
    compiled: bool = False                  # reference runner: call torch.compile(Model)


class Look(msgspec.Struct, kw_only=True, tag="look"):
    """Reference only: read the outputs in the arena as the call left them (their digests, kept for
    the Read that follows). Sent as the call's reply arrives; a timed call's window ends when this
    reply does, so work the call left running is in it."""

    index: int                              # the Hand whose inputs the call ran on
    digest_seed: int                        # drawn by the judge after the call: never sent to the
    #                                         candidate's process
    outputs: list[Slot]                     # where the runner says its output tensors lie


class Read(msgspec.Struct, kw_only=True, tag="read"):
    """Reference only: judge the outputs looked at against this runner's own call on the inputs it
    handed over (see eval/arena.py), reading them again last."""

    index: int
    full: bool = False                      # also compare every element with the accurate value
    atol: float | None = None               # EvalOptions.atol
    rtol: float | None = None               # EvalOptions.rtol
    atol: float | None = None               # EvalOptions.atol
    rtol: float | None = None               # EvalOptions.rtol


class SetParams(msgspec.Struct, kw_only=True, tag="set_params"):
    """Load random parameter values drawn from `seed` (None: put the initial ones back)."""

    seed: int | None
    reference: list[ParamInfo] = []         # candidate only: the reference's parameters to match


class Build(msgspec.Struct, kw_only=True, tag="build"):
    """Build runner: execute the candidate's module once so that its load_inline calls compile."""

    candidate_source: str
    cache_dir: str                          # what is built already (read-only)
    problem: LoadProblem | None = None      # its problem at the run's scale: ModelNew is built and
    #                                         called once on meta tensors, so that extensions built
    #                                         in __init__ or forward are built ahead too


class ForkRunner(msgspec.Struct, kw_only=True, tag="fork"):
    """To the template: fork a runner; sent with two fds: its channel's end and its log file."""

    role: RunnerRole
    scratch_mb: int                         # size of its private /tmp
    max_processes: int                      # RLIMIT_NPROC of its tree
    address_space_mb: int = 0               # RLIMIT_AS per process (where no cgroup limits the tree)
    gpu_memory_fraction: float = 0.9        # share of the GPU's memory it may allocate


class Proceed(msgspec.Struct, kw_only=True, tag="proceed"):
    """To a runner's init, once the judge put it in its control group: start the runner."""


RunnerRequest = (LoadProblem | LoadCandidate | MakeArena | MapArena | Hand | Wake | Call | Look
                 | Read | SetParams | Build | ForkRunner | Proceed)


# -- replies (runner -> judge)

class RunnerReady(msgspec.Struct, kw_only=True, tag="ready"):
    """First reply of every runner: imports done, device context live."""

    role: RunnerRole | Literal["template"]
    pid: int                                # os.getpid() as the runner sees it
    device: str                             # device as the runner sees it ("cpu" or "cuda:0")
    device_name: str                        # e.g. "NVIDIA H200" or the CPU model
    capability: str = ""                    # CUDA compute capability "9.0"; "" on CPU
    torch_version: str = ""                 # torch.__version__ (part of cache keys)
    triton_version: str = ""                # triton.__version__, "" without Triton
    startup_s: float = 0.0                  # fork to ready


class ProblemLoaded(msgspec.Struct, kw_only=True, tag="problem_loaded"):
    error: str | None = None                # why the problem (or the candidate) could not load
    params: list[ParamInfo] = []            # the model's parameters
    input_bytes: int = 0                    # bytes of one call's input tensors
    output_bytes: int = 0                   # bytes of one call's output tensors (reference)
    param_bytes: int = 0                    # bytes of the model's parameters
    half: bool = False                      # inputs are float16/bfloat16
    flops: int | None = None                # the problem's get_flops(), when it has one
    shape_constants: dict[str, int] = {}    # module ints read only by get_inputs (second shape)
    builds: list["BuildRecord"] = []        # candidate: its load_inline calls
    kernel_kinds: list[str] = []            # candidate: custom kernels its source claims


class ArenaMade(msgspec.Struct, kw_only=True, tag="arena_made"):
    """The reference runner's arena (its two descriptors come with this reply)."""

    input_bytes: int = 0
    output_bytes: int = 0
    error: str | None = None


class ArenaMapped(msgspec.Struct, kw_only=True, tag="arena_mapped"):
    error: str | None = None


class Handed(msgspec.Struct, kw_only=True, tag="handed", omit_defaults=True):
    """The inputs are in the arena, laid out as `args` (the judge passes them to the call)."""

    index: int
    args: list[Arg] = []
    input_bytes: int = 0                    # what the inputs need of the arena
    output_bytes: int = 0                   # early: what the reference's outputs need of it
    grown: bool = False                     # the arena was made anew (its descriptors come along)
    arena: list[int] = []                   # grown: its regions' sizes (inputs, outputs) as made
    error: str | None = None                # the problem raised making its inputs (or its call)


class Called(msgspec.Struct, kw_only=True, tag="called", omit_defaults=True):
    """A call is over. What the runner says of its outputs only tells the reference where to read
    them and the judge what to say when they are not there: nothing here is a verdict field."""

    index: int
    error: str | None = None                # the call raised (or its outputs do not fit)
    outputs: list[OutputMeta] = []
    launches: int = 0                       # candidate: custom-kernel launches during the call
    kernel_errors: list[str] = []           # candidate: errors its kernels raised during the call


class Awake(msgspec.Struct, kw_only=True, tag="awake"):
    pass


class Looked(msgspec.Struct, kw_only=True, tag="looked", omit_defaults=True):
    index: int
    error: str | None = None                # the outputs cannot be read where the runner says


class ReadDone(msgspec.Struct, kw_only=True, tag="read_done", omit_defaults=True):
    """The reference runner's judgement of a call's outputs, read from the arena by itself."""

    index: int
    ok: bool = False
    reason: str | None = None               # why not: structure, a digest, the element off the most
    problem_error: str | None = None        # the reference itself raised on these inputs
    outputs: list[OutputMeta] = []          # the reference's outputs
    changed: bool = False                   # the outputs changed while they were read (work after
    #                                         the call returned)
    inputs_changed: bool = False            # the call left the inputs other than the reference's does
    reference_mutates: bool = False         # the problem's Model changes its own inputs
    max_abs: float = 0.0                    # full: largest |candidate - accurate| over the outputs
    max_rel: float = 0.0                    # that, relative to the accurate value's magnitude
    accurate: str = ""                      # full: how the accurate value was computed
    half_ok: bool = False                   # full: the candidate passes at float16's tolerance


class ParamsSet(msgspec.Struct, kw_only=True, tag="params_set"):
    error: str | None = None                # e.g. the candidate's parameters do not line up


class BuildRecord(msgspec.Struct, kw_only=True):
    """One load_inline call of a build (or a run that found it in the cache)."""

    name: str                               # the extension's name as the candidate gave it
    key: str                                # hash of the load_inline arguments
    ok: bool                                # it built (or was found built)
    seconds: float = 0.0                    # compile time
    cached: bool = False                    # found in the cache, nothing compiled
    error: str | None = None                # the compiler's message when it failed
    # Whether its sources hold device code (cuda_sources, a __global__ function): on a GPU, one
    # without can only call library kernels, so its calls are not custom-kernel launches there.
    device_code: bool = True


class BuiltLibrary(msgspec.Struct, kw_only=True):
    """A library a build runner compiled, sent back whole (its scratch vanishes with it)."""

    key: str
    name: str
    data: bytes


class BuildResult(msgspec.Struct, kw_only=True, tag="built"):
    """A build runner's answer (also the per-candidate build marker on disk, without libraries)."""

    records: list[BuildRecord] = []         # one per load_inline call, in call order
    module_error: str | None = None         # the module raised after (or without) its builds
    seconds: float = 0.0                    # wall time of the whole build
    # set by the worker, never taken from a runner: the build runner failed or timed out, so the
    # build did not finish (module_error then says why)
    unfinished: bool = False
    libraries: list[BuiltLibrary] = []      # what compiled, for the worker to publish


class RunnerStarted(msgspec.Struct, kw_only=True, tag="started"):
    """A runner's init, first thing after the fork: the kernel tells the judge its pid."""


class RunnerExited(msgspec.Struct, kw_only=True, tag="exited"):
    """A runner's init, after the runner ended (the last message on the channel)."""

    status: int                             # its exit code, or 128 + the signal that killed it


RunnerReply = (RunnerReady | ProblemLoaded | ArenaMade | ArenaMapped | Handed | Awake | Called
               | Looked | ReadDone | ParamsSet | BuildResult | RunnerStarted | RunnerExited)
