#!/usr/bin/env python3
"""KV-block transfer microbenchmarks (needs CUDA; two GPUs with peer access for peer copies).

Sections, all measured in one run:
  transfer  block sizes 16 KiB..1 MiB x 1..4,096 scattered blocks, both directions (store: engine GPU
            -> pool GPU, load: pool GPU -> engine GPU). Methods of the extension (kernel, batch,
            memcpy, auto) against the same-size bulk peer copy (the ceiling) and torch
            index_select + copy + index_copy_. GPU time from CUDA events with the GPU kept busy
            before each sample (launch cost excluded); wall time synchronized on both GPUs.
  latency   one block from the Python call to the completion event, wall clock, no device-wide sync.
  sweep     the SM kernel's launch knobs (warps per CTA, CTAs per SM) on a few shapes.
  prefill   fetching the whole-model KV of an N-token prefix (64 layers, 8 KV heads, head dim 128,
            bf16, vLLM 0.33 FlashAttention layout, block size 16) from a pool on the other GPU, against
            recomputing its prefill (hidden 5120, 40 query heads, MLP 27648, random weights, real
            attention + MLP math).

Every method is checked against a torch reference before it is timed. Prints tables and writes all
figures as JSON (--out).

    python tools/kv_bench.py --out kv_bench.json             # everything
    python tools/kv_bench.py --quick --sections transfer     # a smaller grid
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

KIB = 1024
MIB = 1024 * KIB
# GPU busy time queued before each timed sample, so the sample is fully queued before it starts and
# the events measure GPU execution only (about 50 us at H200 clocks; longer than any launch here).
SLEEP_CYCLES = 100_000


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("K", KIB), ("M", MIB), ("G", 1024 * MIB)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def fmt_size(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB}K"
    return str(n)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from specgen.kv.extension import kv_extension

        self.torch = torch
        self.ext = kv_extension()
        self.args = args
        self.engine = 0
        self.pool_dev = 1 if torch.cuda.device_count() > 1 and not args.same_device else 0
        self.stream = torch.cuda.Stream(device=self.engine)
        self.results: dict[str, Any] = {"env": self.environment()}

    # ------------------------------------------------------------------ helpers

    def environment(self) -> dict[str, Any]:
        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        env = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "host": platform.node(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda_runtime_of_extension": self.ext.cuda_runtime_version(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "sms": props.multi_processor_count,
            "engine_device": self.engine,
            "pool_device": self.pool_dev,
        }
        if torch.cuda.device_count() > 1:
            env["peer_access_0_1"] = bool(self.ext.can_access_peer(0, 1))
        return env

    def gpu_times_us(self, fn: Callable[[int], None], reps: int, warmup: int = 3) -> list[float]:
        """Per-sample GPU time of fn(i) queued on self.stream, with the GPU busy before each sample."""
        torch = self.torch
        with torch.cuda.stream(self.stream):
            for i in range(warmup):
                fn(i)
            self.stream.synchronize()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                torch.cuda._sleep(SLEEP_CYCLES)
                starts[i].record(self.stream)
                fn(i)
                ends[i].record(self.stream)
            self.stream.synchronize()
        return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]

    def wall_times_us(self, fn: Callable[[int], None], reps: int, warmup: int = 2) -> list[float]:
        """Wall time of fn(i) from the call until both GPUs are idle."""
        torch = self.torch
        devices = sorted({self.engine, self.pool_dev})

        def sync() -> None:
            for d in devices:
                torch.cuda.synchronize(d)

        with torch.cuda.stream(self.stream):
            for i in range(warmup):
                fn(i)
            sync()
            out = []
            for i in range(reps):
                t0 = time.perf_counter_ns()
                fn(i)
                sync()
                out.append((time.perf_counter_ns() - t0) / 1000.0)
        return out

    # ------------------------------------------------------------------ transfer grid

    def transfer_section(self) -> None:
        import numpy as np

        from specgen.kv.layout import KvLayout
        from specgen.kv.transfer import KvTransfer

        torch = self.torch
        sizes = [parse_size(s) for s in self.args.sizes.split(",")]
        counts = [int(c) for c in self.args.counts.split(",")]
        methods = ["kernel", "batch", "memcpy", "auto"]
        rows: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        self.results["transfer_errors"] = errors
        rng = np.random.default_rng(0)
        h = self.stream.cuda_stream
        for size in sizes:
            num_blocks = max(8192, 2 * max(counts))
            cache = torch.randint(-128, 127, (num_blocks, size), dtype=torch.int8, device=f"cuda:{self.engine}")
            pool = torch.randint(-128, 127, (num_blocks, size), dtype=torch.int8, device=f"cuda:{self.pool_dev}")
            layout = KvLayout.from_tensors([cache], num_blocks)
            transfer = KvTransfer(layout, slots_per_segment=num_blocks, max_segments=1)
            transfer.set_segment(0, pool.data_ptr())
            for n in counts:
                variants = 8
                sets = [(rng.choice(num_blocks, n, replace=False), rng.choice(num_blocks, n, replace=False))
                        for _ in range(variants)]
                tsets = [(torch.from_numpy(b).to(f"cuda:{self.engine}"), torch.from_numpy(s).to(f"cuda:{self.pool_dev}"))
                         for b, s in sets]
                total = n * size
                reps = self.args.reps if total <= 64 * MIB else max(5, self.args.reps // 4)
                for direction in ("load", "store"):
                    # Correctness of every method against torch before timing; a failing method is
                    # reported and left out of the timings.
                    failed: dict[str, str] = {}
                    for method in methods:
                        blocks, slots = sets[0]
                        op = transfer.load if direction == "load" else transfer.store
                        b_idx = torch.from_numpy(blocks).to(cache.device)
                        s_idx = torch.from_numpy(slots).to(pool.device)
                        if direction == "load":
                            pool[s_idx] = torch.randint(-128, 127, (n, size), dtype=torch.int8, device=pool.device)
                        else:
                            pool[s_idx] = 0
                            cache[b_idx] = torch.randint(-128, 127, (n, size), dtype=torch.int8, device=cache.device)
                        torch.cuda.synchronize(self.engine)
                        torch.cuda.synchronize(self.pool_dev)
                        try:
                            op(blocks, slots, stream=h, method=method).wait()
                            if not torch.equal(cache[b_idx], pool[s_idx].to(cache.device)):
                                failed[method] = "copied data differs from the source"
                        except Exception as exc:  # recorded and reported; the other methods still run
                            failed[method] = f"{type(exc).__name__}: {exc}"
                        if method in failed:
                            print(f"FAILED {direction} {method} size={size} n={n}: {failed[method]}", flush=True)
                            errors.append({"block_bytes": size, "blocks": n, "direction": direction,
                                           "method": method, "error": failed[method]})

                    def ext_op(method: str) -> Callable[[int], None]:
                        op = transfer.load if direction == "load" else transfer.store

                        def run(i: int) -> None:
                            blocks, slots = sets[i % variants]
                            op(blocks, slots, stream=h, method=method)
                        return run

                    def bulk(i: int) -> None:
                        base_c = cache.data_ptr() + (i % 2) * total if 2 * total <= cache.numel() else cache.data_ptr()
                        base_p = pool.data_ptr() + (i % 2) * total if 2 * total <= pool.numel() else pool.data_ptr()
                        if direction == "load":
                            self.ext.memcpy_peer(base_c, self.engine, base_p, self.pool_dev, total, h)
                        else:
                            self.ext.memcpy_peer(base_p, self.pool_dev, base_c, self.engine, total, h)

                    def torch_copy(i: int) -> None:
                        b, s = tsets[i % variants]
                        if direction == "load":
                            tmp = pool.index_select(0, s).to(cache.device, non_blocking=True)
                            cache.index_copy_(0, b, tmp)
                        else:
                            tmp = cache.index_select(0, b).to(pool.device, non_blocking=True)
                            pool.index_copy_(0, s, tmp)

                    memcpy_reps = reps if n <= 256 else max(3, reps // 8)
                    candidates: list[tuple[str, Callable[[int], None], int, bool]] = [
                        ("bulk", bulk, reps, True),
                        ("kernel", ext_op("kernel"), reps, True),
                        ("batch", ext_op("batch"), reps, True),
                        ("auto", ext_op("auto"), reps, True),
                        ("memcpy", ext_op("memcpy"), memcpy_reps, True),
                        ("torch", torch_copy, memcpy_reps, False),
                    ]
                    measured: dict[str, dict[str, float]] = {}
                    for name, fn, r, gpu_timed in candidates:
                        if name in failed:
                            continue
                        entry: dict[str, float] = {}
                        if gpu_timed:
                            entry["gpu_us"] = statistics.median(self.gpu_times_us(fn, r))
                        entry["wall_us"] = statistics.median(self.wall_times_us(fn, max(3, r // 2)))
                        measured[name] = entry
                    bulk_gpu = measured["bulk"]["gpu_us"]
                    for name, entry in measured.items():
                        t = entry.get("gpu_us", entry["wall_us"])
                        rows.append({
                            "block_bytes": size, "blocks": n, "direction": direction, "method": name,
                            "gpu_us": entry.get("gpu_us"), "wall_us": entry["wall_us"],
                            "gbps": total / (t * 1e-6) / 1e9,
                            "pct_of_bulk": 100.0 * bulk_gpu / t if "gpu_us" in entry else None,
                        })
                    print(self._transfer_line(size, n, direction, measured, total), flush=True)
            del cache, pool, transfer
            torch.cuda.empty_cache()
        self.results["transfer"] = rows

    @staticmethod
    def _transfer_line(size: int, n: int, direction: str, m: dict[str, dict[str, float]], total: int) -> str:
        def gb(t: float) -> float:
            return total / (t * 1e-6) / 1e9
        parts = [f"{fmt_size(size):>5} x{n:>5} {direction:>5}"]
        for name in ("bulk", "kernel", "batch", "auto", "memcpy"):
            if name in m:
                t = m[name]["gpu_us"]
                parts.append(f"{name} {t:9.1f}us {gb(t):6.1f}GB/s")
        if "torch" in m:
            parts.append(f"torch(wall) {m['torch']['wall_us']:9.1f}us {gb(m['torch']['wall_us']):6.1f}GB/s")
        if "kernel" in m:
            parts.append(f"kernel/bulk {100 * m['bulk']['gpu_us'] / m['kernel']['gpu_us']:5.0f}%")
        return " | ".join(parts)

    # ------------------------------------------------------------------ latency

    def latency_section(self) -> None:
        import numpy as np

        from specgen.kv.layout import KvLayout
        from specgen.kv.transfer import KvTransfer

        torch = self.torch
        size = 64 * KIB
        num_blocks = 4096
        h = self.stream.cuda_stream
        rng = np.random.default_rng(1)
        picks = [(np.array([b], dtype=np.int64), np.array([s], dtype=np.int64))
                 for b, s in zip(rng.integers(0, num_blocks, 256), rng.integers(0, num_blocks, 256))]
        clock_khz = self.ext.clock_rate_khz(self.engine)
        out: dict[str, Any] = {"block_bytes": size, "sm_clock_khz_max": clock_khz}
        cache = torch.randint(-128, 127, (num_blocks, size), dtype=torch.int8, device=f"cuda:{self.engine}")
        pools = {"peer": self.pool_dev, "same_device": self.engine}
        for where, pool_device in pools.items():
            if where == "same_device" and pool_device == self.pool_dev:
                continue
            pool = torch.randint(-128, 127, (num_blocks, size), dtype=torch.int8, device=f"cuda:{pool_device}")
            transfer = KvTransfer(KvLayout.from_tensors([cache], num_blocks), slots_per_segment=num_blocks,
                                  max_segments=1)
            transfer.set_segment(0, pool.data_ptr())
            torch.cuda.synchronize(self.engine)
            torch.cuda.synchronize(pool_device)
            for direction in ("load", "store"):
                op = transfer.load if direction == "load" else transfer.store
                key = f"{direction}_{where}"
                gpu = self.gpu_times_us(lambda i: op(*picks[i % 256], stream=h, method="kernel"), 200)
                entry = {"kernel_gpu_us_median": statistics.median(gpu)}
                if where == "peer":
                    entry.update(self._e2e(lambda b, s: op(b, s, stream=h, method="kernel"), picks, "kernel"))
                    # Persistent copier: checked against torch first, then timed.
                    transfer.start_persistent()
                    b, s = picks[0]
                    op(b, s, method="persistent").wait(timeout_s=10)
                    # Compared on the host: no GPU kernels while the resident one runs.
                    if not torch.equal(cache[int(b[0])].cpu(), pool[int(s[0])].cpu()):
                        raise SystemExit(f"MISMATCH: persistent {direction}")
                    cycles, nanos = [], []

                    def persistent(b: Any, s: Any) -> Any:
                        return op(b, s, method="persistent")

                    entry.update(self._e2e(persistent, picks, "persistent", timing=(transfer, cycles, nanos)))
                    entry["persistent_launches"] = transfer.persistent_launches()
                    transfer.stop_persistent()
                    entry["persistent_gpu_us_median_globaltimer"] = statistics.median(nanos) / 1000.0
                out[key] = entry
                line = f"single 64K block {direction:>5} ({where}): kernel GPU {entry['kernel_gpu_us_median']:.2f} us"
                if "kernel_e2e_us_median" in entry:
                    line += (f", kernel end to end {entry['kernel_e2e_us_median']:.2f} us; persistent GPU "
                             f"{entry['persistent_gpu_us_median_globaltimer']:.2f} us (global timer, request seen -> done), "
                             f"end to end {entry['persistent_e2e_us_median']:.2f} us "
                             f"(p10 {entry['persistent_e2e_us_p10']:.2f}, p90 {entry['persistent_e2e_us_p90']:.2f})")
                print(line, flush=True)
            del pool, transfer
        self.results["latency"] = out

    def _e2e(self, call: Callable[[Any, Any], Any], picks: list[Any], name: str,
             timing: tuple[Any, list[int], list[int]] | None = None) -> dict[str, float]:
        """Wall time from the Python call until its completion event reports done (no device-wide sync)."""
        for i in range(200):
            call(*picks[i % len(picks)]).wait(timeout_s=10)
        walls = []
        for i in range(self.args.latency_reps):
            b, s = picks[i % len(picks)]
            t0 = time.perf_counter_ns()
            call(b, s).wait(timeout_s=10)
            walls.append((time.perf_counter_ns() - t0) / 1000.0)
            if timing is not None:
                cycles, nanos = timing[0].persistent_last_timing()
                timing[1].append(cycles)
                timing[2].append(nanos)
        walls.sort()
        return {f"{name}_e2e_us_median": statistics.median(walls), f"{name}_e2e_us_p10": walls[len(walls) // 10],
                f"{name}_e2e_us_p90": walls[9 * len(walls) // 10]}

    # ------------------------------------------------------------------ kernel knobs

    def sweep_section(self) -> None:
        import numpy as np

        from specgen.kv.layout import KvLayout
        from specgen.kv.transfer import KvTransfer

        torch = self.torch
        rows = []
        h = self.stream.cuda_stream
        rng = np.random.default_rng(2)
        for size in (16 * KIB, 64 * KIB):
            num_blocks = 8192
            cache = torch.empty((num_blocks, size), dtype=torch.int8, device=f"cuda:{self.engine}")
            pool = torch.empty((num_blocks, size), dtype=torch.int8, device=f"cuda:{self.pool_dev}")
            transfer = KvTransfer(KvLayout.from_tensors([cache], num_blocks), slots_per_segment=num_blocks,
                                  max_segments=1)
            transfer.set_segment(0, pool.data_ptr())
            default = transfer.kernel_config
            base = (default.warps_per_cta, default.ctas_per_sm)
            for n in (1, 64, 1024):
                sets = [(rng.choice(num_blocks, n, replace=False), rng.choice(num_blocks, n, replace=False))
                        for _ in range(8)]
                for direction in ("load", "store"):
                    op = transfer.load if direction == "load" else transfer.store
                    best = None
                    for warps in (1, 2, 4, 8, 16):
                        for ctas in (1, 2, 4, 8, 16):
                            cfg = transfer.kernel_config
                            cfg.warps_per_cta, cfg.ctas_per_sm = warps, ctas
                            transfer.kernel_config = cfg
                            t = statistics.median(self.gpu_times_us(
                                lambda i: op(*sets[i % 8], stream=h, method="kernel"), 30))
                            rows.append({"block_bytes": size, "blocks": n, "direction": direction,
                                         "warps_per_cta": warps, "ctas_per_sm": ctas, "gpu_us": t})
                            if best is None or t < best[0]:
                                best = (t, warps, ctas)
                    cfg = transfer.kernel_config
                    cfg.warps_per_cta, cfg.ctas_per_sm = base
                    transfer.kernel_config = cfg
                    default_t = next(r["gpu_us"] for r in rows if r["block_bytes"] == size and r["blocks"] == n
                                     and r["direction"] == direction and (r["warps_per_cta"], r["ctas_per_sm"]) == base)
                    print(f"sweep {fmt_size(size):>4} x{n:>5} {direction:>5}: best {best[0]:8.2f} us at warps/CTA "
                          f"{best[1]}, CTAs/SM {best[2]}; default {base} {default_t:8.2f} us", flush=True)
            del cache, pool, transfer
            torch.cuda.empty_cache()
        self.results["sweep"] = rows

    # ------------------------------------------------------------------ prefill comparison

    def prefill_section(self) -> None:
        import torch.nn.functional as F

        from specgen.kv.layout import KvLayout
        from specgen.kv.pool import RemoteKvPool

        torch = self.torch
        layers, kv_heads, head_dim, hidden, q_heads, inter = 64, 8, 128, 5120, 40, 27648
        block_tokens = 16
        dev = f"cuda:{self.engine}"
        dtype = torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape: int, scale: float) -> Any:
            return (torch.randn(*shape, device=dev, dtype=dtype, generator=g) * scale)

        # One layer's weights, reused for all 64 layers: the same arithmetic as 64 distinct layers.
        w_qkv = rand(hidden, (q_heads + 2 * kv_heads) * head_dim, scale=hidden ** -0.5)
        w_o = rand(q_heads * head_dim, hidden, scale=(q_heads * head_dim) ** -0.5)
        w_gate_up = rand(hidden, 2 * inter, scale=hidden ** -0.5)
        w_down = rand(inter, hidden, scale=inter ** -0.5)
        norm1 = torch.ones(hidden, device=dev, dtype=dtype)
        norm2 = torch.ones(hidden, device=dev, dtype=dtype)

        def rope(x: Any, positions: Any) -> Any:
            half = head_dim // 2
            freqs = 1.0 / (1_000_000.0 ** (torch.arange(half, device=dev, dtype=torch.float32) / half))
            angles = positions[:, None].float() * freqs[None, :]
            cos, sin = angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

        def layer(x: Any, positions: Any) -> Any:
            n = x.shape[0]
            hdn = F.rms_norm(x, (hidden,), norm1)
            qkv = hdn @ w_qkv
            q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            q = rope(q.view(n, q_heads, head_dim), positions)
            k = rope(k.view(n, kv_heads, head_dim), positions)
            v = v.view(n, kv_heads, head_dim)
            # Grouped-query attention with K/V repeated to the query heads, so SDPA takes its flash
            # kernel (with enable_gqa it may fall back to the slow math path, flattering the fetch).
            groups = q_heads // kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            attn = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                  v.transpose(0, 1)[None], is_causal=True)
            x = x + attn[0].transpose(0, 1).reshape(n, q_heads * head_dim) @ w_o
            hdn = F.rms_norm(x, (hidden,), norm2)
            gate, up = (hdn @ w_gate_up).chunk(2, dim=-1)
            return x + (F.silu(gate) * up) @ w_down

        def prefill(tokens: int) -> float:
            x = rand(tokens, hidden, scale=1.0)
            positions = torch.arange(tokens, device=dev)
            with torch.cuda.stream(self.stream):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(self.stream)
                for _ in range(layers):
                    x = layer(x, positions)
                end.record(self.stream)
            self.stream.synchronize()
            return start.elapsed_time(end) * 1000.0

        rows = []
        token_counts = [int(t) for t in self.args.prefill_tokens.split(",")]
        prefill(512)  # warm-up: kernels, cuBLAS handles
        for tokens in token_counts:
            blocks = tokens // block_tokens
            num_blocks = 2 * blocks + 64
            # vLLM 0.33 FlashAttention layout per layer: (blocks, kv_heads, block_size, 2 * head_dim).
            caches = [torch.empty((num_blocks, kv_heads, block_tokens, 2 * head_dim), dtype=dtype, device=dev)
                      for _ in range(layers)]
            for c in caches:
                c.normal_()
            layout = KvLayout.from_tensors(caches, num_blocks)
            pool = RemoteKvPool(layout, devices=[self.pool_dev], segment_bytes=64 * layout.slot_bytes,
                                max_bytes=(blocks // 64 + 2) * 64 * layout.slot_bytes, headroom_bytes=4 << 30,
                                copy_stream=self.stream.cuda_stream)
            pool.grow()
            keys = list(range(1, blocks + 1))
            src_blocks = list(range(0, 2 * blocks, 2))       # the prefix's blocks, scattered in the cache
            dst_blocks = list(range(1, 2 * blocks, 2))
            pool.store(keys, src_blocks, stream=self.stream.cuda_stream).wait()
            pool.load(keys, dst_blocks, stream=self.stream.cuda_stream).wait()
            for layer_cache in (caches[0], caches[-1]):
                if not torch.equal(layer_cache[src_blocks], layer_cache[dst_blocks]):
                    raise SystemExit(f"MISMATCH: prefill fetch of {tokens} tokens")
            h = self.stream.cuda_stream
            slots = [pool.table.slot_of(k) for k in keys]
            fetch_gpu = statistics.median(self.gpu_times_us(lambda i: pool.transfer.load(dst_blocks, slots, stream=h), 10))
            walls = []
            for _ in range(10):
                t0 = time.perf_counter_ns()
                pool.load(keys, dst_blocks, stream=h).wait()
                walls.append((time.perf_counter_ns() - t0) / 1000.0)
            fetch_wall = statistics.median(walls)
            compute = statistics.median([prefill(tokens) for _ in range(self.args.prefill_reps)])
            kv_bytes = blocks * layout.block_bytes
            row = {"tokens": tokens, "kv_bytes": kv_bytes, "fetch_gpu_us": fetch_gpu, "fetch_wall_us": fetch_wall,
                   "prefill_gpu_us": compute, "speedup_gpu": compute / fetch_gpu, "speedup_wall": compute / fetch_wall,
                   "fetch_gbps": kv_bytes / (fetch_gpu * 1e-6) / 1e9,
                   "fetch_method": pool.transfer.resolved_method("auto")}
            rows.append(row)
            print(f"prefix {tokens:>6} tokens ({kv_bytes / MIB:7.1f} MiB KV): fetch GPU {fetch_gpu:9.1f} us "
                  f"({row['fetch_gbps']:.0f} GB/s), wall {fetch_wall:9.1f} us; prefill {compute / 1000:9.2f} ms; "
                  f"fetch is {row['speedup_gpu']:.0f}x faster (wall {row['speedup_wall']:.0f}x)", flush=True)
            pool.close()
            del caches, pool
            torch.cuda.empty_cache()
        self.results["prefill"] = rows

    # ------------------------------------------------------------------ summary

    def summary(self) -> None:
        rows = self.results.get("transfer", [])

        def pct(size: int, n: int, direction: str, method: str) -> float | None:
            for r in rows:
                if (r["block_bytes"], r["blocks"], r["direction"], r["method"]) == (size, n, direction, method):
                    return r["pct_of_bulk"]
            return None

        checks = []
        for direction in ("load", "store"):
            for size, n, bar in ((64 * KIB, 1024, 92), (16 * KIB, 1024, 88), (64 * KIB, 64, 80)):
                for method in ("auto", "kernel"):
                    p = pct(size, n, direction, method)
                    if p is not None:
                        checks.append((f"{n} x {fmt_size(size)} {direction} ({method}) vs bulk", f"{p:.0f}%", f">= {bar}%",
                                       p >= bar))
        lat = self.results.get("latency", {})
        for direction in ("load", "store"):
            entry = lat.get(f"{direction}_peer")
            if not entry:
                continue
            g = entry["kernel_gpu_us_median"]
            checks.append((f"1 x 64K {direction} GPU time (kernel)", f"{g:.2f} us", "< 4 us", g < 4))
            e = entry["kernel_e2e_us_median"]
            checks.append((f"1 x 64K {direction} end to end (kernel)", f"{e:.2f} us", "< 10 us", e < 10))
            if "persistent_e2e_us_median" in entry:
                g = entry["persistent_gpu_us_median_globaltimer"]
                checks.append((f"1 x 64K {direction} GPU time (persistent)", f"{g:.2f} us", "< 4 us", g < 4))
                e = entry["persistent_e2e_us_median"]
                checks.append((f"1 x 64K {direction} end to end (persistent)", f"{e:.2f} us", "< 10 us", e < 10))
        for r in self.results.get("prefill", []):
            if r["tokens"] == 8192:
                checks.append(("8K-token prefix fetch vs prefill (GPU)", f"{r['speedup_gpu']:.0f}x", ">= 50x",
                               r["speedup_gpu"] >= 50))
        self.results["checks"] = [{"what": w, "measured": m, "target": t, "met": ok} for w, m, t, ok in checks]
        print("\nTargets")
        for w, m, t, ok in checks:
            print(f"  {'MET ' if ok else 'MISS'}  {w:<48} {m:>10}  (target {t})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("kv_bench.json"), help="where to write all figures (JSON)")
    parser.add_argument("--sections", default="latency,transfer,sweep,prefill",
                        help="comma-separated: latency, transfer, sweep, prefill")
    parser.add_argument("--sizes", default="16K,64K,256K,1M", help="block sizes")
    parser.add_argument("--counts", default="1,4,16,64,256,1024,4096", help="blocks per batch")
    parser.add_argument("--reps", type=int, default=40, help="timed samples per measurement")
    parser.add_argument("--latency-reps", type=int, default=2000)
    parser.add_argument("--prefill-tokens", default="1024,2048,4096,8192")
    parser.add_argument("--prefill-reps", type=int, default=3)
    parser.add_argument("--same-device", action="store_true", help="keep the pool on the engine's GPU")
    parser.add_argument("--quick", action="store_true", help="a small grid (16K,64K x 1,64,1024)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.counts, args.reps, args.prefill_tokens = "16K,64K", "1,64,1024", 20, "1024,8192"

    import torch

    if not torch.cuda.is_available():
        print("kv_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    bench = Bench(args)
    print(json.dumps(bench.results["env"]), flush=True)
    failures = 0
    for section in args.sections.split(","):
        try:
            getattr(bench, f"{section.strip()}_section")()
        except Exception:  # one broken section must not lose the others' figures
            failures += 1
            traceback.print_exc()
            bench.results.setdefault("section_errors", []).append({"section": section, "error": traceback.format_exc()})
    bench.summary()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(bench.results, indent=1))
    print(f"\nwrote {args.out}")
    return 1 if failures or bench.results.get("transfer_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
