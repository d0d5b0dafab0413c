"""`evaluate()`: one candidate against one problem, start to finish, from files or strings."""
from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from specgen.eval.evaluator import EvalWorker
from specgen.eval.loader import load_candidate, load_problem
from specgen.messages import CandidateSubmission, EvalOptions, Verdict


def evaluate(problem_src_or_path: str | os.PathLike[str],
             candidate_src_or_path: str | os.PathLike[str], device: str = "cpu",
             options: EvalOptions | None = None, work_dir: str | os.PathLike[str] | None = None
             ) -> Verdict:
    """Validate and profile (stage "full") a candidate in a fresh subprocess.

    Bad input (a missing file, a syntax error, no `ModelNew`, a `ModelNew` that cannot be called
    like `Model`) raises `UsageError`; anything the candidate does at run time is in the verdict.
    For many candidates keep an `EvalWorker` instead: it starts runners ahead of need and caches
    builds and reference timings between calls.
    """
    problem = load_problem(problem_src_or_path)
    candidate = load_candidate(candidate_src_or_path, problem)
    submission = CandidateSubmission(job_id="", candidate_id=uuid.uuid4().hex[:12],
                                     problem_name=problem.name, problem_source=problem.text,
                                     candidate_source=candidate.text, origin="inline")
    with tempfile.TemporaryDirectory(prefix="specgen-eval-") as scratch:
        worker = EvalWorker(device=device, work_dir=Path(work_dir) if work_dir else Path(scratch),
                            spare_processes=0, options=options)
        worker.start()
        try:
            return worker.run(submission, "full")
        finally:
            worker.close()
