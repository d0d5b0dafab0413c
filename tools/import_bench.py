#!/usr/bin/env python3
"""Time `specgen trace import` on a long reasoning (default 20k tokens), per input kind.

    .venv/bin/python tools/import_bench.py                 # 20k tokens, 7 runs per kind
    .venv/bin/python tools/import_bench.py --tokens 40000 --runs 11

Generates the inputs in a temporary directory (reasoning text mixing prose and code, about 3.6
characters a token): a chat-completion response (rate timing), a streamed chunk log with an
arrival time per delta (recorded timing; a delta of one or two tokens, as servers stream), and
plain <think> text. Each run imports into a fresh directory, writing and validating the trace;
prints the median and the spread per kind.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.traces.format import Trace  # noqa: E402
from specgen.traces.importing import CHARS_PER_TOKEN, import_traces  # noqa: E402

SENTENCES = [
    "Let me think about how the data is laid out in memory for this operation.",
    "Each row is independent, so one program instance per row could work, but the row may be long.",
    "Wait, the input might not be contiguous, so I should check the strides first.",
    "Memory bandwidth is the limit here, not compute, so fewer passes over the data matter most.",
    "Hmm, the reduction needs a second pass, unless the whole row fits in one block of 4096.",
    "So the kernel reads x once, keeps the running max and sum in registers, and writes once.",
]
CODE = '''```python
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * n_cols + offs, num / tl.sum(num, axis=0), mask=offs < n_cols)
```
'''


def reasoning_text(tokens: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    target = int(tokens * CHARS_PER_TOKEN)
    while size < target:
        part = CODE if rng.random() < 0.08 else rng.choice(SENTENCES) + (" " if rng.random() < 0.8 else "\n")
        parts.append(part)
        size += len(part)
    return "".join(parts)[:target]


def write_inputs(directory: Path, reasoning: str) -> dict[str, tuple[Path, dict]]:
    answer = CODE.replace("softmax_kernel", "final_kernel")
    messages = [{"role": "user", "content": "Make softmax fast."}]
    completion = directory / "completion.json"
    completion.write_text(json.dumps({
        "problem": "softmax", "messages": messages,
        "response": {"model": "bench", "choices": [{"message": {"reasoning_content": reasoning, "content": answer}}]},
    }))
    stream = directory / "stream.jsonl"
    rng = random.Random(1)
    lines = [json.dumps({"t": 0.0, "problem": "softmax", "messages": messages})]
    t, position = 0.4, 0
    for key, text in (("reasoning_content", reasoning), ("content", answer)):
        position = 0
        while position < len(text):
            step = rng.randint(3, 8)                 # one or two tokens a delta
            delta = text[position:position + step]
            position += step
            t += 0.02
            lines.append(json.dumps({"t": round(t, 4), "id": "chatcmpl-bench", "model": "bench",
                                     "choices": [{"index": 0, "delta": {key: delta}}]}))
    stream.write_text("\n".join(lines) + "\n")
    plain = directory / "plain.txt"
    plain.write_text("<think>\n" + reasoning + "</think>\n\n" + answer)
    return {
        "completion (rate timing)": (completion, {"tokens_per_s": 40.0}),
        "chunk log (recorded timing)": (stream, {}),
        "plain text (rate timing)": (plain, {"tokens_per_s": 40.0, "problem": "softmax"}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000, help="reasoning length in tokens")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="import-bench-"))
    try:
        reasoning = reasoning_text(args.tokens)
        inputs = write_inputs(work, reasoning)
        print(f"reasoning: {len(reasoning)} characters; {args.runs} runs per kind")
        for label, (path, options) in inputs.items():
            times = []
            tokens = 0
            for run in range(args.runs):
                out = work / f"out-{run}"
                start = time.perf_counter()
                [trace_path] = import_traces([path], out, **options)
                times.append(time.perf_counter() - start)
                if run == 0:
                    tokens = Trace.load(trace_path).iterations[0].reasoning.num_tokens
                shutil.rmtree(out)
            print(f"{label:30s} {path.stat().st_size / 1e6:6.2f} MB in, {tokens} reasoning tokens: "
                  f"median {statistics.median(times) * 1000:7.1f} ms "
                  f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
