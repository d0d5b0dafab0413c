"""The kernel evaluation service: isolated, cheat-proof validation and profiling of candidates.

Public API:
    evaluate(problem, candidate, device="cpu", options=EvalOptions(...)) -> Verdict
    EvalWorker(device, work_dir, spare_processes=1, options=None): start/run/cancel/close
    EvalOptions, load_problem, load_candidate

Importing this package does not import torch: only runner subprocesses do.
"""
from specgen.eval.api import evaluate
from specgen.eval.evaluator import EvalWorker
from specgen.eval.guards import FLAG_CODES, flag_code
from specgen.eval.loader import CandidateSource, ProblemSource, load_candidate, load_problem
from specgen.messages import EvalOptions

__all__ = ["evaluate", "EvalWorker", "EvalOptions", "load_problem", "load_candidate",
           "ProblemSource", "CandidateSource", "FLAG_CODES", "flag_code"]
