"""What the sandbox costs an honest candidate: the same candidates through two workers on one
device, one sandboxed and one not, interleaved round by round in one process.

    python tools/sandbox_bench.py --device cuda:0 --rounds 5 --out sandbox_bench.json

Per candidate and mode: median candidate time (the profiled figure), median speedup and the
median wall time of the whole profile stage; the table gives sandboxed / unsandboxed ratios.
Reference timings are not cached, so every run times reference and candidate in its own runner.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specgen.eval import EvalOptions, EvalWorker, sandbox  # noqa: E402
from specgen.eval.loader import load_candidate, load_problem  # noqa: E402
from specgen.messages import CandidateSubmission  # noqa: E402

PROBLEMS = ROOT / "specgen" / "data" / "problems"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("sandbox_bench.json"))
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    # Kernels this machine times for real: Triton and CUDA on a GPU, compiled C++ on a CPU (Triton
    # only interprets there).
    if cuda:
        names = ["softmax_triton", "layernorm_triton", "matmul_bias_relu_triton",
                 "fused_elementwise_cuda", "softmax_cuda"]
    else:
        names = ["softmax_cpp", "layernorm_cpp", "fused_elementwise_cpp", "softmax_torch"]
    names = [n for n in names if (PROBLEMS / "candidates" / f"{n}.py").exists()]
    work = Path(tempfile.mkdtemp(prefix="specgen-sandbox-bench-"))
    # One build cache for both workers: each extension is built once (by the sandboxed worker,
    # which runs first in round 0), not once per mode.
    base = dict(cache_ref_timing=False, timing_trials=50 if cuda else 20, warmup=3,
                cache_dir=str(work / "cache"))
    workers = {mode: EvalWorker(args.device, work / mode, spare_processes=1,
                                options=EvalOptions(sandbox=mode, **base))
               for mode in ("required", "off")}
    for worker in workers.values():
        worker.start()
    status = workers["required"].sandbox_status          # a real runner, started in the sandbox
    print(f"sandbox on this host: {status.kind} ({status.detail})")
    if status.kind != sandbox.NAMESPACES:
        print("nothing to compare: no sandbox here")
        for worker in workers.values():
            worker.close()
        return 1
    samples: dict[str, dict[str, list[dict]]] = {n: {"required": [], "off": []} for n in names}
    try:
        for round_ in range(args.rounds):
            for name in names:
                problem = load_problem(PROBLEMS / f"{name.rsplit('_', 1)[0]}.py")
                # (problem names may hold underscores; the language is the last part)
                candidate = load_candidate(PROBLEMS / "candidates" / f"{name}.py", problem)
                order = ("required", "off") if round_ % 2 == 0 else ("off", "required")
                for mode in order:
                    sub = CandidateSubmission(job_id="", candidate_id=f"{name}-{round_}-{mode}",
                                              problem_name=problem.name,
                                              problem_source=problem.text,
                                              candidate_source=candidate.text)
                    began = time.monotonic()
                    verdict = workers[mode].run(sub, "profile")
                    wall = time.monotonic() - began
                    if not verdict.correct:
                        print(f"{name} {mode}: not correct: {verdict.error} {verdict.flags}")
                        continue
                    samples[name][mode].append({"candidate_ms": verdict.candidate_ms,
                                                "speedup": verdict.speedup, "wall_s": wall,
                                                "sandbox": verdict.sandbox})
            print(f"round {round_ + 1}/{args.rounds} done")
            # after every round, so that a run cut off by a time limit still leaves its figures
            write(summarize(samples, names, show=False), args, status)
    finally:
        for worker in workers.values():
            worker.close()
    write(summarize(samples, names, show=True), args, status)
    return 0


def summarize(samples: dict, names: list[str], show: bool) -> list[dict]:
    """Per candidate: medians per mode and the sandboxed / plain ratio of the profiled time."""
    rows = []
    if show:
        print(f"\n{'candidate':26} {'ms sandboxed':>13} {'ms plain':>10} {'ratio':>7} "
              f"{'speedup s/p':>14} {'stage s/p (s)':>15}")
    for name in names:
        on, off = samples[name]["required"], samples[name]["off"]
        if not on or not off:
            continue
        med = {k: (statistics.median(s[k] for s in on), statistics.median(s[k] for s in off))
               for k in ("candidate_ms", "speedup", "wall_s")}
        ratio = med["candidate_ms"][0] / med["candidate_ms"][1]
        rows.append({"candidate": name, "runs": [len(on), len(off)], "ratio_ms": ratio,
                     **{f"{k}_sandboxed": v[0] for k, v in med.items()},
                     **{f"{k}_plain": v[1] for k, v in med.items()}})
        if show:
            print(f"{name:26} {med['candidate_ms'][0]:13.4f} {med['candidate_ms'][1]:10.4f} "
                  f"{ratio:7.3f} {med['speedup'][0]:6.2f}/{med['speedup'][1]:<6.2f} "
                  f"{med['wall_s'][0]:7.2f}/{med['wall_s'][1]:<6.2f}")
    return rows


def write(rows: list[dict], args: argparse.Namespace, status: sandbox.SandboxStatus) -> None:
    args.out.write_text(json.dumps({"device": args.device, "rounds": args.rounds,
                                    "sandbox": status.detail, "rows": rows,
                                    "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
