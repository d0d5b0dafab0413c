"""What the judge makes of a candidate's reply and of the reference runner's reading
(eval/output_checks.py), and how far a right output's digest may be from the reference's."""
from __future__ import annotations

import pytest
import torch

from specgen.eval.compare import digest_bound, l2_norm
from specgen.eval.findings import Findings, Stop
from specgen.eval.output_checks import OutputChecks
from specgen.messages import Called, EvalOptions, OutputMeta, ReadDone


def test_the_digest_bound_is_relative_where_the_values_are_below_the_absolute_tolerance() -> None:
    tiny = torch.full((4096,), 2.5e-6, dtype=torch.float64)
    # the absolute tolerance's norm alone would allow an error of 6e-3; the relative bound allows
    # 6 x 10 rtol |r|, about 1e-6, which no constant of another value meets
    assert digest_bound(tiny, 0.0, 0.0) == pytest.approx(6 * 10 * 1e-4 * l2_norm(tiny), rel=1e-4)
    big = torch.ones(4096, dtype=torch.float64)
    assert digest_bound(big, 0.5, 10.0) > digest_bound(big, 0.0, 10.0)


def test_integer_outputs_must_match_exactly() -> None:
    assert digest_bound(torch.arange(10), 0.0, 45.0) < 1e-6


class _Exchange:
    arena = (0, 4096)


def checks() -> OutputChecks:
    return OutputChecks(Findings("cpu", cuda=False), _Exchange(), None, EvalOptions())  # type: ignore[arg-type]


def tensor(shape: list[int], dtype: str = "float32", plain: bool = True) -> OutputMeta:
    return OutputMeta(kind="tensor", shape=shape, dtype=dtype, plain=plain)


@pytest.mark.parametrize("outputs, why", [
    ([tensor([2**62, 2**62])], "shape"),
    ([tensor([4096, 4096])], "beyond the region"),
    ([tensor([-1, 4])], "shape"),
    ([tensor([4], dtype="object")], "dtype"),
    ([tensor([4])] * 65, "more than"),
])
def test_a_reply_that_places_its_outputs_beyond_the_arena_fails_the_candidate(outputs, why) -> None:
    """Sizes a runner claims are bounded before anything is read or sized after them."""
    made = checks()
    with pytest.raises(Stop):
        made.called(Called(index=1, outputs=outputs), "trial 0")
    assert "cannot be read" in made.findings.verdict.error and why in made.findings.verdict.error


def test_a_reply_with_outputs_in_the_arena_gives_their_slots_and_its_flags() -> None:
    made = checks()
    slots = made.called(Called(index=1, outputs=[tensor([4, 4], plain=False)], launches=2), "t")
    assert [s.shape for s in slots] == [[4, 4]] and made.launches == 2
    assert "tensor-subclass" in made.findings.flags


def test_the_references_reading_decides() -> None:
    done = Called(index=1, outputs=[tensor([4])])
    made = checks()
    assert made.judged(done, ReadDone(index=1, ok=True, outputs=[tensor([4])]), "t")
    changed = checks()
    with pytest.raises(Stop):
        changed.judged(done, ReadDone(index=1, changed=True, outputs=[tensor([4])]), "t")
    assert "changed while the judge read them" in changed.findings.verdict.error
    mutated = checks()
    mutated.judged(done, ReadDone(index=1, ok=True, inputs_changed=True, outputs=[tensor([4])]), "t")
    assert "mutated-inputs" in mutated.findings.flags
    problem = checks()
    with pytest.raises(Stop):
        problem.judged(done, ReadDone(index=1, problem_error="Model raised"), "t")
    assert problem.findings.verdict.code == "reference"
