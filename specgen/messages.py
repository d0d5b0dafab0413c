"""Every message that crosses a process boundary in specgen, and nothing else.

Typed msgspec structs encoded as msgpack. Decoding is strict: a frame that does not match its
declared type is rejected with a clear error, never half-read. Nothing here is pickled.

Sections: evaluation (the verdict every part of the system reports), the evaluation runners (a
worker and its runner subprocesses, over a socket pair), the optimize loop, the actor runtime, KV pools.
"""
from __future__ import annotations

import msgspec

# Bumped on any incompatible change to a struct below; peers refuse a different version.
PROTOCOL_VERSION = 2


# --------------------------------------------------------------------------- evaluation

# Why a verdict could not judge the candidate on its outputs (`Verdict.code`): the candidate's run
# was cancelled, ran past its time, or never started for the named side's reason. Code reads these,
# never the words of `error`, which are for people.
VERDICT_CODES = ("cancelled", "timeout", "reference", "problem", "candidate_source", "build",
                 "refused", "no_runner")


class Verdict(msgspec.Struct, kw_only=True, gc=False):
    """What evaluating one candidate against one problem found.

    `stage` says how far evaluation went: "validate" (compile + correctness + cheat guards),
    "profile" (timing of a candidate that validated), or "full" (both, one after the other).
    A rejected or failing candidate is still a Verdict: `error` and/or `flags` say why.
    """

    stage: str = "full"                     # "validate" | "profile" | "full"
    compiled: bool = False                  # source loaded and its kernels built
    correct: bool = False                   # every correctness trial matched, no guard rejected it
    max_abs_error: float | None = None      # largest |candidate - reference| over all trials
    max_rel_error: float | None = None      # largest error relative to the reference's magnitude
    ref_ms: float | None = None             # median time of the reference Model
    candidate_ms: float | None = None       # median time of ModelNew
    speedup: float | None = None            # ref_ms / candidate_ms
    ref_compiled_ms: float | None = None    # median time of torch.compile(Model), when asked for
    spread: float | None = None             # (p75 - p25) / median of candidate timings
    device: str = "cpu"                     # "cpu" or "cuda:N" where it ran
    cpu_timing: bool = True                 # timings are CPU timings: they say nothing about GPUs
    flags: list[str] = []                   # cheat-guard reasons; empty when clean
    error: str | None = None                # why it failed to load/compile/run, else None
    code: str = ""                          # why it could not be judged on its outputs, as a code
                                            # (VERDICT_CODES); "" when it was (right or wrong)
    stage_seconds: dict[str, float] = {}    # wall time per stage: compile, correctness, timing, ...
    ref_cached: bool = False                # ref_ms came from the per-problem reference-timing cache
    floor_ms: float | None = None           # physical floor of the problem on this device, when known
    overhead_ms: float | None = None        # per-call overhead the judge subtracted from both times
    notes: list[str] = []                   # checks skipped and why (e.g. no second shape possible)
    sandbox: str = "none"                   # how the run was isolated: "namespaces" | "none"


class CandidateSubmission(msgspec.Struct, kw_only=True, gc=False):
    """A candidate kernel sent for evaluation (by the optimize loop, a client, or a test)."""

    job_id: str                             # the job it belongs to ("" for a one-off request)
    candidate_id: str                       # unique within the job
    problem_name: str                       # for logs and caches
    problem_source: str                     # KernelBench-format reference program
    candidate_source: str                   # the ModelNew program
    origin: str = "final"                   # "fork" | "final" | "inline" (code block in reasoning)
    iteration: int = 0                      # optimize-loop iteration that produced it
    extracted_at: float = 0.0               # wall clock (time.time()) when it was extracted
    deadline: float | None = None           # wall clock after which the job no longer wants it
    profile: bool = True                    # go on to profiling once it validates


class CandidateUpdate(msgspec.Struct, kw_only=True, gc=False):
    """One stage of a candidate's evaluation finished (validate, then profile)."""

    job_id: str
    candidate_id: str
    stage: str                              # "validate" | "profile" | "full"
    verdict: Verdict
    worker: str = ""                        # which worker ran it, e.g. "node-a/gpu1"
    started_at: float = 0.0                 # wall clock
    finished_at: float = 0.0                # wall clock
    cancelled: bool = False                 # the job stopped wanting it before it ran


# --------------------------------------------------------------------------- evaluation runners
# Frames between an evaluation worker (the judge, specgen/eval/judge.py) and the processes it forks
# from its template (specgen/eval/template.py): a reference runner, candidate runners, build
# runners. They never leave the host: length-limited packets over a SOCK_SEQPACKET socket pair
# (specgen/eval/protocol.py). Requests form one tagged union, replies another; decoding is strict.
# Nothing a runner replies is believed beyond what the judge checks: see docs/evaluation.md.

# Bumped whenever the way a call is timed changes (part of the reference-timing cache key).
TIMING_METHOD = "j2"


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
    overhead_trials: int = 15               # at least this many calls of nothing (one follows each timed call)
    checked_timed_trials: int = 2           # timed calls whose whole output is also compared
    ref_beside_trials: int = 15             # reference calls timed between the candidate's (0: none)
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
    overhead_ms: float = 0.0                # the overhead subtracted (calls of nothing, same path)
    resolution_ms: float = 0.0              # the overhead's spread then: no finer time was resolved


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
    null: bool = False                      # make the inputs and the digest, call nothing
    compiled: bool = False                  # reference only: call torch.compile(Model)
    bounds: bool = False                    # reference only: also the norm of the tolerance


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
    reference_mutates: bool = False         # its call changed its inputs (then so may the candidate's)


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


RunnerReply = (RunnerReady | ProblemLoaded | TrialDone | Shipped | Compared | ParamsSet
               | BuildResult | RunnerStarted | RunnerExited)


# --------------------------------------------------------------------------- optimize
# A job of the optimize loop (specgen/optimize/loop.py): its specification, the events it emits while
# it runs, and its result with full history. The runtime's JobSpec/JobEvent/JobResult (below) wrap
# them: a scheduler job's `options` hold an OptimizeSpec's fields, its events' and result's `data`
# and `summary` hold these as builtins (specgen/optimize/job.py converts both ways).

class TriggerSettings(msgspec.Struct, kw_only=True):
    """Where a job may fork and which gates may veto a fork (specgen/optimize/triggers.py)."""

    every_n_tokens: int = 0                 # fork each time the reasoning passes a multiple; 0 = off
    structure_boundaries: bool = True       # paragraph breaks, headings, numbered steps
    cues: list[str] | None = None           # decision cues ("let me write", "wait"); None = defaults
    min_gap_tokens: int = 320               # no fork closer than this to the previous one (or the start)
    max_forks_per_iteration: int = 10
    max_forks_in_flight: int = 2            # 0 = no limit
    queue_saturation: float = 2.0           # load-aware: skip when a queue holds this many per worker
    barren_forks: int = 2                   # load-aware: this many forks in a row gave nothing new...
    barren_backoff_tokens: int = 768        # ...then wait this many reasoning tokens before the next


class OptimizeSpec(msgspec.Struct, kw_only=True):
    """One optimize job: a problem, a mode, budgets, and the speculation switches."""

    job_id: str
    problem_name: str
    problem_source: str                     # KernelBench-format reference program
    mode: str = "specgen"                   # "specgen" | "sequential" | "best-of-n" | "pipeline"
    time_budget_s: float | None = None      # wall time for the whole job; None = no limit
    token_budget: int | None = None         # reasoning + fork tokens for the whole job; None = no limit
    max_iterations: int = 4
    target_speedup: float | None = None     # a correct kernel this fast ends the job; None = no target
    improvement_margin: float | None = 0.1  # beating the iteration's baseline by this ends an iteration
    reasoning_max_tokens: int = 32768
    fork_max_tokens: int = 4096
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    best_of_n: int = 4                      # reasoning streams per iteration in "best-of-n"
    verdict_timeout_s: float = 900.0        # longest wait for one candidate's verdict
    # After the last iteration, also wait for speculative (fork, inline) candidates still owed a
    # verdict instead of cancelling them: they may hold a better kernel, at the cost of their queue.
    drain_speculative: bool = False
    # Speculation mechanisms, used in "specgen" mode; each can be switched off alone (ablations).
    forking: bool = True                    # fork non-reasoning generations at trigger points
    early_termination: bool = True          # abort generation as soon as the criterion is met
    inline_candidates: bool = True          # code blocks finished inside the reasoning are candidates
    load_aware: bool = True                 # skip forks while evaluation queues are saturated
    elastic_pools: bool = True              # a runtime setting: the scheduler moves GPUs between pools
    triggers: TriggerSettings = msgspec.field(default_factory=TriggerSettings)


class JobProgress(msgspec.Struct, kw_only=True):
    """A snapshot of a running job, carried by every event (the progress display reads it)."""

    elapsed_s: float = 0.0
    iteration: int = 0
    reasoning_tokens: int = 0               # all iterations
    fork_tokens: int = 0
    forks: int = 0                          # forks started
    forks_running: int = 0
    candidates: int = 0                     # distinct candidates submitted
    validating: int = 0                     # submitted, no validation verdict yet
    profiling: int = 0                      # validated, no profiling verdict yet
    profiled: int = 0
    best_speedup: float | None = None


class OptimizeEvent(msgspec.Struct, kw_only=True):
    """Something happened in a job. `kind` says what; the fields that apply are set."""

    job_id: str
    kind: str                               # job_started | iteration_started | reasoning_finished |
                                            # fork_started | fork_skipped | fork_finished | candidate |
                                            # duplicate | update | termination | iteration_finished |
                                            # job_finished | error
    t: float                                # wall clock (time.time())
    iteration: int = 0
    request_id: str = ""                    # reasoning or fork request it concerns
    candidate_id: str = ""
    origin: str = ""                        # candidate origin: "fork" | "final" | "inline"
    position: int | None = None             # reasoning tokens at that moment
    reason: str = ""                        # trigger, veto, termination or finish reason
    update: CandidateUpdate | None = None   # for kind "update"
    progress: JobProgress | None = None


class ForkRecord(msgspec.Struct, kw_only=True):
    """One fork taken by a job."""

    request_id: str
    iteration: int
    position: int                           # reasoning tokens it was forked from
    trigger: str                            # which trigger fired, and what it saw
    started_at: float
    finished_at: float | None = None
    tokens: int = 0                         # tokens it generated
    prompt_tokens: int | None = None        # as the engine saw the prompt
    cached_tokens: int | None = None        # prompt tokens served from the prefix cache
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error"
    outcome: str = "running"                # "candidate" | "duplicate" | "no_code" | "aborted" | "error"
    candidate_id: str = ""


class CandidateRecord(msgspec.Struct, kw_only=True):
    """One candidate program a job found, and what its evaluation said."""

    candidate_id: str
    iteration: int
    origin: str                             # "fork" | "final" | "inline"
    request_id: str                         # the generation it came from
    position: int                           # reasoning tokens when it was found
    fingerprint: str                        # hash of the normalized source (dedup key)
    source: str
    extracted_at: float
    duplicate_of: str | None = None         # set when an equivalent program came first: not evaluated
    status: str = "pending"                 # pending | failed | incorrect | correct | cancelled |
                                            # duplicate | lost
    validation: CandidateUpdate | None = None
    profile: CandidateUpdate | None = None  # also set for a single "full" update
    feedback_at: float | None = None        # when its final verdict arrived

    @property
    def speedup(self) -> float | None:
        final = self.profile or self.validation
        if final is None or not final.verdict.correct:
            return None
        return final.verdict.speedup


class ReasoningRecord(msgspec.Struct, kw_only=True):
    """One reasoning stream (an iteration has one, or n in best-of-n)."""

    request_id: str
    iteration: int
    started_at: float
    finished_at: float | None = None
    tokens: int = 0
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error"


class IterationRecord(msgspec.Struct, kw_only=True):
    index: int
    started_at: float
    finished_at: float | None = None
    request_ids: list[str] = []             # its reasoning streams (several in best-of-n)
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_finished_at: float | None = None
    finish_reason: str | None = None        # the reasoning's: "stop" | "length" | "abort" | "error"
    stop_reason: str = ""                   # why the iteration ended
    baseline_speedup: float = 1.0           # best correct speedup when it began (1.0: none yet)
    prompt: str = ""                        # the user message it was given (with feedback)


class JobMetrics(msgspec.Struct, kw_only=True):
    end_to_end_s: float = 0.0
    time_to_best_s: float | None = None     # job start -> the best kernel's profiling verdict
    reasoning_tokens: int = 0
    fork_tokens: int = 0
    total_tokens: int = 0
    iterations: int = 0
    forks: int = 0
    forks_skipped: int = 0                  # trigger points vetoed by a gate
    fork_cached_tokens: int = 0             # prompt tokens forks got from the prefix cache
    fork_prompt_tokens: int = 0
    candidates: int = 0                     # distinct candidates submitted
    duplicates: int = 0                     # found again, not re-evaluated
    validated: int = 0                      # validation verdicts received
    profiled: int = 0                       # profiling verdicts received (profiling feedback)
    correct: int = 0
    cancelled: int = 0
    validation_busy_s: float = 0.0          # summed over workers
    profiling_busy_s: float = 0.0
    workers: int = 0                        # evaluation workers seen by the job
    pool_utilization: float | None = None   # busy time / (workers x end-to-end time)
    validation_feedback_s: list[float] = [] # extracted -> validation verdict, per candidate
    profiling_feedback_s: list[float] = []  # extracted -> profiling verdict, per candidate
    feedback_p50_s: float | None = None     # of profiling feedback latency
    feedback_p95_s: float | None = None


class OptimizeResult(msgspec.Struct, kw_only=True):
    """What a job found, how, and at what cost."""

    job_id: str
    problem_name: str
    mode: str
    status: str                             # "target_reached" | "iterations_done" | "time_budget" |
                                            # "token_budget" | "cancelled" | "failed"
    stop_reason: str = ""
    engine: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    best_candidate_id: str | None = None
    best_speedup: float | None = None
    best_source: str | None = None
    best_verdict: Verdict | None = None
    cpu_timing: bool = True                 # the best kernel's timing is a CPU timing
    spec: OptimizeSpec | None = None
    iterations: list[IterationRecord] = []
    reasoning: list[ReasoningRecord] = []
    forks: list[ForkRecord] = []
    candidates: list[CandidateRecord] = []
    metrics: JobMetrics = msgspec.field(default_factory=JobMetrics)
    error: str | None = None
    kv_pool: KvPoolStats | None = None      # the job's remote KV pool at its end (None: no pool)


# --------------------------------------------------------------------------- actor runtime
#
# One frame per message: a 4-byte header (b"SG", the protocol version, the message kind: the
# `KIND` of a struct below), then that struct as msgpack. A ROUTER prepends the peer's routing id. `specgen.wire` encodes and checks frames; `MESSAGE_TYPES` maps kinds
# to structs. Requests carry a `call_id` that their reply echoes; fire-and-forget messages do not.

from typing import Any, ClassVar  # noqa: E402  (kept beside the section that needs them)


class _Wire(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    KIND: ClassVar[int] = 0


class JobSpec(msgspec.Struct, kw_only=True):
    """A job: a problem to optimize, budgets, and the code that runs its optimize loop."""

    job_id: str = ""                        # empty: the scheduler assigns one
    problem_name: str = ""                  # for logs and caches
    problem_source: str = ""                # KernelBench-format reference program
    entry: str = ""                         # "module:function" run by the job's reasoner; "" = default
    wall_time_s: float | None = None        # stop the job after this long (the scheduler enforces it)
    max_tokens: int | None = None           # token budget, enforced by the optimize loop
    max_iterations: int | None = None       # iteration budget, enforced by the optimize loop
    options: dict[str, Any] = {}            # entry-specific settings (msgpack builtins only)
    created_at: float = 0.0                 # wall clock, set by the scheduler
    deadline: float | None = None           # created_at + wall_time_s, set by the scheduler


class JobEvent(msgspec.Struct, kw_only=True):
    """One step of a job's progress (iteration started, candidate verdict, best so far, ...)."""

    job_id: str
    seq: int = 0                            # 1, 2, ... per job, assigned by the scheduler
    kind: str                               # e.g. "started", "candidate", "best", "log", "finished"
    t: float = 0.0                          # wall clock when it happened
    data: dict[str, Any] = {}               # kind-specific details (msgpack builtins only)


class JobResult(msgspec.Struct, kw_only=True):
    """How a job ended."""

    job_id: str
    status: str                             # "succeeded" | "failed" | "cancelled" | "timed_out"
    best_candidate_id: str | None = None    # best correct candidate, if any
    best_verdict: Verdict | None = None     # its verdict
    summary: dict[str, Any] = {}            # entry-specific totals (iterations, tokens, ...)
    error: str | None = None                # why it failed, else None
    finished_at: float = 0.0                # wall clock


class JobStatus(msgspec.Struct, kw_only=True):
    """A job as the scheduler sees it now."""

    spec: JobSpec
    state: str                              # "running" | "finished"
    attempts: int = 0                       # reasoner starts (more than 1 after a scheduler restart)
    candidates: int = 0                     # candidates accepted for the job
    updates: int = 0                        # stage verdicts recorded for the job
    last_event_seq: int = 0                 # seq of its latest JobEvent
    result: JobResult | None = None         # set once finished


class WorkerStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One worker as the scheduler sees it."""

    name: str                               # e.g. "node-a/cpu0"
    node: str = ""                          # the specgen-node that runs it
    device: str = "cpu"                     # "cpu" | "cuda:N"
    pool: str = "validate"                  # "validate" | "profile"
    busy_stage: str = ""                    # stage of the request it runs, "" when idle
    busy_for_s: float = 0.0                 # how long the current request has run
    completed: int = 0                      # requests it finished
    pending_pool: str = ""                  # pool it moves to when its current request ends
    busy_candidate: str = ""                # "job_id/candidate_id" of the request it runs; left empty
                                            # for another client's request unless the asker is the admin
    pid: int = 0                            # its process id on its node's host
    host: str = ""                          # host name of the machine it runs on (pairs it with KV pools)
    sandbox: str = ""                       # how its candidates run (Hello.sandbox)


class PoolStat(msgspec.Struct, kw_only=True):
    """Load figures for one pool ("validate" or "profile")."""

    workers: int = 0                        # workers assigned to the pool now
    queued: int = 0                         # requests waiting
    running: int = 0                        # requests running (on any pool's worker)
    arrival_rate: float = 0.0               # requests/s over the measuring window
    service_s: float = 0.0                  # smoothed service time of one request
    offered_load: float = 0.0               # workers needed: arrival_rate * service_s + backlog
    utilization: float = 0.0                # busy share of the pool's worker-time since start


class SchedulerStats(msgspec.Struct, kw_only=True):
    """Everything observable about the scheduler, for `specgen status`, tests and benchmarks.

    The cluster's admin (runtime/ownership.py) sees all of it; any other client sees the counts and
    the workers, but job and candidate ids (`jobs`, `WorkerStat.busy_candidate`) of its own jobs
    only, and no worker's error text (it can quote another client's candidate)."""

    scheduler_id: str
    uptime_s: float
    pool_mode: str                          # "elastic" | "static"
    priority_rule: list[str]                # criteria, most significant first
    validate: PoolStat
    profile: PoolStat
    workers: list[WorkerStat] = []
    nodes: list[str] = []
    node_health: dict[str, Any] = {}        # node name -> its workers' states, pids, restarts, errors
    jobs_running: int = 0
    jobs_by_state: dict[str, int] = {}      # "running", and jobs finished since the scheduler started
                                            # by how they ended ("succeeded", "failed", ...)
    requests_done: int = 0                  # stage requests finished (each key counted once)
    requests_requeued: int = 0              # re-queued after a worker or node was lost
    requests_dropped: int = 0               # dropped: job ended, deadline passed, or cancelled
    duplicates_ignored: int = 0             # results for a key that already had one (or whose job ended)
    results_refused: int = 0                # results from a worker that did not hold the request
    hellos_refused: int = 0                 # worker/node/reasoner registrations without a valid credential
    reassignments: int = 0                  # pool changes of workers
    feedback_latency_p50_s: float | None = None   # candidate extracted -> profiling verdict
    feedback_latency_p95_s: float | None = None
    busy_while_waiting: float | None = None # busy worker share, over time when requests waited
    waiting_s: float = 0.0                  # that time: seconds with a request queued
    kv_control_endpoint: str = ""           # where KV pools connect their control channel ("" = off)
    kv_pools: list[KvPoolView] = []         # remote KV pools reporting to the scheduler
    jobs: list[str] = []                    # ids of the running jobs the asker may see (all: the admin)
    restricted: bool = False                # True: other clients' jobs and candidates are left out
    requests_not_owner: int = 0             # job requests refused because the sender did not own the job


class Hello(_Wire):
    """First message of every peer to the scheduler (also sent again after a scheduler restart)."""

    KIND: ClassVar[int] = 1
    role: str                               # "client" | "worker" | "node" | "reasoner"
    name: str                               # unique per role, e.g. "node-a/cpu0" or a job id
    protocol_version: int = PROTOCOL_VERSION
    node: str = ""                          # worker: the node that runs it
    device: str = ""                        # worker: "cpu" | "cuda:N"
    pid: int = 0
    busy_request_id: str = ""               # worker: the request it is running now (after restarts)
    busy_key: list[str] = []                # worker: (job_id, candidate_id, stage) of that request
    host: str = ""                          # worker: host name (pairs it with KV pools on its device)
    credential: str = ""                    # worker, node, reasoner: proof of cluster membership, an
                                            # HMAC of role and name under the join secret (runtime/auth.py);
                                            # client: empty, or the admin's (role "admin"), see Welcome.admin
    client_token: str = ""                  # client: a random secret (32+ chars) naming it across
                                            # reconnections; without CURVE, the owner of its jobs
    held_results: list[str] = []            # worker: request ids of results it keeps until acknowledged
    sandbox: str = ""                       # worker: how its candidates run, "namespaces" | "none"
                                            # ("none: <why>" when no sandbox could be made); "" untold


class Welcome(_Wire):
    """The scheduler's answer to Hello."""

    KIND: ClassVar[int] = 2
    scheduler_id: str                       # changes when the scheduler restarts
    heartbeat_interval_s: float
    peer_timeout_s: float
    max_message_bytes: int
    admin: bool = False                     # client: its Hello carried a valid admin credential


class Heartbeat(_Wire):
    KIND: ClassVar[int] = 3
    sent_at: float = 0.0                    # wall clock
    busy_request_id: str = ""               # worker: the request it is running now
    health: dict[str, Any] = {}             # node: worker names -> state, restarts, ...


class HeartbeatAck(_Wire):
    KIND: ClassVar[int] = 4
    scheduler_id: str                       # a peer that sees a new id says Hello again
    acked: list[int] = []                   # worker: call_ids of results committed since (see WorkDone)


class ErrorReply(_Wire):
    """A message was refused. `ref` is the refused request's call_id when it could be read."""

    KIND: ClassVar[int] = 5
    code: str                               # "malformed" | "unknown_kind" | "version" | "too_large" |
                                            # "not_owner" (another client's job) | ...
    message: str                            # says what was wrong and what to fix
    ref: int = 0


class Goodbye(_Wire):
    """A peer is leaving on purpose; the scheduler re-queues its request at once."""

    KIND: ClassVar[int] = 6
    reason: str = ""
    busy_request_id: str = ""


class DeadNotice(_Wire):
    """An actor hit a fatal error and is exiting (to its supervisor and the scheduler)."""

    KIND: ClassVar[int] = 7
    name: str
    reason: str


class WorkerReady(_Wire):
    """Worker -> its node: the worker is up (evaluation service started)."""

    KIND: ClassVar[int] = 8
    name: str
    pid: int


class Ack(_Wire):
    """Generic success reply to a request that returns nothing else."""

    KIND: ClassVar[int] = 9
    call_id: int
    count: int = 0                          # request-specific (e.g. requests dropped by a cancel)


class SubmitCandidate(_Wire):
    """Queue a candidate for validation (then profiling); updates go to the sender. Taken only from
    the job's owner, its reasoner or the admin (the first submitter owns a job id new to the
    scheduler); anyone else gets ErrorReply "not_owner"."""

    KIND: ClassVar[int] = 10
    call_id: int
    submission: CandidateSubmission


class SubmitAck(_Wire):
    KIND: ClassVar[int] = 11
    call_id: int
    accepted: bool = True
    duplicate: bool = False                 # already known: nothing queued twice
    reason: str = ""                        # why it was not accepted


class CandidateUpdateNotice(_Wire):
    """Scheduler -> submitter: one stage of a candidate finished (or it was dropped)."""

    KIND: ClassVar[int] = 12
    update: CandidateUpdate


class EvaluateRequest(_Wire):
    """Evaluate one candidate, outside any job; answered by EvaluateReply, and meanwhile by
    EvaluateQueued notices when `progress_interval_s` asks for them."""

    KIND: ClassVar[int] = 13
    call_id: int
    submission: CandidateSubmission
    stage: str = "full"                     # "validate" | "profile" | "full"
    progress_interval_s: float = 0.0        # want an EvaluateQueued when queued, then this often until
                                            # the reply (0: none); the client's is call_timeout_s / 4


class EvaluateReply(_Wire):
    KIND: ClassVar[int] = 14
    call_id: int
    update: CandidateUpdate


class EvaluateQueued(_Wire):
    """Scheduler -> caller: its EvaluateRequest is alive, still waiting or running (sent when it is
    queued, then every `progress_interval_s` it asked for); the caller keeps waiting for the reply."""

    KIND: ClassVar[int] = 34
    call_id: int                            # the EvaluateRequest's
    position: int = 0                       # place in its pool's queue, 1 = next (0 while running)
    queued: int = 0                         # requests waiting in that pool, every caller's
    running: bool = False                   # a worker is evaluating it now


class CancelJob(_Wire):
    """Drop the job's queued work, stop its running work and its reasoner; answered by Ack.
    Owner, reasoner or admin only (else ErrorReply "not_owner")."""

    KIND: ClassVar[int] = 15
    call_id: int
    job_id: str


class CreateJob(_Wire):
    """Start a job (its reasoner runs the optimize loop); answered by JobCreated. The sender owns
    the job; an id already taken by another client is refused ("not_owner")."""

    KIND: ClassVar[int] = 16
    call_id: int
    spec: JobSpec


class JobCreated(_Wire):
    KIND: ClassVar[int] = 17
    call_id: int
    job_id: str


class SubscribeJob(_Wire):
    """Send me the job's events after `after_seq` (from the journal), then new ones; Ack.
    Owner, reasoner or admin only (else ErrorReply "not_owner")."""

    KIND: ClassVar[int] = 18
    call_id: int
    job_id: str
    after_seq: int = 0


class JobEventNotice(_Wire):
    KIND: ClassVar[int] = 19
    event: JobEvent


class GetJob(_Wire):
    """Ask for a job's spec and state; answered by JobStatusReply. Owner, reasoner or admin only."""

    KIND: ClassVar[int] = 20
    call_id: int
    job_id: str


class JobStatusReply(_Wire):
    KIND: ClassVar[int] = 21
    call_id: int
    status: JobStatus


class ReportJobEvent(_Wire):
    """Reasoner -> scheduler: progress of its job (journaled, forwarded to subscribers)."""

    KIND: ClassVar[int] = 22
    event: JobEvent


class ReportJobResult(_Wire):
    """Reasoner -> scheduler: its job ended; answered by Ack once journaled."""

    KIND: ClassVar[int] = 23
    call_id: int
    result: JobResult


class ResyncUpdates(_Wire):
    """After a scheduler restart: send me again every recorded update of these jobs; Ack. Every
    job must be the sender's (else ErrorReply "not_owner", and nothing is sent)."""

    KIND: ClassVar[int] = 24
    call_id: int
    job_ids: list[str]


class GetStats(_Wire):
    KIND: ClassVar[int] = 25
    call_id: int


class StatsReply(_Wire):
    KIND: ClassVar[int] = 26
    call_id: int
    stats: SchedulerStats


class Ping(_Wire):
    """Answered by Pong at once (connectivity checks and wire benchmarks)."""

    KIND: ClassVar[int] = 27
    call_id: int
    payload: bytes = b""


class Pong(_Wire):
    KIND: ClassVar[int] = 28
    call_id: int
    payload: bytes = b""


class AssignWork(_Wire):
    """Scheduler -> worker: run one stage of one candidate."""

    KIND: ClassVar[int] = 30
    request_id: str                         # unique per attempt
    stage: str                              # "validate" | "profile" | "full"
    submission: CandidateSubmission
    acked: list[int] = []                   # call_ids of this worker's results committed since (see WorkDone)


class WorkDone(_Wire):
    """Worker -> scheduler: the stage finished (the verdict may say the candidate failed)."""

    KIND: ClassVar[int] = 31
    request_id: str
    update: CandidateUpdate
    call_id: int = 0                        # acked in the next AssignWork or HeartbeatAck (no message of
                                            # its own); the worker re-sends unacked results after a restart


class CancelWork(_Wire):
    """Scheduler -> worker: stop this request (its candidate's job no longer wants it)."""

    KIND: ClassVar[int] = 32
    request_id: str


class WorkerExited(_Wire):
    """Node -> scheduler: a worker process ended (the node restarts it)."""

    KIND: ClassVar[int] = 33
    name: str
    exit_code: int
    reason: str = ""


# --------------------------------------------------------------------------- KV pool
# KvPoolStats and KvPoolResize are the frames of a KV pool's control channel (specgen.kv.pool_control,
# framed by specgen.wire like the actors' messages); KvPoolStats is also embedded in what a job
# or the scheduler reports.

class KvPoolStats(_Wire):
    """Size and effectiveness of one remote KV pool (specgen.kv.pool), for the scheduler."""

    KIND: ClassVar[int] = 35

    pool_id: str = ""                       # which pool (e.g. the engine's id)
    capacity_bytes: int = 0                 # pool memory held now, all devices
    used_bytes: int = 0                     # memory holding blocks (slots in use * slot size)
    slot_bytes: int = 0                     # one block's slot
    capacity_blocks: int = 0                # slots the pool can hold now
    used_blocks: int = 0                    # blocks held (complete or being stored)
    pinned_blocks: int = 0                  # blocks with a copy in flight (cannot be evicted)
    segments: int = 0                       # memory segments held
    bytes_by_device: dict[int, int] = {}    # pool memory per CUDA device; -1 is host memory
    hits: int = 0                           # looked-up blocks found complete
    misses: int = 0                         # looked-up blocks not found
    hit_rate: float = 0.0                   # hits / (hits + misses); 0 before any lookup
    stores: int = 0                         # blocks stored
    loads: int = 0                          # blocks loaded back
    evictions: int = 0                      # blocks dropped (LRU, to make room or to shrink)
    moves: int = 0                          # blocks relocated out of a shrinking segment
    shrinks: int = 0                        # segments given back
    grows: int = 0                          # segments added
    host: str = ""                          # host name of the pool's process (socket.gethostname())
    devices: list[int] = []                 # devices the pool's memory lives on (-1 host memory), even
                                            # when shrunk to nothing; host-wide GPU indices


class KvPoolResize(_Wire):
    """Scheduler/node -> a KV pool: change its size (a profiler needs memory, or has finished with it).

    The pool answers every resize with its KvPoolStats once the change is done (a shrink waits for
    copies in flight on the segments it gives back)."""

    KIND: ClassVar[int] = 36

    target_bytes: int | None = None         # new pool size; None only asks for stats
    request_id: str = ""                    # echoed in the log; lets the sender match the reply


class KvPoolView(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One remote KV pool as the scheduler sees it (SchedulerStats.kv_pools)."""

    pool: str                               # the pool's control-channel identity
    stats: KvPoolStats                      # its latest report
    reported_s_ago: float = 0.0             # age of that report
    paired_workers: list[str] = []          # workers on the same host and device(s)
    busy_devices: int = 0                   # paired devices running evaluations now
    restore_bytes: int | None = None        # size to grow back to while shrunk for evaluations
    target_bytes: int | None = None         # size last asked for (None: never resized)
    shrinks_requested: int = 0              # shrink requests the scheduler sent
    grows_requested: int = 0                # grow-back requests the scheduler sent


# One kind space for every channel: a frame that reaches the wrong channel still decodes, and is
# refused for its type rather than read as something else.
MESSAGE_TYPES: dict[int, type[_Wire]] = {
    cls.KIND: cls
    for cls in (
        Hello, Welcome, Heartbeat, HeartbeatAck, ErrorReply, Goodbye, DeadNotice, WorkerReady, Ack,
        SubmitCandidate, SubmitAck, CandidateUpdateNotice, EvaluateRequest, EvaluateReply,
        CancelJob, CreateJob, JobCreated, SubscribeJob, JobEventNotice, GetJob, JobStatusReply,
        ReportJobEvent, ReportJobResult, ResyncUpdates, GetStats, StatsReply, Ping, Pong,
        AssignWork, WorkDone, CancelWork, WorkerExited, EvaluateQueued, KvPoolStats, KvPoolResize,
    )
}
