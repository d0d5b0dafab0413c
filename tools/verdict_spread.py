"""How far one candidate's verdicts spread on this host: the same file judged again and again, the
reference timed anew for each verdict, and how steady the host itself is meanwhile.

    python tools/verdict_spread.py tests/eval/corpus/cheat/softmax_half_near_zero.py \
        --repeats 30 --atol 1e-2 --rtol 1e-2 --out out/spread.json

The candidate's `# problem:` header (or, for the bundled library, its name) picks the problem, as
in the red-team tests; the options default to theirs (8 timed calls, 1 warm-up). `--atol/--rtol`
widen the tolerance, so that a candidate which is right only sometimes (a lowered precision) is
timed in every verdict: the figure is its speed, not its correctness.

Before the verdicts, the host's drift: a fixed loop of what the judge's runners do around a call
(seeding every generator, drawing a (16, 256) input, a softmax), its median per block of
--drift-calls calls, --drift-blocks blocks in this one process. Blocks that differ by more than a
small kernel takes say that no judge outside the candidate's process can time such a kernel
finer than that here.

Prints the drift blocks and the speedups' min, median and max, and how many exceed 1.0; writes
every verdict's times and notes to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specgen.eval import EvalOptions, EvalWorker  # noqa: E402
from specgen.eval.calls import seed_all  # noqa: E402
from tests.eval.conftest import candidate_submission  # noqa: E402


def drift(blocks: int, calls: int) -> list[float]:
    """Median ms of the judge's work around a small CPU call, per block of `calls` calls."""
    import torch

    torch.set_num_threads(1)        # as the runners do
    medians = []
    for _ in range(blocks):
        times = []
        for index in range(calls):
            began = time.perf_counter()
            seed_all(index)
            torch.softmax(torch.randn(16, 256), dim=-1)
            times.append(time.perf_counter() - began)
        medians.append(round(statistics.median(times) * 1e3, 4))
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--timing-trials", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--atol", type=float, default=None)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--drift-blocks", type=int, default=8)
    parser.add_argument("--drift-calls", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    host = drift(args.drift_blocks, args.drift_calls) if args.drift_blocks > 0 else []
    if host:
        print(f"host drift, ms per call over {args.drift_calls}-call blocks: {host}")
    submission = candidate_submission(args.candidate)
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="verdict-spread-") as work:
        options = EvalOptions(timing_trials=args.timing_trials, warmup=args.warmup,
                              atol=args.atol, rtol=args.rtol, cache_ref_timing=False,
                              cache_dir=str(Path(work) / "cache"))
        with EvalWorker(args.device, Path(work) / "worker", spare_processes=1,
                        options=options) as worker:
            for _ in range(args.repeats):
                verdict = worker.run(submission, "full")
                verdicts.append({"correct": verdict.correct, "speedup": verdict.speedup,
                                 "ref_ms": verdict.ref_ms, "candidate_ms": verdict.candidate_ms,
                                 "error": verdict.error, "notes": verdict.notes})
                print(f"correct={verdict.correct} speedup={verdict.speedup} "
                      f"ref_ms={verdict.ref_ms} candidate_ms={verdict.candidate_ms}"
                      + (f" error={verdict.error[:100]}" if verdict.error else ""), flush=True)
    speedups = [v["speedup"] for v in verdicts if v["correct"] and v["speedup"]]
    summary = {"candidate": str(args.candidate), "device": args.device, "host_drift_ms": host,
               "timed": len(speedups), "repeats": args.repeats}
    if speedups:
        summary.update(min=min(speedups), median=statistics.median(speedups), max=max(speedups),
                       above_1=sum(s > 1.0 for s in speedups))
        print(f"{len(speedups)} of {args.repeats} timed: min {summary['min']:.3f}, median "
              f"{summary['median']:.3f}, max {summary['max']:.3f}, above 1.0: {summary['above_1']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "verdicts": verdicts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
