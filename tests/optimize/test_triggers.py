from __future__ import annotations

import re

import pytest

from specgen.messages import TriggerSettings
from specgen.backend import BackendLoad
from specgen.optimize.triggers import (
    DecisionCue,
    EveryNTokens,
    InlineCodeBlock,
    LoadAware,
    MaxForksInFlight,
    MaxForksPerIteration,
    MinGap,
    StructureBoundary,
    TriggerContext,
    TriggerPolicy,
    build_trigger_policy,
)


def words(text: str) -> list[str]:
    """Split text into word-sized 'tokens' whose concatenation is the text."""
    return re.findall(r"\s*\S+|\s+", text)


def drive(policy: TriggerPolicy, text: str, *, chunk: int = 1, load: BackendLoad | None = None,
          yields: list[bool] | None = None):
    """Feed `text` through `policy` as a stream; take every fork it asks for.

    Returns (fork positions, skipped (position, reason), inline sources)."""
    tokens = words(text)
    so_far = ""
    forks: list[int] = []
    skipped: list[tuple[int, str]] = []
    inline: list[str] = []
    last_fork = 0
    for start in range(0, len(tokens), chunk):
        previous_len = len(so_far)
        so_far += "".join(tokens[start:start + chunk])
        position = min(start + chunk, len(tokens))
        ctx = TriggerContext(iteration=0, reasoning_tokens=position, text=so_far,
                             new_text_start=previous_len, previous_tokens=start,
                             tokens_since_last_fork=position - last_fork,
                             forks_this_iteration=len(forks), forks_in_flight=0,
                             recent_fork_yields=yields or [],
                             load_probe=(lambda: load) if load is not None else None)
        decision = policy.decide(ctx)
        if decision is None:
            continue
        inline += decision.inline_candidates
        if decision.fork:
            forks.append(position)
            last_fork = position
        elif decision.skipped_by:
            skipped.append((position, decision.skipped_by))
    return forks, skipped, inline


def test_every_n_tokens_fires_at_each_multiple_once() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    forks, _, _ = drive(TriggerPolicy([EveryNTokens(25)]), text)
    assert forks == [25, 50, 75, 100]
    # Deltas of several tokens crossing a multiple still fire once per crossing.
    forks, _, _ = drive(TriggerPolicy([EveryNTokens(25)]), text, chunk=7)
    assert forks == [28, 56, 77, 100]
    with pytest.raises(ValueError):
        EveryNTokens(0)


def test_structure_boundaries_outside_code_only() -> None:
    text = ("First paragraph about tiling.\n\nSecond paragraph.\n## Plan\n1. load rows\n"
            "```python\nx = 1\n\ny = 2\n```\nafter code")
    tokens = words(text)
    forks, _, _ = drive(TriggerPolicy([InlineCodeBlock(), StructureBoundary()]), text)
    fired_at = ["".join(tokens[:p]) for p in forks]
    # paragraph break, heading, numbered step; the blank line inside the code block is ignored
    assert len(forks) == 3
    assert fired_at[0].endswith("\n\nSecond")
    assert fired_at[1].endswith("## Plan")
    assert fired_at[2].endswith("1. load")


def test_decision_cues_fire_once_even_when_split_across_deltas() -> None:
    text = "I see the shapes. Let me   write the kernel now. Waiting is bad. Wait, no: the plan is simple."
    for chunk in (1, 2, 5):
        forks, _, _ = drive(TriggerPolicy([DecisionCue()]), text, chunk=chunk)
        tokens = words(text)
        cues = ["".join(tokens[:p]) for p in forks]
        # "Waiting" is not the cue "wait"; every real cue fires once.
        assert len(forks) == 3, (chunk, cues)
    assert DecisionCue(["Let me write"]).fire(TriggerContext(
        iteration=0, reasoning_tokens=3, text="ok, let me\nwrite it", new_text_start=0)).reason \
        == "let me write"
    with pytest.raises(ValueError):
        DecisionCue([])


def test_inline_code_block_becomes_a_candidate_without_a_fork() -> None:
    program = "class ModelNew(nn.Module):\n    pass\n"
    text = ("Draft:\n```python\n" + program + "```\nNot a program:\n```python\nx = 1\n```\nDone")
    policy = TriggerPolicy([InlineCodeBlock(), StructureBoundary()])
    forks, _, inline = drive(policy, text)
    assert inline == [program]
    assert forks == []   # no blank lines outside code, so nothing else fired


def test_every_program_completed_in_one_delta_is_a_candidate_in_order() -> None:
    first = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    second = first.replace("return x", "return x * 2")
    third = first.replace("return x", "return x + 1")
    # Two fenced blocks, then an unfenced draft ended by the prose after it: all in one delta.
    text = (f"Draft:\n```python\n{first}```\nBetter:\n```python\n{second}```\n\n{third}\n"
            "Wait, that adds one.\n")
    forks, _, inline = drive(TriggerPolicy([InlineCodeBlock()]), text, chunk=len(words(text)))
    assert inline == [first, second, third] and forks == []
    firing = InlineCodeBlock().fire(TriggerContext(iteration=0, reasoning_tokens=1, text=text,
                                                   new_text_start=0))
    assert firing is not None and firing.inline_candidates == [first, second, third]
    # Fed word by word, the same programs come out, one at a time.
    assert drive(TriggerPolicy([InlineCodeBlock()]), text)[2] == [first, second, third]


def test_gates_min_gap_and_max_forks() -> None:
    text = " ".join(f"w{i}" for i in range(200))
    policy = TriggerPolicy([EveryNTokens(10)], [MinGap(35), MaxForksPerIteration(3)])
    forks, skipped, _ = drive(policy, text)
    assert forks == [40, 80, 120]
    assert all(b - a >= 35 for a, b in zip(forks, forks[1:]))
    reasons = [r for _, r in skipped]
    assert any(r.startswith("min_gap") for r in reasons)
    assert any(r.startswith("max_forks") for r in reasons)


def test_max_in_flight_gate() -> None:
    gate = MaxForksInFlight(2)
    ctx = TriggerContext(iteration=0, reasoning_tokens=10, text="", new_text_start=0,
                         forks_in_flight=2)
    assert gate.veto(ctx) is not None
    ctx.forks_in_flight = 1
    assert gate.veto(ctx) is None


def test_load_aware_skips_when_queues_are_saturated() -> None:
    text = " ".join(f"w{i}" for i in range(60))
    busy = BackendLoad(validation_queued=4, validation_workers=2, profiling_workers=2)
    forks, skipped, _ = drive(TriggerPolicy([EveryNTokens(20)], [LoadAware(saturation=2.0)]),
                              text, load=busy)
    assert forks == [] and len(skipped) == 3 and "validation queue saturated" in skipped[0][1]
    profiling = BackendLoad(profiling_queued=5, validation_workers=2, profiling_workers=2)
    assert "profiling" in LoadAware().veto(TriggerContext(
        iteration=0, reasoning_tokens=1, text="", new_text_start=0,
        load_probe=lambda: profiling))
    idle = BackendLoad(validation_queued=1, validation_workers=2, profiling_workers=2)
    forks, _, _ = drive(TriggerPolicy([EveryNTokens(20)], [LoadAware()]), text, load=idle)
    assert forks == [20, 40, 60]


def test_load_aware_backs_off_after_barren_forks() -> None:
    gate = LoadAware(barren_forks=2, barren_backoff_tokens=100)
    base = dict(iteration=0, reasoning_tokens=500, text="", new_text_start=0)
    assert gate.veto(TriggerContext(**base, tokens_since_last_fork=50,
                                    recent_fork_yields=[True, False, False])) is not None
    assert gate.veto(TriggerContext(**base, tokens_since_last_fork=150,
                                    recent_fork_yields=[False, False])) is None
    assert gate.veto(TriggerContext(**base, tokens_since_last_fork=50,
                                    recent_fork_yields=[False, True])) is None


def test_load_is_probed_only_when_a_trigger_fires() -> None:
    calls = []

    def probe() -> BackendLoad:
        calls.append(1)
        return BackendLoad()

    policy = TriggerPolicy([EveryNTokens(1000)], [LoadAware()])
    ctx = TriggerContext(iteration=0, reasoning_tokens=5, text="abc", new_text_start=0,
                         load_probe=probe)
    assert policy.decide(ctx) is None and calls == []


def test_settings_build_the_policy_and_switches_remove_parts() -> None:
    settings = TriggerSettings(every_n_tokens=64, cues=["let me write"], min_gap_tokens=10)
    full = build_trigger_policy(settings, forking=True, inline_candidates=True, load_aware=True)
    assert [t.name for t in full.triggers] == ["inline_code", "every_n_tokens", "structure", "cue"]
    assert [g.name for g in full.gates] == ["min_gap", "max_forks", "max_in_flight", "load_aware"]
    no_forks = build_trigger_policy(settings, forking=False, inline_candidates=True,
                                    load_aware=False)
    assert [t.name for t in no_forks.triggers] == ["inline_code"]
    assert "load_aware" not in [g.name for g in no_forks.gates]
    text = "Let me write it.\n\n" + " ".join(f"w{i}" for i in range(100))
    forks, _, _ = drive(no_forks, text)
    assert forks == []
