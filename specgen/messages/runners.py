"""Frames between an evaluation worker (the judge, specgen/eval/judge.py) and the processes it forks
from its template (specgen/eval/template.py): a reference runner, candidate runners, build runners.

They never leave the host: length-limited packets over a SOCK_SEQPACKET socket pair
(specgen/eval/protocol.py). Requests form one tagged union (`RunnerRequest`), replies another
(`RunnerReply`); decoding is strict. Nothing a runner replies is believed beyond what the judge
checks: see docs/evaluation.md. `EvalOptions`, which every runner is started with, lives here too.
"""
from __future__ import annotations

import msgspec

# Bumped whenever the way a call is timed changes (part of the reference-timing cache key).
TIMING_METHOD = "j5"


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
    sandbox: str = "required"               # "required": refuse candidates where no sandbox can be
    #                                         made; "optional": run them unsandboxed there (labelled
    #                                         sandbox "none"); "off": never sandbox (trusted code only)
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
                f"-c{int(self.compile_baseline)}")


class RefTiming(msgspec.Struct, kw_only=True):
    """A reference timing, cached per problem source, device and timing settings."""

    ref_ms: float                           # median time of the reference Model, overhead subtracted
    ref_spread: float                       # (p75 - p25) / median of its timings
    ref_compiled_ms: float | None = None    # the same for torch.compile(Model), when asked for
    samples: int = 0                        # timed calls the median is taken over
    overhead_ms: float = 0.0                # the call window of a call of nothing (its median)
    resolution_ms: float = 0.0              # no finer time resolved (eval/timing.py: Windows)
    made_ms: float = 0.0                    # median windows of its timed calls: making the inputs,
    digest_ms: float = 0.0                  # and the digest; the most a call's own are subtracted


class ParamInfo(msgspec.Struct, kw_only=True, array_like=True):
    """One parameter of a model, in `named_parameters()` order."""

    name: str
    shape: list[int]
    numel: int


class OutputMeta(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=True):
    """One leaf of a call's output (tensors and numbers, nested tuples/lists flattened)."""

    kind: str                               # "tensor" | "number" | "other"
    shape: list[int] = []                   # tensor: its shape
    dtype: str = ""                         # tensor: e.g. "float32"
    nbytes: int = 0                         # tensor: bytes of its data when contiguous
    plain: bool = True                      # tensor: exactly torch.Tensor, no subclass
    value: float | None = None              # number: its value
    text: str = ""                          # other: type name


class OutputSlot(msgspec.Struct, kw_only=True, array_like=True):
    """Where one output tensor lies in the shared output buffer after a Ship."""

    offset: int                             # byte offset in the buffer
    nbytes: int
    shape: list[int]
    dtype: str


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


class Trial(msgspec.Struct, kw_only=True, tag="trial", omit_defaults=True):
    """One call: make the inputs from `seed`, call the model, reply with the output's digest.

    The digest of each output tensor is sum(output * W) in float64, W drawn from `digest_seed`
    after the call: it ties the reply to the output the call left, read as the reply is sent."""

    index: int                              # echoed in the reply
    seed: int                               # the inputs: get_inputs() after seeding with it
    digest_seed: int                        # the random weights of the digest
    shape: dict[str, int] = {}              # problem module constants changed for this call
    refill_seed: int | None = None          # call once on `seed`, copy the inputs of this seed into
    #                                         the same tensors, call again: the digest is the second's
    null: bool = False                      # make the inputs and the digest, call nothing (in a
    #                                         candidate's runner: shaped like the reference's outputs)
    compiled: bool = False                  # reference only: call torch.compile(Model)
    reference: bool = False                 # candidate only: call the problem's Model (timed in
    #                                         the candidate's process: before its code is loaded,
    #                                         and between its calls, where it only ever lowers)
    bounds: bool = False                    # reference only: also the norm of the tolerance
    staged: bool = False                    # timed: a TrialStage once the inputs are made and once
    #                                         the call returned, the device synchronized before each


class Ship(msgspec.Struct, kw_only=True, tag="ship"):
    """Copy the last trial's output tensors into the shared buffer (sent with its fd)."""

    index: int                              # the trial whose output (must be the last one)


class Compare(msgspec.Struct, kw_only=True, tag="compare"):
    """Reference only: compute `trial` accurately and compare a candidate's shipped output with it
    (the shared buffer is sent with its fd)."""

    trial: Trial                            # the same trial the candidate ran
    slots: list[OutputSlot]                 # where the candidate's output tensors lie
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


class ForkRunner(msgspec.Struct, kw_only=True, tag="fork"):
    """To the template: fork a runner; sent with two fds: its channel's end and its log file."""

    role: str                               # "reference" | "candidate" | "build"
    scratch_mb: int                         # size of its private /tmp
    max_processes: int                      # RLIMIT_NPROC of its tree
    address_space_mb: int = 0               # RLIMIT_AS per process (where no cgroup limits the tree)
    gpu_memory_fraction: float = 0.9        # share of the GPU's memory it may allocate


class Proceed(msgspec.Struct, kw_only=True, tag="proceed"):
    """To a runner's init, once the judge put it in its control group: start the runner."""


RunnerRequest = (LoadProblem | LoadCandidate | Trial | Ship | Compare | SetParams | Build
                 | ForkRunner | Proceed)


# -- replies (runner -> judge)

class RunnerReady(msgspec.Struct, kw_only=True, tag="ready"):
    """First reply of every runner: imports done, device context live."""

    role: str                               # "reference" | "candidate" | "build" | "template"
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
    param_bytes: int = 0                    # bytes of the model's parameters
    half: bool = False                      # inputs are float16/bfloat16
    flops: int | None = None                # the problem's get_flops(), when it has one
    shape_constants: dict[str, int] = {}    # module ints read only by get_inputs (second shape)
    builds: list["BuildRecord"] = []        # candidate: its load_inline calls
    kernel_kinds: list[str] = []            # candidate: custom kernels its source claims


class TrialDone(msgspec.Struct, kw_only=True, tag="trial_done", omit_defaults=True):
    index: int
    error: str | None = None                # the call (or making its inputs) raised
    digests: list[float] = []               # one per output tensor, in output order
    outputs: list[OutputMeta] = []
    tol_norms: list[float] = []             # bounds: sqrt(sum((atol + rtol |r|)^2)) per tensor
    input_digests: list[float] = []         # the input tensors' digests after the call
    launches: int = 0                       # candidate: custom-kernel launches during the call
    kernel_errors: list[str] = []           # candidate: errors its kernels raised during the call


class TrialStage(msgspec.Struct, kw_only=True, tag="trial_stage"):
    """Where a timed trial (Trial.staged) has got to. Only its kernel receive stamp is used: it
    ends the window of making the inputs ("made") or of the call ("called")."""

    index: int
    stage: str                              # "made" or "called"


class Shipped(msgspec.Struct, kw_only=True, tag="shipped"):
    index: int
    error: str | None = None
    slots: list[OutputSlot] = []


class Compared(msgspec.Struct, kw_only=True, tag="compared", omit_defaults=True):
    """What the reference found comparing a shipped output with its accurate value."""

    ok: bool = False
    reason: str | None = None               # why not: the element exceeding its tolerance most
    problem_error: str | None = None        # the reference itself raised on this trial
    max_abs: float = 0.0                    # largest |candidate - accurate| over the outputs
    max_rel: float = 0.0                    # that, relative to the accurate value's magnitude
    digests: list[float] = []               # the reference's digests of this trial
    tol_norms: list[float] = []             # as TrialDone.tol_norms
    ref_error_norms: list[float] = []       # sqrt(sum((r - accurate)^2)): the reference's own error
    accurate: str = ""                      # how the accurate value was computed
    outputs: list[OutputMeta] = []          # the reference's outputs
    half_ok: bool = False                   # the candidate passes at float16's tolerance
    input_digests: list[float] = []         # the reference's input tensors' digests after its call
    pristine_digests: list[float] = []      # and before it (the judge decides whether it mutates)


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
    libraries: list[BuiltLibrary] = []      # what compiled, for the worker to publish


class RunnerStarted(msgspec.Struct, kw_only=True, tag="started"):
    """A runner's init, first thing after the fork: the kernel tells the judge its pid."""


class RunnerExited(msgspec.Struct, kw_only=True, tag="exited"):
    """A runner's init, after the runner ended (the last message on the channel)."""

    status: int                             # its exit code, or 128 + the signal that killed it


RunnerReply = (RunnerReady | ProblemLoaded | TrialDone | TrialStage | Shipped | Compared | ParamsSet
               | BuildResult | RunnerStarted | RunnerExited)
