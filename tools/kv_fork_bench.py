#!/usr/bin/env python3
"""Fork time to first token with the main job's KV pool on and off, on vLLM's CPU engine.

    .venv/bin/python tools/kv_fork_bench.py --out out/kv_fork_bench.json

Two jobs share one engine whose own KV cache holds about one job's context (`--kv-cache-gib`),
as when several jobs reason on one engine: each job has a ~4k-token prefix (its prompt and the
reasoning so far, generated greedily), and fork rounds alternate between the jobs, 4 concurrent
forks a round, each fork that prefix plus its own instruction. Each job's rounds find the other's
prefix in the cache and their own evicted. The engine is configured the way `specgen optimize
--llm vllm --kv-pool host` configures it (`optimize/kv_pool.py`), once with the pool and once
without, in one process, same prompts. Reported: fork TTFT p50/p90 per mode, the ratio, tokens
served from cache, and whether the reasoning and the forks' greedy outputs are the same tokens.
Target (issue: the remote KV cache in the running system): p50 with the pool >= 5x lower.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.engines.base import GenerationParams  # noqa: E402


def prompt_of_length(engine: Any, tokens: int, topic: str) -> list[int]:
    """A chat prompt of at most `tokens` tokens, no two blocks alike."""
    def prompt(words: int) -> list[int]:
        content = " ".join(f"{topic} step{i} of the plan" for i in range(words))
        return engine.chat_prompt_ids([{"role": "user", "content": content}])

    low, high = 1, 1
    while len(prompt(high)) < tokens:
        low, high = high, high * 2
    while low < high - 1:
        middle = (low + high) // 2
        low, high = (middle, high) if len(prompt(middle)) <= tokens else (low, middle)
    return prompt(low)


async def collect(stream: Any, start: float) -> dict[str, Any]:
    ttft, cached, tokens = None, 0, []
    async for delta in stream:
        if ttft is None:
            ttft = delta.t - start
            cached = delta.num_cached_tokens or 0
        tokens += delta.token_ids
    return {"ttft_s": ttft, "cached_tokens": cached, "tokens": tokens}


async def run_mode(args: argparse.Namespace, pool: bool) -> dict[str, Any]:
    from specgen.engines.smollm2 import smollm2_model_path
    from specgen.engines.vllm_engine import VLLMEngine
    from specgen.kv.engine_config import plan_kv_pool
    from specgen.optimize import kv_pool

    engine = VLLMEngine(smollm2_model_path(), max_model_len=args.prefix_tokens + 256,
                        kv_cache_gib=args.kv_cache_gib,
                        dtype="float32", engine_args={"enforce_eager": True, "max_num_seqs": 8})
    notice = kv_pool.attach(engine, plan_kv_pool("host" if pool else "off", ["cpu"],
                                                 pool_gib=args.pool_gib), None)
    print(notice, flush=True)
    await engine.start()
    try:
        jobs = {}
        greedy = GenerationParams(max_tokens=args.reasoning_tokens, temperature=0.0, ignore_eos=True)
        for job in ("A", "B"):
            prompt = prompt_of_length(engine, args.prefix_tokens - args.reasoning_tokens, f"job{job}")
            out = await collect(engine.reason(f"reason-{job}-{pool}", prompt, greedy), time.monotonic())
            jobs[job] = (prompt, out["tokens"])
        forks = []
        fork_params = GenerationParams(max_tokens=args.fork_tokens, temperature=0.0, ignore_eos=True)
        for round_ in range(args.rounds):
            job = "AB"[round_ % 2]
            prompt, reasoning = jobs[job]
            start = time.monotonic()
            results = await asyncio.gather(*(
                collect(engine.fork(f"fork-{job}-{round_}-{k}-{pool}", prompt, reasoning,
                                    engine.encode(f"</think>\nNow write ModelNew, variant {k}.\n"),
                                    fork_params), start)
                for k in range(args.forks)))
            for k, r in enumerate(results):
                forks.append({"round": round_, "job": job, "fork": k, **r})
        return {"notice": notice, "reasoning": {j: r for j, (_, r) in jobs.items()},
                "prefix_tokens": {j: len(p) + len(r) for j, (p, r) in jobs.items()},
                "forks": forks}
    finally:
        await engine.close()


def summary(forks: list[dict[str, Any]], skip_rounds: int) -> dict[str, float]:
    # The first round of each job finds its prefix still cached from its own reasoning.
    measured = [f for f in forks if f["round"] >= skip_rounds]
    ttft = sorted(f["ttft_s"] for f in measured)
    return {"forks": len(measured), "ttft_p50_s": statistics.median(ttft),
            "ttft_p90_s": ttft[int(0.9 * (len(ttft) - 1))],
            "cached_tokens_p50": statistics.median(f["cached_tokens"] for f in measured)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix-tokens", type=int, default=4096)
    parser.add_argument("--reasoning-tokens", type=int, default=256)
    parser.add_argument("--forks", type=int, default=4)
    parser.add_argument("--fork-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--kv-cache-gib", type=float, default=0.22,
                        help="the engine's own cache: one job's prefix and its forks, not two "
                             "jobs' (SmolLM2-135M fp32: 45 KiB per token; 0.22 GiB: ~5,100 tokens)")
    parser.add_argument("--pool-gib", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("kv_fork_bench.json"))
    args = parser.parse_args()
    runs = {}
    for pool in (False, True):
        runs["pool" if pool else "no_pool"] = asyncio.run(run_mode(args, pool))
    rows = {mode: summary(run["forks"], skip_rounds=2) for mode, run in runs.items()}
    ratio = rows["no_pool"]["ttft_p50_s"] / rows["pool"]["ttft_p50_s"]
    same_reasoning = runs["pool"]["reasoning"] == runs["no_pool"]["reasoning"]
    same_forks = ([f["tokens"] for f in runs["pool"]["forks"]]
                  == [f["tokens"] for f in runs["no_pool"]["forks"]])
    print(f"\n{'mode':8} {'forks':>5} {'TTFT p50 s':>11} {'p90 s':>8} {'cached p50':>11}")
    for mode, row in rows.items():
        print(f"{mode:8} {row['forks']:5d} {row['ttft_p50_s']:11.3f} {row['ttft_p90_s']:8.3f} "
              f"{row['cached_tokens_p50']:11.0f}")
    print(f"TTFT p50 without / with the pool: {ratio:.1f}x (target >= 5x); prefix tokens "
          f"{runs['pool']['prefix_tokens']}; same reasoning tokens: {same_reasoning}; "
          f"same fork tokens: {same_forks}")
    for run in runs.values():
        for fork in run["forks"]:
            fork["tokens"] = len(fork["tokens"])
        run["reasoning"] = {j: len(t) for j, t in run["reasoning"].items()}
    args.out.write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "args": vars(args) | {"out": str(args.out)},
        "rows": rows, "ratio_p50": ratio, "same_reasoning": same_reasoning, "same_fork_tokens": same_forks,
        "runs": runs}, indent=1))
    return 0 if ratio >= 5 and same_reasoning else 1


if __name__ == "__main__":
    sys.exit(main())
