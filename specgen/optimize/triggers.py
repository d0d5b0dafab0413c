"""When to fork: pluggable trigger policies over a streaming reasoning trace.

A *trigger* looks at the reasoning text as it grows and says "here" (a trigger point): every N
tokens, at a paragraph or structure boundary, at a decision cue ("let me write", "the plan is",
"wait"), or when the reasoning itself has just finished writing a complete `ModelNew` program (that
program becomes a candidate as it is; no fork is needed). A *gate* may then veto a fork at that
point: too soon after the previous fork, too many forks this iteration or in flight, evaluation
queues saturated, or recent forks produced nothing new. A `TriggerPolicy` combines any triggers with
any gates; the first trigger that fires names the point and every gate is asked.

Triggers are edge-triggered: each fires once at a point in the text, so a vetoed point is skipped,
not retried on every later token.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specgen.messages import TriggerSettings
from specgen.backend import BackendLoad
from specgen.traces.extraction import CodeBlockScanner


@dataclass
class TriggerContext:
    """What a trigger or gate may look at, refreshed after each reasoning delta."""

    iteration: int
    reasoning_tokens: int                  # reasoning ids received so far this iteration
    text: str                              # reasoning text so far this iteration
    new_text_start: int                    # offset in `text` where the text of this delta starts
    previous_tokens: int = 0               # reasoning_tokens before this delta
    tokens_since_last_fork: int = 0        # since the last fork taken (or the iteration's start)
    forks_this_iteration: int = 0
    forks_in_flight: int = 0
    recent_fork_yields: Sequence[bool] = ()  # finished forks, oldest first: gave a new candidate?
    load_probe: Callable[[], BackendLoad] | None = None  # evaluation load, asked only when needed
    in_code_block: bool = False            # the reasoning is in the middle of a fenced block

    @functools.cached_property
    def load(self) -> BackendLoad | None:
        # Asked at most once per trigger point, and only by gates that need it: a remote
        # backend's load may cost a message.
        return self.load_probe() if self.load_probe is not None else None


@dataclass
class Firing:
    """A trigger point."""

    trigger: str                           # which trigger fired
    reason: str                            # what it saw, for events and the timeline
    # Programs found in the reasoning, in order: submit each, no fork. One delta may complete
    # several (a batched delta, an unfenced draft ended by the fence of the next).
    inline_candidates: list[str] = field(default_factory=list)


@dataclass
class Decision:
    """What the policy decided at a trigger point."""

    firing: Firing
    fork: bool                             # take a fork now
    skipped_by: str | None = None          # why the fork was vetoed, when it was
    inline_candidates: list[str] = field(default_factory=list)


class Trigger(Protocol):
    name: str

    def fire(self, ctx: TriggerContext) -> Firing | None:
        """A trigger point in the text added since the last call, or None."""


class Gate(Protocol):
    name: str

    def veto(self, ctx: TriggerContext) -> str | None:
        """Why no fork should be taken now, or None to allow it."""


# ----------------------------------------------------------------------------- triggers

class EveryNTokens:
    """Fires each time the reasoning passes a multiple of `n` tokens."""

    name = "every_n_tokens"

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ValueError(f"every-N-tokens trigger needs n > 0, got {n}")
        self.n = n

    def fire(self, ctx: TriggerContext) -> Firing | None:
        if ctx.reasoning_tokens // self.n > ctx.previous_tokens // self.n:
            return Firing(self.name, f"{(ctx.reasoning_tokens // self.n) * self.n} tokens")
        return None


_STRUCTURE = re.compile(
    r"\n[ \t]*\n"                          # a blank line: a paragraph ends
    r"|\n[ \t]*#{1,6}[ \t]"                # a markdown heading
    r"|\n[ \t]*(?:step[ \t]+\d+|\d+[.)])[ \t]"  # a numbered step
    r"|\n[ \t]*(?:---+|\*\*\*+)[ \t]*\n",  # a rule
    re.IGNORECASE,
)


class StructureBoundary:
    """Fires where a paragraph, heading, numbered step or rule begins (outside code blocks)."""

    name = "structure"

    def fire(self, ctx: TriggerContext) -> Firing | None:
        if ctx.in_code_block:
            return None
        # Look back a few characters so a boundary split across two deltas is still seen once.
        start = max(0, ctx.new_text_start - 8)
        for match in _STRUCTURE.finditer(ctx.text, start):
            if match.end() > ctx.new_text_start:
                kind = "paragraph" if match.group(0).strip(" \t\n") == "" else "structure"
                return Firing(self.name, kind)
        return None


DEFAULT_CUES: tuple[str, ...] = (
    "let me write", "let me implement", "let me code", "let me put", "let me draft",
    "i'll write", "i will write", "i'll implement", "the plan is", "so the plan",
    "my approach", "putting it together", "putting it all together", "final version",
    "here's the kernel", "the kernel will", "wait", "actually", "alternatively", "hmm",
)


class DecisionCue:
    """Fires where the reasoning says something that often precedes or revises a decision."""

    name = "cue"

    def __init__(self, cues: Sequence[str] = DEFAULT_CUES) -> None:
        if not cues:
            raise ValueError("decision-cue trigger needs at least one cue")
        words = sorted({c.lower() for c in cues}, key=len, reverse=True)
        self._longest = max(len(w) for w in words)
        self._pattern = re.compile(
            r"\b(?:" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in words) + r")\b",
            re.IGNORECASE,
        )

    def fire(self, ctx: TriggerContext) -> Firing | None:
        if ctx.in_code_block:
            return None
        # A cue may straddle the previous delta. The text's last character is never the end of a
        # match (so "wait" is not read into a "waiting" still arriving); a match ending at the
        # previous delta's last character was therefore not seen then and counts now.
        start = max(0, ctx.new_text_start - self._longest)
        last = len(ctx.text) - 1
        for match in self._pattern.finditer(ctx.text, start):
            if ctx.new_text_start <= match.end() <= last:
                return Firing(self.name, " ".join(match.group(0).lower().split()))
        return None


class InlineCodeBlock:
    """Fires when the reasoning completes a ModelNew program (a fenced block, or unfenced code
    the text after it shows has ended): a candidate, no fork."""

    name = "inline_code"

    def __init__(self) -> None:
        self.scanner = CodeBlockScanner()

    def fire(self, ctx: TriggerContext) -> Firing | None:
        found = [b for b in self.scanner.feed(ctx.text) if b.is_candidate]
        if not found:
            return None
        where = ", ".join(str(b.start) for b in found)
        return Firing(self.name, f"code block{'s' if len(found) > 1 else ''} at char {where}",
                      inline_candidates=[b.source for b in found])

    def finish(self, text: str) -> list[str]:
        """Candidates only the end of the reasoning completes: a block closed by its very last
        line, an unfenced draft that nothing has followed."""
        return [b.source for b in self.scanner.finish(text) if b.is_candidate]

    @property
    def in_code_block(self) -> bool:
        return self.scanner.in_code_block


# ----------------------------------------------------------------------------- gates

class MinGap:
    """No fork within `tokens` of the previous one (or of the iteration's start)."""

    name = "min_gap"

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def veto(self, ctx: TriggerContext) -> str | None:
        if ctx.tokens_since_last_fork < self.tokens:
            return f"only {ctx.tokens_since_last_fork} tokens since the last fork (< {self.tokens})"
        return None


class MaxForksPerIteration:
    name = "max_forks"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def veto(self, ctx: TriggerContext) -> str | None:
        if ctx.forks_this_iteration >= self.limit:
            return f"{ctx.forks_this_iteration} forks this iteration already (limit {self.limit})"
        return None


class MaxForksInFlight:
    name = "max_in_flight"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def veto(self, ctx: TriggerContext) -> str | None:
        if ctx.forks_in_flight >= self.limit:
            return f"{ctx.forks_in_flight} forks still generating (limit {self.limit})"
        return None


class LoadAware:
    """Skip forks the evaluation side could not absorb, or that would likely repeat the last ones.

    Saturated: a pool's queue holds at least `saturation` requests per worker of that pool, so a new
    candidate would only wait. Barren: the last `barren_forks` forks all produced nothing new
    (duplicates or no code); forking again is pointless until the reasoning has moved on by
    `barren_backoff_tokens`.
    """

    name = "load_aware"

    def __init__(self, saturation: float = 2.0, barren_forks: int = 2,
                 barren_backoff_tokens: int = 768) -> None:
        self.saturation = saturation
        self.barren_forks = barren_forks
        self.barren_backoff_tokens = barren_backoff_tokens

    def veto(self, ctx: TriggerContext) -> str | None:
        load = ctx.load
        if load is not None:
            if load.validation_workers and (
                load.validation_queued >= self.saturation * load.validation_workers
            ):
                return (f"validation queue saturated ({load.validation_queued} queued for "
                        f"{load.validation_workers} workers)")
            if load.profiling_workers and (
                load.profiling_queued >= self.saturation * load.profiling_workers
            ):
                return (f"profiling queue saturated ({load.profiling_queued} queued for "
                        f"{load.profiling_workers} workers)")
        recent = list(ctx.recent_fork_yields)[-self.barren_forks:]
        if (
            self.barren_forks > 0
            and len(recent) == self.barren_forks
            and not any(recent)
            and ctx.tokens_since_last_fork < self.barren_backoff_tokens
        ):
            return (f"last {self.barren_forks} forks gave nothing new; waiting for "
                    f"{self.barren_backoff_tokens} more reasoning tokens")
        return None


# ----------------------------------------------------------------------------- policy

class TriggerPolicy:
    """Any triggers, any gates. Call `decide` after each reasoning delta."""

    def __init__(self, triggers: Sequence[Trigger], gates: Sequence[Gate] = ()) -> None:
        self.triggers = list(triggers)
        self.gates = list(gates)

    @property
    def in_code_block(self) -> bool:
        return any(getattr(t, "in_code_block", False) for t in self.triggers)

    def decide(self, ctx: TriggerContext) -> Decision | None:
        """The decision at this point, or None when no trigger fired."""
        ctx.in_code_block = self.in_code_block
        inline: list[str] = []
        fork_firing: Firing | None = None
        for trigger in self.triggers:
            firing = trigger.fire(ctx)
            if firing is None:
                continue
            if firing.inline_candidates:
                inline.extend(firing.inline_candidates)
            elif fork_firing is None:
                fork_firing = firing
        if fork_firing is None:
            if inline:
                return Decision(Firing(InlineCodeBlock.name, "code block in reasoning"),
                                fork=False, inline_candidates=inline)
            return None
        for gate in self.gates:
            reason = gate.veto(ctx)
            if reason is not None:
                return Decision(fork_firing, fork=False, skipped_by=f"{gate.name}: {reason}",
                                inline_candidates=inline)
        return Decision(fork_firing, fork=True, inline_candidates=inline)

    def finish(self, text: str) -> list[str]:
        """Inline candidates only the end of the reasoning completes, once it has ended (its
        think-end tag came, or the stream stopped)."""
        found: list[str] = []
        for trigger in self.triggers:
            if isinstance(trigger, InlineCodeBlock):
                found.extend(trigger.finish(text))
        return found


def build_trigger_policy(settings: TriggerSettings, *, forking: bool, inline_candidates: bool,
                         load_aware: bool) -> TriggerPolicy:
    """The policy a job's settings describe; forking off leaves only inline candidates (if on)."""
    triggers: list[Trigger] = []
    if inline_candidates:
        # First, so the code block scanner knows whether later triggers sit inside code.
        triggers.append(InlineCodeBlock())
    if forking:
        if settings.every_n_tokens:
            triggers.append(EveryNTokens(settings.every_n_tokens))
        if settings.structure_boundaries:
            triggers.append(StructureBoundary())
        if settings.cues:
            triggers.append(DecisionCue(settings.cues))
    gates: list[Gate] = [
        MinGap(settings.min_gap_tokens),
        MaxForksPerIteration(settings.max_forks_per_iteration),
    ]
    if settings.max_forks_in_flight:
        gates.append(MaxForksInFlight(settings.max_forks_in_flight))
    if load_aware:
        gates.append(LoadAware(settings.queue_saturation, settings.barren_forks,
                               settings.barren_backoff_tokens))
    return TriggerPolicy(triggers, gates)
