#!/usr/bin/env python3
"""Record a reasoning trace from a live engine, for replay by `specgen optimize --llm replay`.

    # vLLM in this process (a model directory; a reasoning model for real traces)
    .venv/bin/python tools/record_trace.py --problem PROBLEM.py --out trace.json \\
        --engine vllm --model /models/QwQ-32B
    # any OpenAI-compatible server (tokenizer files needed locally for exact token ids)
    .venv/bin/python tools/record_trace.py --problem PROBLEM.py --out trace.json \\
        --engine openai --base-url http://127.0.0.1:8000/v1 --model qwq --tokenizer /models/QwQ-32B

The first iteration's chat is the optimize loop's own prompt for the problem; each fork's prompt is
the reasoning so far plus the loop's fork suffix, forked while the reasoning runs. Later
iterations feed the previous answer back (no evaluation happens while recording). The trace's
metadata says it was recorded (`hand_written: false`), by which model, with which tokenizer.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.engines.base import Engine, EngineError, GenerationParams  # noqa: E402
from specgen.traces.recorder import RecordingPlan, record_trace  # noqa: E402


def build_engine(args: argparse.Namespace) -> Engine:
    if args.engine == "vllm":
        from specgen.engines.vllm_engine import VLLMEngine

        return VLLMEngine(args.model, tokenizer=args.tokenizer, max_model_len=args.max_model_len,
                          kv_cache_gib=args.kv_cache_gib)
    from specgen.engines.openai_http import OpenAICompatEngine

    if not args.base_url or not args.tokenizer:
        raise SystemExit("--engine openai needs --base-url and --tokenizer")
    return OpenAICompatEngine(args.base_url, args.model, tokenizer=args.tokenizer)


async def run(args: argparse.Namespace) -> int:
    from specgen.optimize.fork_prompt import FORK_INSTRUCTION
    from specgen.optimize.prompts import chat

    problem_source = args.problem.read_text()
    engine = build_engine(args)
    plan = RecordingPlan(
        fork_every=args.fork_every,
        fork_positions=tuple(args.fork_at),
        suffix_text="\n" + engine.think_end + FORK_INSTRUCTION,
        reasoning=GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed),
        fork=GenerationParams(max_tokens=args.fork_max_tokens, temperature=0.0, stop=["\n```"]),
        iterations=args.iterations,
    )
    await engine.start()
    try:
        trace = await record_trace(
            engine, chat(problem_source, [], None), problem=args.problem.stem, model=args.model_label or args.model,
            plan=plan, notes=args.notes,
        )
    finally:
        await engine.close()
    path = trace.save(args.out)
    for index, iteration in enumerate(trace.iterations):
        print(f"iteration {index}: {iteration.reasoning.num_tokens} reasoning tokens in "
              f"{iteration.reasoning.duration_s:.1f} s, {len(iteration.forks)} forks, "
              f"final answer {iteration.final.num_tokens} tokens")
    print(f"trace written to {path}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", type=Path, required=True, help="a KernelBench-format problem file")
    parser.add_argument("--out", type=Path, required=True, help="the trace file to write")
    parser.add_argument("--engine", choices=("vllm", "openai"), default="vllm")
    parser.add_argument("--model", required=True, help="model directory (vllm) or served model name (openai)")
    parser.add_argument("--model-label", default=None, help="the model's name for the trace metadata")
    parser.add_argument("--tokenizer", default=None, help="local tokenizer directory (default: the model's)")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--fork-every", type=int, default=512, help="fork every N reasoning tokens (0: off)")
    parser.add_argument("--fork-at", type=int, nargs="*", default=[], help="extra fork positions (token counts)")
    parser.add_argument("--max-tokens", type=int, default=16384, help="reasoning + answer tokens per iteration")
    parser.add_argument("--fork-max-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-cache-gib", type=float, default=None)
    parser.add_argument("--notes", default="", help="free text for the trace metadata")
    args = parser.parse_args()
    if not args.problem.is_file():
        print(f"error: problem file {args.problem} does not exist", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return asyncio.run(run(args))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
