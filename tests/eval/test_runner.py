"""A candidate runner's role before the candidate's code is loaded: the problem alone, its Model
timed there (what the judge measures the candidate against), then no other problem."""
from __future__ import annotations

from specgen.eval.runner import CandidateRole
from specgen.messages import LoadCandidate, LoadProblem, Trial
from tests.eval.conftest import CORPUS


def load(name: str = "softmax", init_seed: int = 7) -> LoadProblem:
    return LoadProblem(problem_source=(CORPUS / "problems" / f"{name}.py").read_text(),
                       problem_name=name, scale="small", init_seed=init_seed)


def test_the_problem_loads_alone_and_its_model_and_calls_of_nothing_run_there() -> None:
    role = CandidateRole("cpu")
    assert role.load_problem(load()).error is None
    marks: list[str] = []
    done = role.trial(Trial(index=1, seed=11, digest_seed=12, reference=True), marks.append)
    assert done.error is None and marks == ["made", "called"]
    assert [o.shape for o in done.outputs] == [[16, 256]]
    # a call of nothing digests zeros shaped like the reference's last outputs
    nothing = role.trial(Trial(index=2, seed=13, digest_seed=14, null=True, reference=True))
    assert nothing.error is None and nothing.digests == [0.0]
    assert role.model is None                      # no candidate was loaded
    again = role.trial(Trial(index=3, seed=11, digest_seed=12, reference=True))
    assert again.digests == done.digests           # the same seeds, the same call


def test_no_second_problem_and_no_candidate_of_another_problem() -> None:
    role = CandidateRole("cpu")
    assert role.load_problem(load()).error is None
    assert "already" in role.load_problem(load()).error
    other = LoadCandidate(problem=load(init_seed=8), candidate_source="", cache_dir="")
    assert "another problem" in role.load(other).error


def test_a_runner_not_timed_first_builds_the_model_only_when_a_reference_call_comes() -> None:
    """A validation loads the problem with the candidate (LoadCandidate): no Model is built for
    it unless the judge asks for a reference call."""
    role = CandidateRole("cpu")
    assert role.load_problem(load(), model=False).error is None
    assert role.reference_model is None
    done = role.trial(Trial(index=1, seed=11, digest_seed=12, reference=True))
    assert done.error is None and role.reference_model is not None
