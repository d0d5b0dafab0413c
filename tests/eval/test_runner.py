"""The runners' roles in one process: the reference runner's arena (inputs handed over, outputs read
and judged by it), and a candidate's runner before the candidate's code is loaded (the problem
alone, its Model and calls of nothing timed there, then no other problem)."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from specgen.eval.arena import pack
from specgen.eval.runner import CandidateRole, ReferenceRole
from specgen.messages import (Call, Hand, LoadCandidate, LoadProblem, Look, MakeArena, MapArena,
                              Read, Slot)
from tests.eval.conftest import CORPUS


def load(name: str = "softmax", init_seed: int = 7) -> LoadProblem:
    return LoadProblem(problem_source=(CORPUS / "problems" / f"{name}.py").read_text(),
                       problem_name=name, scale="small", init_seed=init_seed)


def pair(name: str = "softmax") -> tuple[ReferenceRole, CandidateRole]:
    """A reference runner with its arena, and a candidate's runner (the problem alone) mapping it."""
    reference, candidate = ReferenceRole("cpu"), CandidateRole("cpu")
    loaded = reference.load(load(name))
    assert loaded.error is None and loaded.output_bytes > 0
    made, fds = reference.make_arena(MakeArena(input_bytes=loaded.input_bytes,
                                               output_bytes=loaded.output_bytes))
    assert candidate.load_problem(load(name)).error is None
    assert candidate.map_arena(MapArena(input_bytes=made.input_bytes,
                                        output_bytes=made.output_bytes),
                               [os.dup(fd) for fd in fds]).error is None
    return reference, candidate


def judged(reference: ReferenceRole, index: int, slots: list[Slot], full: bool = False):
    """The reference runner's look at the outputs, then its reading."""
    looked = reference.look(Look(index=index, digest_seed=77, outputs=slots))
    if looked.error:
        return looked
    return reference.read(Read(index=index, full=full))


def test_the_problem_loads_alone_and_its_model_and_calls_of_nothing_run_there() -> None:
    reference, role = pair()
    handed, _ = reference.hand(Hand(index=1, seed=11))
    done = role.call(Call(index=1, args=handed.args, reference=True))
    assert done.error is None and role.model is None          # no candidate was loaded
    slots = pack([([16, 256], "float32")])[0]
    assert judged(reference, 1, slots, full=True).ok
    # a call of nothing copies zeros shaped like the reference's last outputs
    handed, _ = reference.hand(Hand(index=2, seed=13))
    assert role.call(Call(index=2, args=handed.args, null=True)).error is None
    assert not torch.any(role.arena.outputs.view(slots[0]))


def test_no_second_problem_and_no_candidate_of_another_problem() -> None:
    role = CandidateRole("cpu")
    assert role.load_problem(load()).error is None
    assert "already" in role.load_problem(load()).error
    other = LoadCandidate(problem=load(init_seed=8), candidate_source="", cache_dir="")
    assert "another problem" in role.load(other).error


def test_a_runner_not_timed_first_builds_the_model_only_when_a_reference_call_comes() -> None:
    """A validation loads the problem with the candidate (LoadCandidate): no Model is built for
    it unless the judge asks for a reference call."""
    reference, _ = pair()
    role = CandidateRole("cpu")
    assert role.load_problem(load(), model=False).error is None
    made, fds = reference.make_arena(MakeArena(input_bytes=0, output_bytes=0))
    role.map_arena(MapArena(input_bytes=made.input_bytes, output_bytes=made.output_bytes),
                   [os.dup(fd) for fd in fds])
    assert role.reference_model is None
    handed, _ = reference.hand(Hand(index=1, seed=11))
    assert role.call(Call(index=1, args=handed.args, reference=True)).error is None
    assert role.reference_model is not None


# -- what the reference runner reads, whatever the candidate's process says

def read_after(reference: ReferenceRole, write, full: bool = False, index: int = 1):
    """Hand inputs over, let `write(inputs, outputs)` play the candidate's call on the arena's
    views, and read."""
    handed, _ = reference.hand(Hand(index=index, seed=100 + index))
    slots = pack([([16, 256], "float32")])[0]
    inputs = reference.arena.inputs.view(handed.args[0].slot)
    write(inputs, reference.arena.outputs.view(slots[0]))
    return judged(reference, index, slots, full)


def test_the_right_output_passes_and_a_constant_of_the_right_size_does_not() -> None:
    """A constant below the absolute tolerance passes the element rule's atol alone (a softmax's
    values are tiny at large sizes); the digest's relative bound refuses it."""
    reference, _ = pair()
    assert read_after(reference, lambda x, out: out.copy_(torch.softmax(x, dim=-1))).ok
    mean = 1.0 / 256
    done = read_after(reference, lambda x, out: out.fill_(mean), index=2)
    assert not done.ok and "digest" in done.reason
    done = read_after(reference, lambda x, out: out.fill_(mean), full=True, index=3)
    assert not done.ok and done.reason


def test_a_call_that_changes_its_inputs_is_seen_by_the_reference() -> None:
    reference, _ = pair()

    def in_place(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(torch.softmax(x, dim=-1))
        x.zero_()

    done = read_after(reference, in_place)
    assert done.inputs_changed and not done.reference_mutates


def test_outputs_still_being_written_while_read_are_seen() -> None:
    """Work that goes on after the call returned: what is read is not the right output, or the
    outputs read first and last differ."""
    reference, _ = pair()
    stop, started = threading.Event(), threading.Event()

    def keep_writing(x: torch.Tensor, out: torch.Tensor) -> None:
        right = torch.softmax(x, dim=-1)

        def spin() -> None:
            value = 0.0
            while not stop.is_set():
                value += 1.0
                out[0, 0] = value
                started.set()
        out.copy_(right)
        threading.Thread(target=spin, daemon=True).start()
        started.wait(10)                # still writing when the reading begins

    try:
        done = read_after(reference, keep_writing)
    finally:
        stop.set()
    assert not done.ok and (done.changed or done.reason)


@pytest.mark.parametrize("slots", [
    [Slot(offset=0, shape=[2**40, 2**20], dtype="float32")],            # far beyond the region
    [Slot(offset=-512, shape=[4], dtype="float32")],
    [Slot(offset=0, shape=[4], dtype="object")],
    [Slot(offset=0, shape=[1] * 9, dtype="float32")],
    [Slot(offset=0, shape=[4], dtype="float32")] * 65,
])
def test_outputs_said_to_lie_where_nothing_can_be_read_are_refused(slots: list[Slot]) -> None:
    reference, _ = pair()
    reference.hand(Hand(index=1, seed=1))
    looked = reference.look(Look(index=1, digest_seed=1, outputs=slots))
    assert "cannot be read" in looked.error
    assert reference.read(Read(index=1)).problem_error


def test_inputs_of_a_larger_shape_grow_the_arena_and_say_its_new_sizes() -> None:
    """A probe's shape may need more than the problem's own (a size below 4 grows by one): the
    reference runner makes new regions, says their sizes as made and sends their descriptors,
    which the candidate's runner maps in place of the old."""
    reference, candidate = pair()
    before = (reference.arena.inputs.size, reference.arena.outputs.size)
    handed, fds = reference.hand(Hand(index=1, seed=3, shape={"batch_size": 64}, early=True))
    assert handed.grown and len(fds) == 2
    assert handed.arena == [reference.arena.inputs.size, reference.arena.outputs.size]
    assert reference.arena.inputs.size > before[0] and reference.arena.outputs.size > before[1]
    assert candidate.map_arena(MapArena(input_bytes=handed.arena[0], output_bytes=handed.arena[1]),
                               [os.dup(fd) for fd in fds]).error is None
    assert candidate.call(Call(index=1, args=handed.args, reference=True)).error is None
    slots = pack([([64, 256], "float32")])[0]
    assert judged(reference, 1, slots, full=True).ok
