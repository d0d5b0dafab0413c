import pytest

from specgen.messages import JobResult, Verdict
from specgen.runtime.reasoner import as_job_result, resolve_entry


def test_resolve_entry() -> None:
    fn = resolve_entry("specgen.runtime.jobs:evaluate_candidates")
    assert fn.__name__ == "evaluate_candidates"
    with pytest.raises(ValueError, match="module:function"):
        resolve_entry("specgen.runtime.jobs")
    with pytest.raises(ModuleNotFoundError):
        resolve_entry("no.such:thing")
    with pytest.raises(AttributeError):
        resolve_entry("specgen.runtime.jobs:missing")


def test_results_of_any_shape_become_job_results() -> None:
    r = as_job_result("J", JobResult(job_id="", status="failed", error="x"))
    assert r.job_id == "J" and r.status == "failed"
    r = as_job_result("J", Verdict(correct=True))
    assert r.status == "succeeded" and r.summary["correct"] is True
    assert as_job_result("J", 3).summary == {"value": 3}
    assert as_job_result("J", None).summary == {}
