#!/usr/bin/env python3
"""Actor-runtime benchmarks, each measured side by side with plain pyzmq in the same run.

Sections:
  rtt         round trip of a small request. specgen: client -> scheduler -> worker -> scheduler ->
              client (`Client.evaluate` of a candidate a replaying worker answers at once), and
              client -> scheduler -> client (`Client.ping`). Raw pyzmq: the same two shapes with
              minimal code (a ROUTER broker forwarding msgpack frames to a DEALER worker; a ROUTER
              echo), and the broker path again with a Python I/O thread per socket in client, broker
              and worker (the design specgen's actors had before: the price of that design alone).
              The methods take turns in short blocks (--block round trips each), so the machine's
              swings hit all of them alike; besides the pooled medians, the median over blocks of
              specgen's block median / raw's block median is reported.
  throughput  small messages per second through the scheduler with many requests in flight
              (pings; evaluate requests over 2 replaying workers), and the raw broker the same way.
  decision    one scheduling decision (pick the best of 1,000 queued requests for an idle worker
              and hand it out) in the scheduler core, in process.

    .venv/bin/python tools/runtime_bench.py --out out/runtime_bench.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgen.messages import (  # noqa: E402
    AssignWork, CandidateSubmission, CandidateUpdate, EvaluateRequest, Hello, Ping, SubmitCandidate, Verdict,
    WorkDone,
)
from specgen.runtime.journal import Journal  # noqa: E402
from specgen.runtime.local import LocalCluster  # noqa: E402
from specgen.runtime.replay_evaluator import ReplaySample, directive  # noqa: E402
from specgen.runtime.scheduler_core import SchedulerCore  # noqa: E402
from specgen.runtime.settings import RuntimeSettings  # noqa: E402

PROBLEM = "class Model:\n    pass\n"
INSTANT = directive(ReplaySample(validate_s=0.0, correct=False)) + "# benchmark\n"

RAW_ECHO = r"""
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.bind(sys.argv[1])
while True:
    s.send_multipart(s.recv_multipart())
"""

# A minimal broker: workers and clients share one ROUTER; every hop decodes and re-encodes msgpack,
# as specgen's does (without typing, journal, priority queues or heartbeats). Frames move through
# `recv()` and `send(frames)`, defined by what precedes the loop (the socket itself, or an I/O pump).
BROKER_LOOP = r"""
import collections, sys, msgspec
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
idle, waiting = collections.deque(), collections.deque()
while True:
    peer, body = recv()
    msg = dec.decode(body)
    if msg["k"] == "ready":
        idle.append(peer)
    elif msg["k"] == "req":
        waiting.append((peer, msg))
    else:
        idle.append(peer)
        send([msg["to"], enc.encode({"k": "rep", "id": msg["id"], "v": msg["v"]})])
    while idle and waiting:
        client, req = waiting.popleft()
        send([idle.popleft(), enc.encode({"k": "work", "to": client, "id": req["id"], "p": req["p"]})])
"""

RAW_BROKER = r"""
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.bind(sys.argv[1])
recv, send = s.recv_multipart, s.send_multipart
""" + BROKER_LOOP

RAW_WORKER = r"""
import sys, zmq, msgspec
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER); s.connect(sys.argv[1])
s.send(enc.encode({"k": "ready"}))
while True:
    msg = dec.decode(s.recv())
    s.send(enc.encode({"k": "done", "to": msg["to"], "id": msg["id"], "v": {"correct": False}}))
"""

# The same broker and worker built the way specgen's actors are (STYLE.md's vLLM pattern), still in
# bare pyzmq: an I/O thread per socket alone touches it and hands received frames to the actor's
# loop through a queue; the loop hands frames to send back through a deque and an eventfd wake-up.
# Nothing else of specgen (no typing, journal, priorities, heartbeats): this row prices the design.
IO_PUMP = r"""
import collections, os, queue, threading, zmq
class Pump:
    def __init__(self, sock):
        self.sock, self.inbox, self.out = sock, queue.SimpleQueue(), collections.deque()
        self.wake = os.eventfd(0, os.EFD_NONBLOCK)
        threading.Thread(target=self.run, daemon=True).start()
    def send(self, frames):
        self.out.append(frames)
        os.eventfd_write(self.wake, 1)
    def run(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake, zmq.POLLIN)
        while True:
            try:
                events = dict(poller.poll())
            except zmq.ZMQError:   # the context was destroyed: the benchmark is over
                return
            if self.sock in events:
                while True:
                    try:
                        self.inbox.put(self.sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            if self.wake in events:
                try:
                    os.eventfd_read(self.wake)
                except BlockingIOError:
                    pass
                while self.out:
                    self.sock.send_multipart(self.out.popleft())
"""

RAW_BROKER_IO = IO_PUMP + r"""
import sys
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.bind(sys.argv[1])
pump = Pump(s)
recv, send = pump.inbox.get, pump.send
""" + BROKER_LOOP

RAW_WORKER_IO = IO_PUMP + r"""
import sys, msgspec
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER); s.connect(sys.argv[1])
pump = Pump(s)
pump.send([enc.encode({"k": "ready"})])
while True:
    msg = dec.decode(pump.inbox.get()[0])
    pump.send([enc.encode({"k": "done", "to": msg["to"], "id": msg["id"], "v": {"correct": False}})])
"""

ENC, DEC = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
_pump_namespace: dict[str, Any] = {}
exec(IO_PUMP, _pump_namespace)   # the client side's pump, the same code as the subprocesses'
Pump = _pump_namespace["Pump"]
PAYLOAD = {"problem": PROBLEM, "candidate": INSTANT}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RawSetup:
    def __init__(self, workers: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raw-zmq-"))
        self.echo_addr = f"ipc://{self.dir}/echo"
        self.broker_addr = f"ipc://{self.dir}/broker"
        self.broker_io_addr = f"ipc://{self.dir}/broker-io"
        self.procs = [subprocess.Popen([sys.executable, "-c", RAW_ECHO, self.echo_addr]),
                      subprocess.Popen([sys.executable, "-c", RAW_BROKER, self.broker_addr]),
                      subprocess.Popen([sys.executable, "-c", RAW_BROKER_IO, self.broker_io_addr])]
        self.procs += [subprocess.Popen([sys.executable, "-c", RAW_WORKER, self.broker_addr]) for _ in range(workers)]
        self.procs += [subprocess.Popen([sys.executable, "-c", RAW_WORKER_IO, self.broker_io_addr])
                       for _ in range(workers)]
        self.ctx = zmq.Context()
        self.echo = self.ctx.socket(zmq.DEALER)
        self.echo.connect(self.echo_addr)
        self.broker = self.ctx.socket(zmq.DEALER)
        self.broker.connect(self.broker_addr)
        io_sock = self.ctx.socket(zmq.DEALER)
        io_sock.connect(self.broker_io_addr)
        self.broker_io = Pump(io_sock)
        self.ids = 0
        time.sleep(1.0)
        for _ in range(200):            # warm every path
            self.echo_rtt()
            self.broker_rtt()
            self.broker_io_rtt()

    def echo_rtt(self) -> float:
        t = time.perf_counter()
        self.echo.send_multipart([b"SG\x01\x1b", ENC.encode(PAYLOAD)])
        self.echo.recv_multipart()
        return time.perf_counter() - t

    def broker_rtt(self) -> float:
        self.ids += 1
        t = time.perf_counter()
        self.broker.send(ENC.encode({"k": "req", "id": self.ids, "p": PAYLOAD}))
        DEC.decode(self.broker.recv())
        return time.perf_counter() - t

    def broker_io_rtt(self) -> float:
        """The broker path with I/O threads in client, broker and worker (see IO_PUMP)."""
        self.ids += 1
        t = time.perf_counter()
        self.broker_io.send([ENC.encode({"k": "req", "id": self.ids, "p": PAYLOAD})])
        DEC.decode(self.broker_io.inbox.get(timeout=10)[0])
        return time.perf_counter() - t

    def broker_throughput(self, total: int, window: int) -> float:
        sent = done = 0
        t = time.perf_counter()
        while done < total:
            while sent < total and sent - done < window:
                self.ids += 1
                self.broker.send(ENC.encode({"k": "req", "id": self.ids, "p": PAYLOAD}))
                sent += 1
            self.broker.recv()
            done += 1
        return total / (time.perf_counter() - t)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.ctx.destroy(linger=0)


def spec_evaluate_rtt(cluster: LocalCluster) -> float:
    t = time.perf_counter()
    cluster.client.evaluate(PROBLEM, INSTANT, stage="validate")
    return time.perf_counter() - t


def spec_throughput(cluster: LocalCluster, total: int, window: int, make: Callable[[], Any]) -> float:
    conn = cluster.client.conn
    pending: list = []
    sent = 0
    t = time.perf_counter()
    while sent < total or pending:
        while sent < total and len(pending) < window:
            pending.append(conn.call(make()))
            sent += 1
        pending.pop(0).result(60)
    return total / (time.perf_counter() - t)


def bench_rtt_and_throughput(rounds: int, n: int, block: int, total: int, window: int) -> dict[str, Any]:
    raw = RawSetup(workers=2)
    results: dict[str, list[float]] = {"raw_echo": [], "raw_broker": [], "raw_broker_io_threads": [],
                                       "specgen_ping": [], "specgen_evaluate": []}
    tput: dict[str, list[float]] = {"raw_broker_requests": [], "specgen_evaluate_requests": [], "specgen_pings": []}
    block_medians: dict[str, list[float]] = {k: [] for k in results}
    try:
        with LocalCluster(workers=2, evaluator="replay") as cluster:
            for _ in range(200):
                cluster.client.ping()
                spec_evaluate_rtt(cluster)
            sub = CandidateSubmission(job_id="", candidate_id="b", problem_name="bench", problem_source=PROBLEM,
                                      candidate_source=INSTANT)
            methods: dict[str, Callable[[], float]] = {
                "raw_echo": raw.echo_rtt, "specgen_ping": cluster.client.ping, "raw_broker": raw.broker_rtt,
                "raw_broker_io_threads": raw.broker_io_rtt, "specgen_evaluate": lambda: spec_evaluate_rtt(cluster)}
            for r in range(rounds):
                for _ in range(max(1, n // block)):
                    for name, method in methods.items():
                        samples = [method() for _ in range(block)]
                        results[name] += samples
                        block_medians[name].append(statistics.median(samples))
                tput["raw_broker_requests"].append(raw.broker_throughput(total, window))
                tput["specgen_evaluate_requests"].append(spec_throughput(
                    cluster, total, window, lambda: EvaluateRequest(call_id=0, submission=sub, stage="validate")))
                tput["specgen_pings"].append(spec_throughput(cluster, total, window, lambda: Ping(call_id=0)))
                print(f"round {r + 1}/{rounds} done", flush=True)
    finally:
        raw.close()
    rtt = {k: {"median_us": statistics.median(v) * 1e6, "p10_us": percentile(v, 0.1) * 1e6,
               "p90_us": percentile(v, 0.9) * 1e6, "p99_us": percentile(v, 0.99) * 1e6, "samples": len(v)}
           for k, v in results.items()}
    thr = {k: {"median_per_s": statistics.median(v), "rounds": v} for k, v in tput.items()}
    # Messages the scheduler receives or sends per evaluate request: request, assignment, result,
    # reply (the result's ack rides on the worker's next assignment). Per ping: request and reply.
    thr["specgen_evaluate_requests"]["scheduler_messages_per_s"] = 4 * thr["specgen_evaluate_requests"]["median_per_s"]
    thr["specgen_pings"]["scheduler_messages_per_s"] = 2 * thr["specgen_pings"]["median_per_s"]
    thr["raw_broker_requests"]["broker_messages_per_s"] = 4 * thr["raw_broker_requests"]["median_per_s"]
    def block_ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(block_medians[a], block_medians[b]))

    blocks = {"evaluate_vs_raw_broker": block_ratio("specgen_evaluate", "raw_broker"),
              "ping_vs_raw_echo": block_ratio("specgen_ping", "raw_echo"),
              "raw_io_threads_vs_raw_broker": block_ratio("raw_broker_io_threads", "raw_broker"),
              "blocks": len(block_medians["raw_broker"]), "block": block}
    return {"rtt": rtt, "throughput": thr, "window": window, "block_ratios": blocks}


def bench_decision(queued: int, samples: int) -> dict[str, Any]:
    settings = RuntimeSettings(max_queued_requests=10 * queued, peer_timeout_s=1e9)
    core = SchedulerCore(settings, Journal(":memory:"))
    now = time.monotonic()
    client, worker = b"client/b/1", b"worker/n/cpu0/1"
    core.handle(client, Hello(role="client", name="b"), now)
    seq = iter(range(10**9))

    def submit() -> None:
        i = next(seq)
        sub = CandidateSubmission(job_id=f"job{i % 10}", candidate_id=f"c{i}", problem_name="p",
                                  problem_source=PROBLEM, candidate_source="x", extracted_at=time.time() - i % 97,
                                  deadline=time.time() + 3600 + (i % 10) * 60, profile=False)
        core.handle(client, SubmitCandidate(call_id=i + 1, submission=sub), now)

    for _ in range(queued):
        submit()
    core.journal.commit()
    core.handle(worker, Hello(role="worker", name="n/cpu0", node="n"), now)
    core.outbox.clear()
    times_decide, times_event = [], []
    core.schedule(now)
    assign = next(m for p, m in core.outbox if p == worker and isinstance(m, AssignWork))
    core.outbox.clear()
    for i in range(samples):
        upd = CandidateUpdate(job_id=assign.submission.job_id, candidate_id=assign.submission.candidate_id,
                              stage="validate", verdict=Verdict(stage="validate"))
        t0 = time.perf_counter_ns()
        core.handle(worker, WorkDone(call_id=i + 1, request_id=assign.request_id, update=upd), now)
        t1 = time.perf_counter_ns()
        submit()                                   # keep the queue at `queued`
        assert len(core.queues["validate"]) >= queued
        t2 = time.perf_counter_ns()
        core.schedule(now)
        t3 = time.perf_counter_ns()
        times_decide.append((t3 - t2) / 1000)
        times_event.append((t1 - t0 + t3 - t2) / 1000)
        assign = next(m for p, m in core.outbox if p == worker and isinstance(m, AssignWork))
        core.outbox.clear()
        core.journal.commit()
    return {"queued": queued, "samples": samples,
            "decision_us_median": statistics.median(times_decide), "decision_us_p99": percentile(times_decide, 0.99),
            "result_to_next_assignment_us_median": statistics.median(times_event),
            "result_to_next_assignment_us_p99": percentile(times_event, 0.99)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1000, help="round trips per method per round")
    parser.add_argument("--block", type=int, default=20, help="round trips per method before the next takes its turn")
    parser.add_argument("--total", type=int, default=10000, help="requests per throughput sample")
    parser.add_argument("--window", type=int, default=128, help="requests in flight for throughput")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "runtime_bench.json")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(), "transport": "ipc://",
    }
    report["decision"] = bench_decision(queued=1000, samples=5000)
    report.update(bench_rtt_and_throughput(args.rounds, args.n, args.block, args.total, args.window))
    rtt, thr, dec = report["rtt"], report["throughput"], report["decision"]
    print("\nround trip (median / p90 / p99, us)")
    for k, v in rtt.items():
        print(f"  {k:18s} {v['median_us']:8.0f} {v['p90_us']:8.0f} {v['p99_us']:8.0f}")
    ratio = rtt["specgen_evaluate"]["median_us"] / rtt["raw_broker"]["median_us"]
    ratio_ping = rtt["specgen_ping"]["median_us"] / rtt["raw_echo"]["median_us"]
    ratio_io = rtt["specgen_evaluate"]["median_us"] / rtt["raw_broker_io_threads"]["median_us"]
    design = rtt["raw_broker_io_threads"]["median_us"] / rtt["raw_broker"]["median_us"]
    report["ratios"] = {"evaluate_vs_raw_broker": ratio, "ping_vs_raw_echo": ratio_ping,
                        "evaluate_vs_raw_broker_io_threads": ratio_io, "raw_io_threads_vs_raw_broker": design,
                        "evaluate_vs_raw_echo": rtt["specgen_evaluate"]["median_us"] / rtt["raw_echo"]["median_us"]}
    print(f"  specgen evaluate / raw broker: {ratio:.2f}x; specgen ping / raw echo: {ratio_ping:.2f}x")
    print(f"  raw broker with I/O threads / raw broker: {design:.2f}x; "
          f"specgen evaluate / raw broker with I/O threads: {ratio_io:.2f}x")
    br = report["block_ratios"]
    print(f"  median over {br['blocks']} blocks of {br['block']}: specgen evaluate / raw broker "
          f"{br['evaluate_vs_raw_broker']:.2f}x, specgen ping / raw echo {br['ping_vs_raw_echo']:.2f}x, "
          f"raw with I/O threads / raw broker {br['raw_io_threads_vs_raw_broker']:.2f}x")
    print(f"\nthroughput, {args.window} in flight (median of {args.rounds} rounds)")
    for k, v in thr.items():
        extra = v.get("scheduler_messages_per_s") or v.get("broker_messages_per_s")
        print(f"  {k:28s} {v['median_per_s']:9.0f}/s  ({extra:.0f} messages/s through the scheduler/broker)")
    print(f"\nscheduling decision with {dec['queued']} queued: median {dec['decision_us_median']:.1f} us, "
          f"p99 {dec['decision_us_p99']:.1f} us; result -> next assignment median "
          f"{dec['result_to_next_assignment_us_median']:.1f} us")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
