"""How long a profiling run waits for the KV pool to give memory back, for both ways of serving it.

Each round: the pool is filled (stores until every slot holds a block), loads keep running from
another thread, then the scheduler's steward sees a profiling request assigned to a worker on the
pool's device and sends its shrink over the pool control channel (a real ZeroMQ ROUTER/DEALER
pair). Measured: from the steward's decision to the pool's memory being freed (the give-back's end,
on the same monotonic clock); then the steward grows the pool back for the next round. Two designs,
one after the other in this process, on the same pool and loads (`--designs`):

- `thread`: `PoolControlAgent.step()` in a Python thread of this process (the loader's interpreter)
  takes the request off its socket and calls `RemoteKvPool.shrink`;
- `process`: `PoolAgentProcess`: the agent is a process of its own and hands the request to the
  pool's native give-back thread, so no Python thread of this process is on the way.

The give-back itself (PoolCore.shrink, C++) is the same in both. `specgen serve`'s path is
KvPoolSteward.steer -> KvPoolController -> the agent -> PoolCore.shrink.

    python tools/pool_release_bench.py --device cpu --out release_cpu.json
    python tools/pool_release_bench.py --device cuda:0 --pool-gib 4 --reserve-gib 1 --out release_h200.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.kv.extension import kv_extension  # noqa: E402
from specgen.kv.layout import KvLayout  # noqa: E402
from specgen.kv.pool import RemoteKvPool  # noqa: E402
from specgen.kv.pool_agent import PoolAgentProcess  # noqa: E402
from specgen.kv.pool_control import KvPoolController, PoolControlAgent  # noqa: E402
from specgen.kv.segments import HOST, host_device_index  # noqa: E402
from specgen.runtime.kv_steward import KvPoolSteward, WorkerPlacement  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def parse_device(text: str) -> int:
    if text == "cpu":
        return HOST
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise SystemExit(f"--device {text!r}: expected cpu or cuda:N")


def check_cuda(device: int) -> None:
    ext = kv_extension()
    if not ext.cuda_compiled():
        raise SystemExit("--device cuda:N needs the KV extension built with CUDA (nvcc present at `pip install -e .`, "
                         "SPECGEN_KV_CUDA not 0); this build is CPU-only. Rebuild it, or use --device cpu.")
    count = int(ext.device_count())
    if device >= count:
        raise SystemExit(f"--device cuda:{device}: the extension sees {count} CUDA device(s)")


# Where a round's time went: until the agent had the request, until the give-back began, its phases.
PHASES = ("receive_ms", "before_ms", "retire_ms", "wait_ms", "free_ms", "gc_ms")
DESIGNS = ("thread", "process")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


class ThreadAgent:
    """Today's way: PoolControlAgent stepped by a Python thread of the pool's process."""

    name = "thread"

    def __init__(self, pool: RemoteKvPool, endpoint: str, errors: list) -> None:
        self.pool = pool
        self.agent = PoolControlAgent(pool, endpoint, stats_interval_s=3600.0)
        self.received: list[float] = []
        self.applied = 0
        self.cond = threading.Condition()
        self.errors = errors
        self.stop = threading.Event()
        poll_resize = self.agent.client.poll_resize

        def timed_poll() -> list:
            requests = poll_resize()
            if requests:
                self.received.append(time.perf_counter())   # the agent's thread has the request in hand
            return requests

        self.agent.client.poll_resize = timed_poll
        self.agent.step()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                if self.agent.step(timeout_s=0.05):
                    with self.cond:
                        self.applied += 1
                        self.cond.notify_all()
        except BaseException as exc:
            self.errors.append(exc)
            with self.cond:
                self.cond.notify_all()

    def count(self) -> int:
        return self.applied

    def wait(self, count: int, timeout_s: float = 120.0) -> dict:
        # Sleeps until notified: the scheduler's side is another process in specgen, so this thread
        # must not compete with the give-back for the interpreter while it waits.
        with self.cond:
            if not self.cond.wait_for(lambda: self.applied >= count or self.errors, timeout=timeout_s):
                raise SystemExit(f"the pool did not apply resize {count} within {timeout_s} s")
        if self.errors:
            raise self.errors[0]
        r = self.pool.last_release
        return {"received_s": self.received[-1], "began_s": r["began"], "ended_s": r["ended"],
                "retire_ms": r["retire_ms"], "wait_ms": r["wait_ms"], "free_ms": r["free_ms"]}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.agent.close()


class ProcessAgent:
    """The agent in a process of its own, the give-back on the pool's native thread."""

    name = "process"

    def __init__(self, pool: RemoteKvPool, endpoint: str, errors: list) -> None:
        self.agent = PoolAgentProcess(pool, endpoint, stats_interval_s=3600.0)
        self.agent.wait_started()
        self.base = self.agent._server.served     # the first stats request

    def count(self) -> int:
        return self.agent._server.served - self.base

    def wait(self, count: int, timeout_s: float = 120.0) -> dict:
        # A nap-and-check loop costs this design nothing measured: the figures are the give-back
        # thread's own timestamps, and no Python thread stands between the request and the free.
        deadline = time.monotonic() + timeout_s
        while self.count() < count:
            if time.monotonic() > deadline or self.agent.process.poll() is not None:
                raise SystemExit(f"the pool's agent did not apply resize {count} within {timeout_s} s")
            time.sleep(0.002)
        reply = self.agent.last_reply()
        if reply["status"] != "ok":
            raise SystemExit(f"resize {count}: {reply['status']}: {reply['message']}")
        return reply

    def close(self) -> None:
        self.agent.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="where the pool lives: cpu (host memory) or cuda:N")
    ap.add_argument("--pool-gib", type=float, default=0.5, help="pool size (default 0.5)")
    ap.add_argument("--segment-mib", type=int, default=64, help="segment size, the unit of giving back (default 64)")
    ap.add_argument("--reserve-gib", type=float, default=0.125,
                    help="what one busy profiling device takes back (the scheduler's kv_reserve_bytes; default 0.125)")
    ap.add_argument("--headroom-gib", type=float, default=8.0, help="GPU memory the pool never takes (default 8)")
    ap.add_argument("--block-kib", type=int, default=64, help="KV block size (default 64)")
    ap.add_argument("--engine-blocks", type=int, default=1024, help="blocks in the engine's cache (default 1024)")
    ap.add_argument("--rounds", type=int, default=50, help="rounds per design (default 50)")
    ap.add_argument("--designs", default=",".join(DESIGNS), help=f"which, in this order (default {','.join(DESIGNS)})")
    ap.add_argument("--load-batch", type=int, default=16, help="blocks per load in flight (default 16)")
    ap.add_argument("--loads-in-flight", type=int, default=4, help="loads kept in flight on CUDA (default 4)")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    designs = [d for d in args.designs.split(",") if d]
    if not designs or any(d not in DESIGNS for d in designs):
        raise SystemExit(f"--designs {args.designs!r}: choose from {', '.join(DESIGNS)}")

    device = parse_device(args.device)
    if device != HOST:
        check_cuda(device)
    import torch

    torch_device = "cpu" if device == HOST else f"cuda:{device}"
    half = args.block_kib * 1024 // 2
    # Two layers of byte pages, as vLLM's offloading connector hands the cache over.
    tensors = [torch.randint(-128, 127, (args.engine_blocks, half), dtype=torch.int8, device=torch_device)
               for _ in range(2)]
    layout = KvLayout.from_tensors(tensors, args.engine_blocks)
    pool_bytes = int(args.pool_gib * GIB)
    pool = RemoteKvPool(layout, devices=(device,), segment_bytes=args.segment_mib * MIB, max_bytes=pool_bytes,
                        headroom_bytes=int(args.headroom_gib * GIB), pool_id="bench-pool")
    pool.grow()
    full_bytes = pool.capacity_bytes
    if full_bytes == 0:
        raise SystemExit(f"the pool could not take any memory on {args.device} (headroom {args.headroom_gib} GiB)")
    reserve = int(args.reserve_gib * GIB)
    tmp = tempfile.mkdtemp(prefix="specgen-release-bench-")
    worker = dict(name="bench/profiler", host=socket.gethostname(), device=host_device_index(device))
    identity = b"bench-pool"

    stop = threading.Event()
    loads = {"blocks": 0, "missed": 0}
    errors: list[BaseException] = []
    next_key = [1]

    def fill() -> None:
        # New keys every time: the pool ends full of blocks that are all live (LRU evicts old ones).
        slots = pool.stats().capacity_blocks
        batch = 256
        engine = np.arange(batch, dtype=np.int64) % args.engine_blocks
        stored = 0
        while stored < slots:
            n = min(batch, slots - stored)
            keys = np.arange(next_key[0], next_key[0] + n, dtype=np.uint64)
            next_key[0] += n
            pool.store(keys, engine[:n]).wait()
            stored += n

    def loader() -> None:
        try:
            rng = np.random.default_rng(0)
            dst = np.arange(args.engine_blocks - args.load_batch, args.engine_blocks, dtype=np.int64)
            pending = []
            while not stop.is_set():
                hi = next_key[0]
                # The keys the last fill stored (cheap to compute: this thread competes for the
                # interpreter, as an engine thread would).
                lo = max(1, hi - pool.capacity_bytes // pool.layout.slot_bytes)
                if hi - lo < args.load_batch:
                    time.sleep(0.001)
                    continue
                start = int(rng.integers(lo, hi - args.load_batch + 1))
                keys = np.arange(start, start + args.load_batch, dtype=np.uint64)
                found = pool.lookup(keys)
                if found == 0:
                    continue
                copy = pool.load(keys[:found], dst[:found], method="kernel" if device != HOST else "auto")
                loads["blocks"] += len(copy.keys)
                loads["missed"] += len(copy.missed)
                pending.append(copy)
                # On a GPU the loads are asynchronous: keep several in flight while the shrink runs.
                while len(pending) >= (args.loads_in_flight if device != HOST else 1):
                    pending.pop(0).wait()
            for copy in pending:
                copy.wait()
        except BaseException as exc:
            errors.append(exc)

    # The interpreter's garbage collector stops every Python thread while it runs: record when it did.
    collections: list[tuple[float, float]] = []
    gc_started = [0.0]

    def on_gc(phase_name: str, info: dict) -> None:
        if phase_name == "start":
            gc_started[0] = time.perf_counter()
        else:
            collections.append((gc_started[0], time.perf_counter()))

    def gc_ms(lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in collections) * 1e3

    gc.callbacks.append(on_gc)
    load_thread = threading.Thread(target=loader, daemon=True)
    load_thread.start()
    results = {}
    now = 0.0
    try:
        for name in designs:
            controller = KvPoolController(f"ipc://{tmp}/kv-{name}.sock")
            agent = (ThreadAgent if name == "thread" else ProcessAgent)(pool, controller.endpoint, errors)
            steward = KvPoolSteward(reserve_bytes=reserve, regrow_idle_s=0.0, pool_timeout_s=1e9)
            controller.wait_for("bench-pool", lambda s: s.capacity_bytes > 0, timeout_s=30.0)
            rows = []
            try:
                for round_index in range(args.rounds):
                    fill()
                    before = pool.stats()
                    steward.on_stats(identity, before, now)
                    loads_before = dict(loads)
                    time.sleep(0.01)               # loads run on the full pool before the request
                    done_before = agent.count()
                    t0 = time.perf_counter()
                    requests = steward.steer([WorkerPlacement(busy=True, **worker)], now)
                    if not requests:
                        raise SystemExit(f"round {round_index}: the steward asked for no room (is --reserve-gib > 0?)"
                                         f"; pool view: {steward.views(now)}")
                    for ident, request in requests:
                        controller.resize(ident.decode(), request.target_bytes, request.request_id)
                    r = agent.wait(done_before + 1)
                    after = pool.stats()
                    rows.append({"round": round_index, "release_ms": (r["ended_s"] - t0) * 1e3,
                                 "freed_bytes": before.capacity_bytes - after.capacity_bytes,
                                 "blocks_before": before.used_blocks, "target_bytes": requests[-1][1].target_bytes,
                                 "load_blocks": loads["blocks"] - loads_before["blocks"],
                                 "load_missed": loads["missed"] - loads_before["missed"],
                                 # until the agent had the request, then until the give-back began
                                 "receive_ms": (r["received_s"] - t0) * 1e3,
                                 "before_ms": (r["began_s"] - t0) * 1e3,
                                 "retire_ms": r["retire_ms"], "wait_ms": r["wait_ms"], "free_ms": r["free_ms"],
                                 # the collector's pauses inside the round (every Python thread stops)
                                 "gc_ms": gc_ms(t0, r["ended_s"])})
                    # The device idles again: the steward grows the pool back (regrow_idle_s=0 here).
                    now += 1.0
                    steward.on_stats(identity, after, now)
                    for ident, request in steward.steer([WorkerPlacement(busy=False, **worker)], now):
                        done_before = agent.count()
                        controller.resize(ident.decode(), request.target_bytes, request.request_id)
                        agent.wait(done_before + 1)
                    now += 1.0
                    if errors:
                        raise errors[0]
            finally:
                agent.close()
                controller.close()
            results[name] = rows
    finally:
        stop.set()
        load_thread.join(30)
        pool.close()
    if errors:
        raise errors[0]

    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(pool_bytes=full_bytes, slot_bytes=layout.slot_bytes, host=platform.node(),
                  cuda_compiled=bool(kv_extension().cuda_compiled()), python=platform.python_version(),
                  pid=os.getpid())
    print(f"pool {full_bytes / MIB:.0f} MiB on {args.device}, segments {args.segment_mib} MiB, "
          f"give-back {reserve / MIB:.0f} MiB per profiling assignment, {args.rounds} rounds per design, "
          "loads in flight")
    out = {"config": config, "designs": {}}
    for name, rows in results.items():
        times = [r["release_ms"] for r in rows]
        summary = {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "p99_ms": percentile(times, 99),
                   "max_ms": max(times), "mean_freed_mib": float(np.mean([r["freed_bytes"] for r in rows])) / MIB,
                   "loaded_blocks": sum(r["load_blocks"] for r in rows),
                   "missed_blocks": sum(r["load_missed"] for r in rows),
                   "phase_p50_ms": {k: percentile([r[k] for r in rows], 50) for k in PHASES},
                   "phase_p99_ms": {k: percentile([r[k] for r in rows], 99) for k in PHASES}}
        out["designs"][name] = {"summary": summary, "rounds": rows}
        print(f"\n{name}: agent {'thread in this process' if name == 'thread' else 'process + native give-back thread'}")
        print(f"{'':>22}{'p50':>10}{'p95':>10}{'p99':>10}{'max':>10}")
        print(f"{'request -> freed (ms)':>22}{summary['p50_ms']:>10.2f}{summary['p95_ms']:>10.2f}"
              f"{summary['p99_ms']:>10.2f}{summary['max_ms']:>10.2f}")
        for k in PHASES:
            print(f"{'  ' + k:>22}{summary['phase_p50_ms'][k]:>10.2f}{'':>10}{summary['phase_p99_ms'][k]:>10.2f}")
        print(f"freed per round {summary['mean_freed_mib']:.0f} MiB; loads during the rounds: "
              f"{summary['loaded_blocks']} blocks copied, {summary['missed_blocks']} missed")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
