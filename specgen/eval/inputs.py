"""The judge's seeds: every call's inputs and digest signs, and which timed calls are compared in
full, are drawn here, fresh per call and unpredictable (EvalOptions.seed pins them, for tests).

The reference runner makes a call's inputs from its seed (the problem's own `get_inputs()` after
seeding) and hands them over as the call's window opens (eval/arena.py): the candidate's process
never sees a seed, so nothing computed ahead of its call can be right. A digest's signs are drawn
after the call and go to the reference runner only.
"""
from __future__ import annotations

import random
import secrets
from typing import Sequence


class Inputs:
    """The seeds of one evaluation."""

    def __init__(self, seed: int | None) -> None:
        self.rng = random.Random(seed) if seed is not None else random.SystemRandom()

    def seed(self) -> int:
        return self.rng.randrange(1, 2**62)

    def pick(self, population: Sequence[int], count: int) -> set[int]:
        """`count` of `population`, drawn unpredictably (the timed calls compared in full)."""
        return set(self.rng.sample(population, count))


def other_size(value: int) -> int:
    """A different size of the same kind: 3/4 of it (kept even), or one more when small."""
    if value < 4:
        return value + 1
    other = (value * 3) // 4
    if value % 2 == 0 and other % 2:
        other += 1
    return other if other != value else value + 2


def new_init_seed() -> int:
    """The seed both models of a problem are built after (LoadProblem.init_seed)."""
    return secrets.randbelow(2**31 - 2) + 1
