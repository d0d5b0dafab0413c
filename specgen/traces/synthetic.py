"""Synthetic reasoning traces calibrated on measured distributions, for benchmarks and tests that
need many problems (`specgen bench --generate N`).

Premises: the public QwQ-32B traces on KernelBench levels 1-2 (about 400 responses whose answer
holds `ModelNew`, 120 correct), quantiles p10 / p50 / p90 unless a share. A complete draft is a
code block or a contiguous span of code with `class ModelNew`, `def forward(` and the program's
kernels; positions are shares of the reasoning, where the draft ends.

| what | measured | here |
| --- | --- | --- |
| reasoning tokens | 2.9k / 9.6k / 16.5k | piecewise-linear inverse CDF through those, 1.0k at p0 and 24k at p100 (extrapolated) |
| complete drafts per trace | 0 / 1 / 2, mean 1.27, none in 15% | P(0, 1, 2, 3) = 0.15, 0.50, 0.28, 0.07 (mean 1.27) |
| where the first complete draft ends | 34% / 86% / 100%; before 25% / 50% / 75% of the reasoning in 6% / 13% / 27% of traces | inverse CDF through all of those (p0 at 5% extrapolated) |
| where every complete draft ends | 46% / 90% / 99% | not set: later drafts are drawn from the first draft's distribution, no earlier than the first (an assumption; it gives about 47% / 88% / 99%) |
| drafts written without a fence | final kernel drafted in 21 of 96 turns counting fenced blocks, 39 counting unfenced code; 41 of 96 turns without a fenced candidate | each complete draft fenced with probability 21/39 (then about 45% of turns have no fenced candidate); code fragments alike (an assumption) |
| incomplete code fragments | median 5 per trace, 84% of traces have some | none in 16%, else 2-10 uniform (median 5); 30% of them a program cut off mid-way (an assumption) |
| final kernel first named | 12% / 33% / 63% | inverse CDF through those |
| final answers correct | 29-30% | 30% |
| correct traces drafting the final kernel before the answer | 58%, at 71% / 92% / 97% | 58%: the last of the trace's drafts, ending at an inverse CDF through those; its earlier drafts end before it |
| last draft before 50% / 75% / 90% is the final kernel | 2% / 6% / 16% of traces | not set: about 0% / 3% / 8%; incorrect traces never draft their answer here, an unmeasured choice that can only understate harvesting |

Drafts and answers are real programs from the bundled candidate library (`CandidateLibrary`): a
correct answer is an honest or a slow (correct, not faster) candidate; an incorrect one is a wrong
or a cheating candidate; drafts that are not the final kernel are other candidates of the problem
(another design). Nothing here is tuned to what makes any mode win: every number above is a
measured premise or marked as an assumption or extrapolation, and `seed` makes runs repeat. The
prose between the code is filler drawn from a fixed vocabulary of planning sentences; a mode can
only use code it finds (or a fork model writes), never the prose.
"""
from __future__ import annotations

import bisect
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from specgen.traces.bundled import PROBLEMS_DIR, bundled_problems
from specgen.traces.extraction import defines_model_new, find_drafts, kernel_names
from specgen.traces.format import Trace, TraceBuilder

GENERATOR_VERSION = 2
# Characters per token of the trace's piece tokenizer on this kind of text (measured: 3.0; the
# public traces' 3.6 is a real BPE tokenizer's): text is sized so that the token count, and so the
# time at a decode rate in model tokens, is the sampled one.
CHARS_PER_TOKEN = 3.0

REASONING_TOKENS = [(0.0, 1000.0), (0.1, 2900.0), (0.5, 9600.0), (0.9, 16500.0), (1.0, 24000.0)]
# First complete draft: p10 / p50 / p90 (34%, 86%, 100%) over the traces that have one (85%), and
# the measured shares of all traces with one before 25% / 50% / 75% (6%, 13%, 27%) divided by 0.85.
FIRST_DRAFT_AT = [(0.0, 0.05), (0.071, 0.25), (0.10, 0.34), (0.153, 0.50), (0.318, 0.75),
                  (0.5, 0.86), (0.9, 0.995), (1.0, 0.999)]
NAMED_AT = [(0.0, 0.03), (0.1, 0.12), (0.5, 0.33), (0.9, 0.63), (1.0, 0.90)]
FINAL_DRAFT_AT = [(0.0, 0.50), (0.1, 0.71), (0.5, 0.92), (0.9, 0.97), (1.0, 0.995)]
DRAFT_COUNT = [(0, 0.15), (1, 0.50), (2, 0.28), (3, 0.07)]
CORRECT_SHARE = 0.30
FINAL_DRAFTED_SHARE = 0.58
# Drafts written in a fenced block: of the 39 turns whose reasoning drafts the final kernel, 21
# do so in a fence; the rest as plain code among the prose.
FENCED_SHARE = 21 / 39
FRAGMENT_FREE_SHARE = 0.16          # traces without any incomplete code
FRAGMENT_COUNT = (2, 10)            # else uniform: median 5 over all traces
CUT_OFF_SHARE = 0.3                 # fragments that are a whole program cut off mid-way (assumption)

_SENTENCES = [
    "Let me think about how the data is laid out in memory for this operation.",
    "Each row is independent, so one program instance per row could work, but the row may be long.",
    "I need to be careful about numerical stability here, subtracting the maximum first.",
    "The reference launches several kernels; fusing them would save memory traffic.",
    "Wait, the input might not be contiguous, so I should check the strides.",
    "Memory bandwidth is the limit here, not compute, so fewer passes over the data matter most.",
    "Maybe a block size of 1024 is a good start, then tune it.",
    "Hmm, the reduction needs a second pass, unless the whole row fits in one block.",
    "Let me count the bytes read and written to see what the floor is.",
    "Actually, the bias can be loaded once per column and reused across rows.",
    "The output shape must match exactly, including the dtype.",
    "I should also handle the tail where the size is not a multiple of the block.",
    "Let me reconsider: vectorized loads of four floats would help coalescing.",
    "What about the backward pass? Not needed, only forward is timed.",
    "So the plan is one fused kernel with the epilogue applied in registers.",
    "Let me double check the indexing: row offset times stride plus the column.",
    "The grid should cover every output element exactly once.",
    "Alternatively shared memory tiles could cut global loads, if there is reuse.",
    "I think the simplest correct version first, then optimize it.",
    "Now the launch configuration: how many warps per block?",
]
_NAMING = "I'll call the kernel {name} and structure the launch around it."


def _quantile(table: list[tuple[float, float]], u: float) -> float:
    """Piecewise-linear inverse CDF through (probability, value) points."""
    ps = [p for p, _ in table]
    index = min(max(bisect.bisect_right(ps, u), 1), len(table) - 1)
    (p0, v0), (p1, v1) = table[index - 1], table[index]
    return v0 + (v1 - v0) * (u - p0) / (p1 - p0) if p1 > p0 else v1


def _position(table: list[tuple[float, float]], u: float, shift: float) -> float:
    """A position (share of the reasoning) from `table`, moved by `shift` (sensitivity runs:
    +-0.10 moves every percentile by ten points), kept inside the reasoning."""
    return min(0.999, max(0.01, _quantile(table, u) + shift))


@dataclass
class LibraryCandidate:
    problem: str
    kind: str                    # honest | wrong | slow | cheat | broken
    lang: str                    # torch | triton | cuda | cpp
    path: Path

    @property
    def source(self) -> str:
        return self.path.read_text()


_HEADER = re.compile(r"^#\s*(kind|lang):\s*(\w+)", re.MULTILINE)
LANGS = ("torch", "triton", "cuda", "cpp")


@dataclass
class CandidateLibrary:
    """The bundled candidates by problem, kind and language (`[KIND/]<problem>_<variant>.py`,
    headers `# kind:` and `# lang:`; a file without them is an honest candidate in the language
    its name ends with)."""

    candidates: list[LibraryCandidate] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path = PROBLEMS_DIR / "candidates") -> "CandidateLibrary":
        problems = sorted(bundled_problems(), key=len, reverse=True)
        found = []
        for path in sorted(directory.rglob("*.py")):     # kinds may sit in folders of their own
            problem = next((p for p in problems if path.stem.startswith(p + "_")), None)
            if problem is None:
                continue
            text = path.read_text()
            headers = dict(_HEADER.findall(text[:2000]))
            variant = path.stem[len(problem) + 1:]
            lang = headers.get("lang") or next((l for l in LANGS if variant.startswith(l)), "torch")
            found.append(LibraryCandidate(problem, headers.get("kind", "honest"), lang, path))
        return cls(found)

    def of(self, problem: str, kinds: tuple[str, ...], langs: tuple[str, ...] = LANGS
           ) -> list[LibraryCandidate]:
        return [c for c in self.candidates if c.problem == problem and c.kind in kinds
                and c.lang in langs]


def broken(source: str, rng: random.Random) -> str:
    """A program cut off mid-way (a syntax error), as drafts in reasoning often are."""
    lines = source.splitlines()
    cut = rng.randint(max(3, len(lines) // 3), max(4, len(lines) - 2))
    return "\n".join(lines[:cut]) + "\n    return (\n"


@dataclass
class TurnPlan:
    """What one generated turn holds, for tests and reports."""

    reasoning_tokens: int
    correct: bool
    final: str                   # the candidate file the answer is
    drafts: list[tuple[float, str, bool]]   # complete drafts: (where it ends, as a share of the
                                            # reasoning; candidate file; fenced)
    named_at: float | None
    final_drafted_at: float | None
    fragments: int = 0           # incomplete code: snippets and cut-off programs


_DRAFT_INTROS = ["Here is a complete version of the code.", "Let me write the whole program out.",
                 "Putting it all together, the code would be:", "So the full code looks like this:"]
_FRAGMENT_INTROS = ["Something like this for that part:", "The relevant lines would be:",
                    "Roughly this, not complete yet:"]


def _filler(rng: random.Random, chars: int) -> str:
    out, size = [], 0
    while size < chars:
        sentence = rng.choice(_SENTENCES)
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def _count(table: list[tuple[int, float]], u: float) -> int:
    for n, share in table:
        if u < share:
            return n
        u -= share
    return table[-1][0]


def _code(code: str, intro: str, fenced: bool) -> str:
    if fenced:
        return f"\n\n{intro}\n\n```python\n{code.rstrip()}\n```\n\n"
    # Plain code among the prose: a blank line on each side, prose again after it.
    return f"\n\n{intro}\n\n{code.rstrip()}\n\n"


def _fragment(code: str, intro: str, fenced: bool) -> str:
    """`code` written as a fragment: incomplete code, never a draft. Where the extractor would find
    a candidate in it (a fenced block is one as soon as it holds a `class ModelNew` line), the
    fragment keeps only the lines before that class, or those after it when none come before."""
    text = _code(code, intro, fenced)
    if find_drafts(text):
        lines = code.splitlines()
        at = next(i for i, line in enumerate(lines) if defines_model_new(line))
        text = _code("\n".join(lines[:at] or lines[at + 1:]), intro, fenced)
    return text


def generate_turn(problem: str, library: CandidateLibrary, rng: random.Random,
                  langs: tuple[str, ...], shift: float = 0.0) -> tuple[str, str, TurnPlan]:
    """(reasoning text, final text, plan) for one turn."""
    honest = library.of(problem, ("honest", "slow"), langs) or library.of(problem, ("honest", "slow"))
    if not honest:
        raise ValueError(f"no honest candidate for problem {problem!r} in the library")
    others = library.of(problem, ("wrong", "cheat"), langs) or library.of(problem, ("wrong", "cheat"))
    tokens = int(_quantile(REASONING_TOKENS, rng.random()))
    correct = rng.random() < CORRECT_SHARE
    final = rng.choice(honest) if correct or not others else rng.choice(others)
    final_source = final.source
    # Complete drafts: how many, where they end, whether the last is the final kernel. A correct
    # trace drafts its final kernel in FINAL_DRAFTED_SHARE of its turns; only a turn with a draft
    # can, so among those it does with that share over the share of turns with one.
    count = _count(DRAFT_COUNT, rng.random())
    has_draft = 1.0 - DRAFT_COUNT[0][1]
    drafted_final = None
    positions: list[float] = []
    if count and correct and rng.random() < FINAL_DRAFTED_SHARE / has_draft:
        drafted_final = _position(FINAL_DRAFT_AT, rng.random(), shift)
        for _ in range(count - 1):
            for _ in range(32):
                position = _position(FIRST_DRAFT_AT, rng.random(), shift)
                if position < drafted_final:
                    break
            else:
                position = rng.uniform(0.01, drafted_final)
            positions.append(position)
        positions.sort()
    elif count:
        first = _position(FIRST_DRAFT_AT, rng.random(), shift)
        positions = sorted([first] + [max(first, _position(FIRST_DRAFT_AT, rng.random(), shift))
                                      for _ in range(count - 1)])
    pool = [c for c in honest + others if c.path != final.path]
    drafts: list[tuple[float, str, str, bool]] = []   # (position, label, program, fenced)
    for position in positions:
        pick = rng.choice(pool) if pool else final
        drafts.append((position, pick.path.stem, pick.source, rng.random() < FENCED_SHARE))
    if drafted_final is not None:
        drafts.append((drafted_final, final.path.stem, final_source, rng.random() < FENCED_SHARE))
    names = kernel_names(final_source)
    named_at = _position(NAMED_AT, rng.random(), shift) if names else None
    # Fragments: incomplete code (a few lines of some candidate, or one cut off) anywhere.
    fragments: list[tuple[float, str]] = []
    if rng.random() >= FRAGMENT_FREE_SHARE:
        for _ in range(rng.randint(*FRAGMENT_COUNT)):
            source = rng.choice(honest + others).source
            if rng.random() < CUT_OFF_SHARE:
                code = broken(source, rng)
            else:
                lines = source.splitlines()
                start = rng.randint(0, max(0, len(lines) - 4))
                code = "\n".join(lines[start:start + rng.randint(2, 6)])
            text = _fragment(code, rng.choice(_FRAGMENT_INTROS), rng.random() < FENCED_SHARE)
            fragments.append((rng.uniform(0.05, 0.95), text))
    total_chars = int(tokens * CHARS_PER_TOKEN)
    # Events as (where their text starts, text): a draft so that it ends at its position.
    events: list[tuple[float, str]] = []
    for position, _, program, fenced in drafts:
        text = _code(program, rng.choice(_DRAFT_INTROS), fenced)
        events.append((position - len(text) / max(1, total_chars), text))
    events += fragments
    if named_at is not None:
        events.append((named_at, _NAMING.format(name=names[0]) + " "))
    events.sort(key=lambda e: e[0])
    # Filler fills the reasoning to its length; events sit at their share of the characters.
    parts, written = [], 0
    for position, text in events:
        target = int(position * total_chars)
        if target > written:
            parts.append(_filler(rng, target - written))
            written = target
        if parts and not parts[-1].endswith("\n") and not text.startswith("\n"):
            text = " " + text             # a sentence after a sentence; after code, at column 0
        parts.append(text)
        written += len(text)
    if written < total_chars:
        parts.append(_filler(rng, total_chars - written))
    reasoning = "".join(parts)
    final_text = f"The final version:\n\n```python\n{final_source.rstrip()}\n```\n"
    drafts.sort(key=lambda d: d[0])
    plan = TurnPlan(reasoning_tokens=tokens, correct=final.kind in ("honest", "slow"),
                    final=final.path.stem,
                    drafts=[(p, label, fenced) for p, label, _, fenced in drafts],
                    named_at=named_at, final_drafted_at=drafted_final, fragments=len(fragments))
    return reasoning, final_text, plan


def generate_traces(problems: list[str], turns: int, seed: int, out_dir: Path | None = None,
                    langs: tuple[str, ...] = LANGS, token_rate: float = 56.0,
                    library: CandidateLibrary | None = None, shift: float = 0.0
                    ) -> tuple[list[Trace], list[list[TurnPlan]]]:
    """One trace per problem with `turns` iterations each; saved under `out_dir` when given.
    The recorded timing (at `token_rate`) is nominal: modelled replay re-times every token."""
    library = library or CandidateLibrary.load()
    traces, plans = [], []
    for index, problem in enumerate(problems):
        rng = random.Random(f"{seed}-{index}-{problem}")
        builder = TraceBuilder(token_rate=token_rate, problem=problem,
                               model=f"synthetic v{GENERATOR_VERSION} seed {seed}"
                                     + (f" shift {shift:+.2f}" if shift else ""),
                               hand_written=False,
                               notes="generated by specgen.traces.synthetic from measured "
                                     "distributions of real reasoning (see its docstring)")
        problem_plans = []
        for _ in range(turns):
            reasoning, final, plan = generate_turn(problem, library, rng, langs, shift)
            builder.add_iteration(reasoning, forks=[], final_text=final)
            problem_plans.append(plan)
        trace = builder.build()
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            trace.save(out_dir / f"{problem}.trace.json")
        traces.append(trace)
        plans.append(problem_plans)
    return traces, plans
