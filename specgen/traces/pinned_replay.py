"""Replay where the optimize loop says which recorded iteration a reasoning stream replays.

`ReplayEngine` serves its k-th reasoning request the trace's iteration k. That fits loops with one
reasoning stream per iteration, but best-of-n starts n streams per iteration: they are n samples
of the same iteration, so they must all replay that iteration, not the next n ones (which would let
the baseline see later iterations' kernels early). The optimize loop calls `pin_iteration(k)` on
any engine that has it, before iteration k's streams start.
"""
from __future__ import annotations

from specgen.traces.modelled import ModelledEngine
from specgen.traces.replay import ReplayEngine


class IterationPinning:
    """Reasoning streams replay the iteration the loop pinned (mixed into a replay engine)."""

    _pinned: int | None = None

    def pin_iteration(self, index: int | None) -> None:
        """Serve every following reasoning request trace iteration `index` (None: call order);
        past the recorded iterations, `extra_iterations` applies as for call order."""
        self._pinned = index

    def iteration_for_call(self, call_index: int) -> int:
        return super().iteration_for_call(  # type: ignore[misc]
            call_index if self._pinned is None else self._pinned)


class IterationReplayEngine(IterationPinning, ReplayEngine):
    """A `ReplayEngine` whose reasoning streams replay the iteration the loop pinned."""


class IterationModelledEngine(IterationPinning, ModelledEngine):
    """A `ModelledEngine` whose reasoning streams replay the iteration the loop pinned."""
