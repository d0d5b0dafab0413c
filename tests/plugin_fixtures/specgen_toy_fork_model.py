"""A toy fork model: one module and one registration, loaded as a plug-in (`SPECGEN_PLUGINS` names
`specgen_toy_fork_model:register`, the function form).

A fork writes the turn's final answer with one marked line added, so the job's candidates show
which fork model wrote them (an oracle that reads the future: a test fixture, never a measure)."""
from __future__ import annotations

from specgen.optimize.fork_models import ReplayWriter, register_fork_model

NAME = "toy-fork"
MARK = "TOY_FORK_MODEL = True"


class ToyForkWriter(ReplayWriter):
    name = NAME

    def program_at(self, reasoning_so_far: str, reasoning: str, final: str | None) -> str | None:
        return f"{final.rstrip()}\n\n{MARK}\n" if final else None


def register() -> None:
    register_fork_model(NAME, lambda engine: ToyForkWriter(), summary="the final answer, marked (a test's plug-in)")
