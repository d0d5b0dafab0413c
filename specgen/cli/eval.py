"""`specgen eval PROBLEM.py CANDIDATE.py [--device cuda:0|cpu] [--trials N] [--json]`.

A failing or rejected candidate is a result, not an error: the command prints its verdict and
exits 0. Bad input (missing file, syntax error, no ModelNew, a ModelNew that cannot be called like
Model, an unknown device) is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from specgen.errors import UsageError
from specgen.messages import Verdict


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="validate and profile a candidate kernel against a problem",
        description="Validate (compile, correctness on fresh inputs, cheat guards) and profile a "
                    "KernelBench-format candidate (ModelNew) against a problem (Model, "
                    "get_inputs, get_init_inputs), isolated in a subprocess.")
    parser.add_argument("problem", help="problem file (class Model, get_inputs, get_init_inputs)")
    parser.add_argument("candidate", help="candidate file (class ModelNew)")
    parser.add_argument("--device", default=None,
                        help="cpu or cuda:N (default: cuda:0 when a GPU is visible, else cpu)")
    parser.add_argument("--trials", type=int, default=None,
                        help="correctness trials, each with fresh random inputs (default 5)")
    parser.add_argument("--timing-trials", type=int, default=None,
                        help="timed calls of each model (default 50)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="wall-clock limit in seconds for the candidate's run (default 300)")
    parser.add_argument("--scale", choices=("auto", "small", "full"), default="auto",
                        help="SPECGEN_PROBLEM_SCALE for problems that read it (auto: small on "
                             "CPU, full on a GPU)")
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.set_defaults(func=run_eval)


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def run_eval(args: argparse.Namespace) -> int:
    import msgspec

    from specgen.eval.api import evaluate
    from specgen.messages import EvalOptions

    device = args.device or _default_device()
    if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise UsageError(f"--device must be cpu or cuda:N, got {device!r}")
    if args.trials is not None and args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if args.timing_trials is not None and args.timing_trials < 2:
        raise UsageError(f"--timing-trials must be at least 2, got {args.timing_trials}")
    settings: dict[str, object] = {"problem_scale": args.scale}
    if args.trials is not None:
        settings["trials"] = args.trials
    if args.timing_trials is not None:
        settings["timing_trials"] = args.timing_trials
    if args.timeout is not None:
        settings["timeout_s"] = args.timeout
    verdict = evaluate(args.problem, args.candidate, device=device,
                       options=EvalOptions(**settings))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(msgspec.to_builtins(verdict)))
    else:
        print(format_verdict(verdict))
    sys.stdout.flush()
    return 0


def format_verdict(v: Verdict) -> str:
    """A short human-readable summary of a verdict."""
    status = "correct" if v.correct else ("rejected" if v.flags else "failed")
    timing = " (CPU timing: says nothing about GPUs)" if v.cpu_timing and v.candidate_ms else ""
    lines = [f"{status} on {v.device}{timing}"]
    if v.error:
        lines.append(f"  error: {v.error}")
    lines += [f"  flag: {flag}" for flag in v.flags]
    if v.max_abs_error is not None:
        lines.append(f"  max abs error {v.max_abs_error:.3g}, relative {v.max_rel_error or 0:.3g}")
    if v.candidate_ms is not None and v.ref_ms is not None and v.speedup is not None:
        lines.append(f"  reference {v.ref_ms:.4f} ms, candidate {v.candidate_ms:.4f} ms, "
                     f"speedup {v.speedup:.3f}x (spread {100 * (v.spread or 0):.1f}%)")
    lines += [f"  note: {note}" for note in v.notes]
    return "\n".join(lines)
