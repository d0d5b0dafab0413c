"""Every message that crosses a process boundary in specgen, and nothing else.

Typed msgspec structs encoded as msgpack. Decoding is strict: a frame that does not match its
declared type is rejected with a clear error, never half-read. Nothing here is pickled.

One module per family: the evaluation (`evaluation`: the verdict every part of the system
reports), the evaluation runners (`runners`: a worker and its runner subprocesses, over a socket
pair), the optimize loop (`optimize`), the actor runtime (`frames`: the framing every ZeroMQ
message shares; `jobs`, `stats`, `actors`: the scheduler's jobs, its report, the frames between
actors), KV pools (`kv`). Callers import every name from here.
"""
from specgen.messages.frames import PROTOCOL_VERSION, _Wire
from specgen.messages.evaluation import (
    STAGES, VERDICT_CODES, CandidateOrigin, CandidateSubmission, CandidateUpdate, SandboxKind, Stage,
    Verdict, VerdictCode,
)
from specgen.messages.runners import (
    TIMING_METHOD, ArenaMade, ArenaMapped, Arg, Awake, Build, BuildRecord, BuildResult, BuiltLibrary, Call,
    Called, EvalOptions, ForkRunner, Hand, Handed, LoadCandidate, LoadProblem, Look, Looked, MakeArena,
    MapArena, OutputKind, OutputMeta, ParamInfo, ParamsSet, ProblemLoaded, Proceed, Read, ReadDone,
    RefTiming, RunnerExited, RunnerReady, RunnerReply, RunnerRequest, RunnerRole, RunnerStarted,
    SandboxMode, SetParams, Slot, Wake,
)
from specgen.messages.optimize import (
    CandidateRecord, CandidateStatus, ForkOutcome, ForkRecord, IterationRecord, JobMetrics, JobProgress,
    OptimizeEvent, OptimizeMode, OptimizeResult, OptimizeSpec, OptimizeStatus, ReasoningRecord,
    TriggerSettings,
)
from specgen.messages.jobs import JobEvent, JobOutcome, JobResult, JobRunState, JobSpec, JobStatus
from specgen.messages.stats import Pool, PoolMode, PoolStat, SchedulerStats, WorkerStat
from specgen.messages.kv import KvPoolResize, KvPoolStats, KvPoolView
from specgen.messages.actors import (
    MESSAGE_TYPES, Ack, AssignWork, CancelJob, CancelWork, CandidateUpdateNotice, CreateJob, DeadNotice,
    ErrorReply, EvaluateQueued, EvaluateReply, EvaluateRequest, GetJob, GetStats, Goodbye, Heartbeat,
    HeartbeatAck, Hello, JobCreated, JobEventNotice, JobStatusReply, Ping, Pong, ReportJobEvent,
    PeerRole, ReportJobResult, ResyncUpdates, StatsReply, SubmitAck, SubmitCandidate, SubscribeJob,
    Welcome, WorkDone, WorkerExited, WorkerReady,
)
