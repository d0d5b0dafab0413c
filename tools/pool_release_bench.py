"""How long a profiling run waits for the KV pool to give memory back.

Each round: the pool is filled (stores until every slot holds a block), loads keep running from
another thread, then the scheduler's steward sees a profiling request assigned to a worker on the
pool's device and sends its shrink over the pool control channel (a real ZeroMQ ROUTER/DEALER
pair); the pool's `PoolControlAgent` applies it (relocating/evicting blocks, waiting for the loads
that pin them, freeing the segments). Measured: from the steward's decision to the memory being
freed (the agent's step returning), then the steward's grow-back restores the pool for the next
round. The code path is the one `specgen serve` uses: KvPoolSteward.steer -> KvPoolController ->
PoolControlAgent.step -> RemoteKvPool.shrink/release_segment.

    python tools/pool_release_bench.py --device cpu --out release_cpu.json
    python tools/pool_release_bench.py --device cuda:0 --pool-gib 32 --reserve-gib 8 --out release_h200.json
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


# Where a round's time went: before the pool's give-back began, its phases, after it ended.
PHASES = ("before_ms", "receive_ms", "retire_ms", "wait_ms", "free_ms", "after_ms", "gc_ms")


def phase(row: dict, name: str) -> float:
    return float(row[name]) if name in row else float(row["phases"].get(name, 0.0))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


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
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--load-batch", type=int, default=16, help="blocks per load in flight (default 16)")
    ap.add_argument("--loads-in-flight", type=int, default=4, help="loads kept in flight on CUDA (default 4)")
    ap.add_argument("--switch-interval-us", type=float, default=None,
                    help="the interpreter's thread switch interval for the whole run (default: Python's, 5,000 us): "
                         "how much of the wait is the interpreter handed between threads")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="move every object alive after set-up out of the collector's reach (gc.freeze(), as vLLM's "
                         "engine does after start-up): a full collection then scans only what was allocated since")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.switch_interval_us is not None:
        sys.setswitchinterval(args.switch_interval_us * 1e-6)

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
    steward = KvPoolSteward(reserve_bytes=reserve, regrow_idle_s=0.0, pool_timeout_s=1e9)
    tmp = tempfile.mkdtemp(prefix="specgen-release-bench-")
    controller = KvPoolController(f"ipc://{tmp}/kv.sock")
    agent = PoolControlAgent(pool, controller.endpoint, stats_interval_s=3600.0)
    worker_device = host_device_index(device)
    worker = dict(name="bench/profiler", host=socket.gethostname(), device=worker_device)
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
                # The keys the last fill stored (cheap to compute: this thread competes with the
                # give-back for the interpreter, as an engine thread would).
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

    # The pool's control loop: in specgen this is PoolControlAgent.step() in the pool's own thread.
    applied_at: list[float] = []
    applied = threading.Condition()

    received_at: list[float] = []
    poll_resize = agent.client.poll_resize

    def timed_poll() -> list:
        requests = poll_resize()
        if requests:
            received_at.append(time.perf_counter())
        return requests

    agent.client.poll_resize = timed_poll  # when the agent's thread had the request in hand

    def control_loop() -> None:
        try:
            while not stop.is_set():
                if agent.step(timeout_s=0.05):
                    with applied:
                        applied_at.append(time.perf_counter())
                        applied.notify_all()
        except BaseException as exc:
            errors.append(exc)
            with applied:
                applied.notify_all()

    def wait_applied(count: int, timeout_s: float = 120.0) -> float:
        # Sleeps until notified: the scheduler's side lives in another process in specgen, so this
        # thread must not compete with the give-back for the interpreter while it waits.
        with applied:
            if not applied.wait_for(lambda: len(applied_at) >= count or errors, timeout=timeout_s):
                raise SystemExit(f"the pool did not apply resize {count} within {timeout_s} s")
        if errors:
            raise errors[0]
        return applied_at[count - 1]

    # The interpreter's garbage collector stops every thread while it runs: record when it did.
    collections: list[tuple[float, float]] = []
    generations: list[int] = []
    gc_started = [0.0]

    def on_gc(phase_name: str, info: dict) -> None:
        if phase_name == "start":
            gc_started[0] = time.perf_counter()
        else:
            collections.append((gc_started[0], time.perf_counter()))
            generations.append(info["generation"])

    def gc_ms(lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in collections) * 1e3

    gc.callbacks.append(on_gc)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()

    # The pool reports once; the controller (scheduler side) learns its identity and devices.
    agent.step()
    controller.wait_for("bench-pool", lambda s: s.capacity_bytes > 0, timeout_s=10.0)
    threads = [threading.Thread(target=control_loop, daemon=True), threading.Thread(target=loader, daemon=True)]
    for t in threads:
        t.start()
    rows = []
    now = 0.0
    try:
        for round_index in range(args.rounds):
            fill()
            before = pool.stats()
            steward.on_stats(identity, before, now)
            loads_before = dict(loads)
            time.sleep(0.01)               # loads run on the full pool before the request
            done_before = len(applied_at)
            t0 = time.perf_counter()
            requests = steward.steer([WorkerPlacement(busy=True, **worker)], now)
            if not requests:
                raise SystemExit(f"round {round_index}: the steward asked for no room (is --reserve-gib > 0?); "
                                 f"pool view: {steward.views(now)}")
            for ident, request in requests:
                controller.resize(ident.decode(), request.target_bytes, request.request_id)
            t1 = wait_applied(done_before + 1)
            after = pool.stats()
            rows.append({"round": round_index, "release_ms": (t1 - t0) * 1e3,
                         "freed_bytes": before.capacity_bytes - after.capacity_bytes,
                         "blocks_before": before.used_blocks, "target_bytes": requests[-1][1].target_bytes,
                         "load_blocks": loads["blocks"] - loads_before["blocks"],
                         "load_missed": loads["missed"] - loads_before["missed"],
                         # Where the pool's give-back went (RemoteKvPool.last_release); the rest of
                         # release_ms is the control channel and the agent's thread.
                         "phases": dict(pool.last_release),
                         # Before the pool's give-back began: the steward, the control channel and
                         # the agent's thread; after it ended: the agent's stats report.
                         "before_ms": (pool.last_release.get("began", t0) - t0) * 1e3,
                         # ... of which: until the agent's thread had the request (the control
                         # channel and the thread's wake-up), then until its give-back began.
                         "receive_ms": (received_at[-1] - t0) * 1e3,
                         "after_ms": (t1 - pool.last_release.get("ended", t1)) * 1e3,
                         # The collector's pauses inside the round's wait (every thread stops).
                         "gc_ms": gc_ms(t0, t1)})
            # The device idles again: the steward grows the pool back (regrow_idle_s=0 here).
            now += 1.0
            steward.on_stats(identity, after, now)
            for ident, request in steward.steer([WorkerPlacement(busy=False, **worker)], now):
                done_before = len(applied_at)
                controller.resize(ident.decode(), request.target_bytes, request.request_id)
                wait_applied(done_before + 1)
            now += 1.0
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        agent.close()
        controller.close()
        pool.close()
    if errors:
        raise errors[0]

    times = [r["release_ms"] for r in rows]
    summary = {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "p99_ms": percentile(times, 99),
               "max_ms": max(times), "mean_freed_mib": float(np.mean([r["freed_bytes"] for r in rows])) / MIB,
               "loaded_blocks": sum(r["load_blocks"] for r in rows),
               "missed_blocks": sum(r["load_missed"] for r in rows),
               "phase_p50_ms": {k: percentile([phase(r, k) for r in rows], 50) for k in PHASES},
               "phase_p99_ms": {k: percentile([phase(r, k) for r in rows], 99) for k in PHASES},
               # Every collection of the run, per generation: how many, the longest pause.
               "gc": {str(g): {"count": generations.count(g),
                               "max_ms": max((b - a) * 1e3 for (a, b), h in zip(collections, generations) if h == g)}
                      for g in sorted(set(generations))}}
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(pool_bytes=full_bytes, slot_bytes=layout.slot_bytes, host=platform.node(),
                  cuda_compiled=bool(kv_extension().cuda_compiled()), python=platform.python_version(),
                  pid=os.getpid())
    print(f"pool {full_bytes / MIB:.0f} MiB on {args.device}, segments {args.segment_mib} MiB, "
          f"give-back {reserve / MIB:.0f} MiB per profiling assignment, {args.rounds} rounds, loads in flight")
    print(f"{'':>22}{'p50':>10}{'p95':>10}{'p99':>10}{'max':>10}")
    print(f"{'request -> freed (ms)':>22}{summary['p50_ms']:>10.2f}{summary['p95_ms']:>10.2f}"
          f"{summary['p99_ms']:>10.2f}{summary['max_ms']:>10.2f}")
    for name in PHASES:
        print(f"{'  ' + name:>22}{summary['phase_p50_ms'][name]:>10.2f}{'':>10}"
              f"{summary['phase_p99_ms'][name]:>10.2f}")
    print("collections (generation: count, longest ms): "
          + ", ".join(f"{g}: {v['count']}, {v['max_ms']:.1f}" for g, v in summary["gc"].items()))
    print(f"freed per round {summary['mean_freed_mib']:.0f} MiB; loads during the rounds: "
          f"{summary['loaded_blocks']} blocks copied, {summary['missed_blocks']} missed")
    if args.out:
        Path(args.out).write_text(json.dumps({"config": config, "summary": summary, "rounds": rows}, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
