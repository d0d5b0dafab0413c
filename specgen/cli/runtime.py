"""`specgen serve`, `specgen keys`, `specgen status`: the runtime's subcommands."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec

from specgen.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    from specgen.runtime.scheduler import add_arguments

    serve = subparsers.add_parser("serve", help="run the scheduler (jobs, queues, elastic pools)")
    add_arguments(serve)
    serve.set_defaults(func=_serve)

    keys = subparsers.add_parser("keys", help="make CURVE keys for non-loopback scheduler addresses")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    gen = keys_sub.add_parser("generate", help="write a server keypair and client keypair(s) to DIR")
    gen.add_argument("dir", type=Path)
    gen.add_argument("--clients", type=int, default=1, help="client keypairs to make (default 1)")
    gen.set_defaults(func=_keys_generate)

    status = subparsers.add_parser("status", help="print a scheduler's queues, pools and workers")
    status.add_argument("--scheduler", default="tcp://127.0.0.1:5555")
    status.add_argument("--keys", type=Path, default=None)
    status.add_argument("--join-secret", type=Path, default=None, metavar="FILE",
                        help="the cluster's join secret, to see every job as its admin (default "
                             "$SPECGEN_JOIN_SECRET_FILE, else STATE_DIR/join_secret of a scheduler with "
                             "the default state directory on this host, when it can be read); without "
                             "it, only this client's jobs show")
    status.add_argument("--json", action="store_true", help="print the raw SchedulerStats as JSON")
    status.set_defaults(func=_status)


def _serve(args: argparse.Namespace) -> int:
    import logging

    from specgen.runtime.scheduler import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(args)


def _keys_generate(args: argparse.Namespace) -> int:
    from specgen.runtime.auth import generate

    if args.clients < 1:
        raise UsageError("--clients must be at least 1")
    files = generate(args.dir, args.clients)
    for path in files:
        print(path)
    print(f"scheduler: specgen serve --bind tcp://0.0.0.0:5555 --keys {args.dir}")
    print(f"nodes and clients: copy {args.dir}/server.key and a client*.key_secret to their hosts "
          f"and pass --keys DIR")
    print("a client's jobs are its key's: give clients that must not act for each other's jobs a "
          "key each (--clients N)")
    print("nodes also need the scheduler's join secret (STATE_DIR/join_secret, made by its first "
          "start): copy it to their hosts (mode 0600) and pass --join-secret FILE")
    return 0


def _admin_secret(given: Path | None) -> tuple[bytes | None, bool]:
    """The join secret `specgen status` presents, and whether it was asked for by name (a file
    given, or $SPECGEN_JOIN_SECRET_FILE): the default file is used only when it can be read."""
    import os

    from specgen.runtime.auth import DEFAULT_STATE_DIR, JOIN_SECRET_ENV, JOIN_SECRET_FILE, load_join_secret

    path = given or (Path(os.environ[JOIN_SECRET_ENV]) if os.environ.get(JOIN_SECRET_ENV) else None)
    if path is not None:
        return load_join_secret(path), True
    default = DEFAULT_STATE_DIR / JOIN_SECRET_FILE
    try:
        return (load_join_secret(default), False) if default.exists() else (None, False)
    except UsageError:
        return None, False   # another user's scheduler, say: this client then sees its own jobs


def _status(args: argparse.Namespace) -> int:
    import sys

    from specgen.runtime.client import Client
    from specgen.runtime.transport import AuthenticationFailed

    secret, named = _admin_secret(args.join_secret)
    try:
        client = Client(args.scheduler, keys=args.keys, join_secret=secret)
    except AuthenticationFailed:
        if secret is None or named:
            raise
        # This host's default scheduler state is not that scheduler's: ask as a plain client.
        client = Client(args.scheduler, keys=args.keys)
    with client:
        stats = client.stats()
    if args.json:
        print(json.dumps(msgspec.to_builtins(stats), indent=1))
        return 0
    jobs = "  ".join(f"{state} {n}" for state, n in sorted(stats.jobs_by_state.items())) or "none"
    print(f"scheduler {stats.scheduler_id}  up {stats.uptime_s:.0f} s  pools {stats.pool_mode}  "
          f"priority {','.join(stats.priority_rule)}  jobs: {jobs}")
    if stats.restricted:
        print("  (another client's jobs and candidates are not shown: pass --join-secret FILE, the "
              "scheduler's join secret, to see them as the cluster's admin)", file=sys.stderr)
    if stats.jobs:
        print(f"  running jobs {' '.join(stats.jobs)}")
    for name, pool in (("validate", stats.validate), ("profile", stats.profile)):
        print(f"  {name:8s} workers {pool.workers}  queued {pool.queued}  running {pool.running}  "
              f"rate {pool.arrival_rate:.2f}/s  service {pool.service_s:.2f} s  "
              f"utilization {pool.utilization:.0%}  busy workers "
              f"{sum(1 for w in stats.workers if w.pool == name and w.busy_stage)}")
    for w in stats.workers:
        state = f"busy ({w.busy_stage}, {w.busy_for_s:.1f} s)" if w.busy_stage else "idle"
        print(f"  {w.name:24s} {w.device:8s} {w.pool:8s} {state}  done {w.completed}"
              + (f"  sandbox {w.sandbox}" if w.sandbox else ""))
    for node, workers in stats.node_health.items():
        for name, health in workers.items():
            if health.get("state") != "ready":
                print(f"  {name:24s} {health.get('state')}  restarts {health.get('restarts', 0)}  "
                      f"{health.get('error', '')}"[:200])
    print(f"  requests done {stats.requests_done}  requeued {stats.requests_requeued}  "
          f"dropped {stats.requests_dropped}  duplicates {stats.duplicates_ignored}  "
          f"refused results {stats.results_refused}  refused registrations {stats.hellos_refused}  "
          f"refused as not the job's owner {stats.requests_not_owner}")
    if stats.busy_while_waiting is not None:
        print(f"  busy while requests waited {stats.busy_while_waiting:.0%}")
    if stats.feedback_latency_p50_s is not None:
        print(f"  feedback latency p50 {stats.feedback_latency_p50_s:.2f} s  p95 {stats.feedback_latency_p95_s:.2f} s")
    if stats.kv_control_endpoint:
        print(f"  KV pools {len(stats.kv_pools)}  control {stats.kv_control_endpoint}")
    for view in stats.kv_pools:
        kv = view.stats
        devices = ",".join("host" if d == -1 else f"cuda:{d}" for d in kv.devices) or "?"
        state = (f"shrunk for {view.busy_devices} busy device(s), grows back to {_size(view.restore_bytes)}"
                 if view.restore_bytes is not None else "full size")
        print(f"  kv {view.pool:22s} {kv.host or '?'}/{devices}  {_size(kv.capacity_bytes)}  "
              f"blocks {kv.used_blocks}/{kv.capacity_blocks}  used {_size(kv.used_bytes)}  "
              f"hits {kv.hits}  misses {kv.misses}  hit rate {kv.hit_rate:.0%}  "
              f"evictions {kv.evictions}  {state}  "
              f"resizes asked -{view.shrinks_requested}/+{view.grows_requested}  "
              f"paired {','.join(view.paired_workers) or 'none'}")
    return 0


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"
