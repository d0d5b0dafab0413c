"""What the scheduler reports about itself (`specgen status`, tests, benchmarks): its pools, its
workers, its counts."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from specgen.messages.kv import KvPoolView

# The two pools a worker can be in: validation or profiling (runtime/priority.py's POOLS).
Pool = Literal["validate", "profile"]

# How the scheduler splits its workers between the pools: moved with the load, or a fixed split.
PoolMode = Literal["elastic", "static"]


class WorkerStat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One worker as the scheduler sees it."""

    name: str                               # e.g. "node-a/cpu0"
    node: str = ""                          # the specgen-node that runs it
    device: str = "cpu"                     # "cpu" | "cuda:N"
    pool: Pool = "validate"
    busy_stage: str = ""                    # stage of the request it runs, "" when idle
    busy_for_s: float = 0.0                 # how long the current request has run
    completed: int = 0                      # requests it finished
    pending_pool: Literal["", Pool] = ""    # pool it moves to when its current request ends
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
    pool_mode: PoolMode
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
