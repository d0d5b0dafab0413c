"""The served traces and how a request is matched to one: each trace's problem sources and answers,
made once, and the problem, sample and turn a prompt is answered from."""
from __future__ import annotations

import bisect
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from specgen.errors import UsageError
from specgen.traces.bundled import TRACE_SUFFIX, bundled_problems
from specgen.traces.format import HUGGINGFACE_KIND, Iteration, Trace
from specgen.traces.importing.problems import embedded_sources, normalized
from specgen.traces.serve.timeline import ServedTokenizer, Timeline, segment_timeline
from specgen.traces.serve.wire import RequestError

log = logging.getLogger(__name__)

# Characters of a recorded reasoning's start looked for in a fork prompt; shorter reasoning so far
# is too little to place and counts as a fork at position 0.
ANCHOR_CHARS = 32
# Shorter problem sources (whitespace removed) could turn up in any prompt by chance.
MIN_SOURCE_CHARS = 40
_TURN_NUMBER = re.compile(r"^- [Ii]teration (\d+)[ ,]", re.MULTILINE)


def reasoning_prefix(before: str, reasoning: str) -> int | None:
    """How much of `reasoning` the text `before` ends with (its longest prefix found there, at
    least ANCHOR_CHARS long or all of it), or None. A character cut by the fork point (decoded as
    U+FFFD) and the newline a fork suffix puts before the think-end tag are allowed at the end."""
    if not reasoning:
        return None
    before = before.rstrip("\ufffd")
    anchor = reasoning[:ANCHOR_CHARS]
    variants = [before, before[:-1]] if before.endswith("\n") else [before]
    for text in variants:
        start = text.find(anchor)
        while start >= 0:
            tail = text[start:]
            if reasoning.startswith(tail):
                return len(tail)
            start = text.find(anchor, start + 1)
    return None


def _source_variants(source: str) -> list[str]:
    variants = [normalized(source)]
    # A prompt may quote the program without its module docstring.
    stripped = source.lstrip()
    for quote in ('"""', "'''"):
        if stripped.startswith(quote):
            closing = stripped.find(quote, 3)
            if closing >= 0:
                variants.append(normalized(stripped[closing + 3:]))
    return [v for v in dict.fromkeys(variants) if len(v) >= MIN_SOURCE_CHARS]


@dataclass
class ServedTrace:
    """One trace file as the server serves it: its problem's sources and its answers, made once."""

    path: Path
    trace: Trace
    source_from: str                      # where the problem source came from, for the start-up lines
    sources: list[str] = field(default_factory=list)     # normalized problem source variants
    _turns: dict[int, Timeline] = field(default_factory=dict)
    _forks: dict[tuple[int, int], Timeline] = field(default_factory=dict)
    _positions: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    _user_messages: list[str] | None = None

    @property
    def problem(self) -> str:
        return self.trace.metadata.problem

    @property
    def iterations(self) -> list[Iteration]:
        return self.trace.iterations

    @property
    def recorded_forks(self) -> bool:
        return any(iteration.forks for iteration in self.iterations)

    def turn_index(self, turn: int) -> int:
        return min(max(turn, 0), len(self.iterations) - 1)

    def user_messages(self) -> list[str]:
        """Each turn's last recorded user message, normalized ("" where none was recorded)."""
        if self._user_messages is None:
            self._user_messages = []
            for iteration in self.iterations:
                users = [m["content"] for m in iteration.messages or [] if m["role"] == "user"]
                self._user_messages.append(normalized(users[-1]) if users else "")
        return self._user_messages

    def position_at(self, turn: int, chars: int) -> int:
        """The trace's reasoning tokens whose text lies within the first `chars` characters."""
        if turn not in self._positions:
            ends, counts, chars_so_far, tokens_so_far = [], [], 0, 0
            for chunk in self.iterations[turn].reasoning.chunks:
                chars_so_far += len(chunk.text)
                tokens_so_far += len(chunk.token_ids)
                ends.append(chars_so_far)
                counts.append(tokens_so_far)
            self._positions[turn] = (ends, counts)
        ends, counts = self._positions[turn]
        index = bisect.bisect_right(ends, chars)
        return counts[index - 1] if index else 0

    def turn_timeline(self, turn: int, tokens: ServedTokenizer, same_ids: bool) -> Timeline:
        if turn not in self._turns:
            iteration = self.iterations[turn]
            self._turns[turn] = timeline = Timeline.join(
                segment_timeline(iteration.reasoning, tokens, same_ids),
                segment_timeline(iteration.final, tokens, same_ids))
            if not same_ids and tokens.decode(timeline.ids) != timeline.text:
                log.warning("%s, turn %d: the served tokenizer does not decode its own ids of the "
                            "recorded text back to it; fork prompts may not be placed exactly",
                            self.path, turn + 1)
        return self._turns[turn]

    def fork_timeline(self, turn: int, fork_index: int, tokens: ServedTokenizer,
                      same_ids: bool) -> Timeline:
        key = (turn, fork_index)
        if key not in self._forks:
            completion = self.iterations[turn].forks[fork_index].completion
            self._forks[key] = segment_timeline(completion, tokens, same_ids)
        return self._forks[key]

    def mean_rate(self, turn: int) -> float | None:
        """The turn's recorded reasoning tokens/s, or None when its timing says nothing."""
        chunks = self.iterations[turn].reasoning.chunks
        tokens = sum(len(chunk.token_ids) for chunk in chunks)
        span = chunks[-1].t - chunks[0].t if chunks else 0.0
        return tokens / span if tokens > 1 and span > 0 else None


def expand_trace_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files named, and every `*.trace.json` under each folder named."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(path.rglob(f"*{TRACE_SUFFIX}"))
            if not inside:
                raise UsageError(f"{path}: a folder without any *{TRACE_SUFFIX} file")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such trace file or folder")
    return found


def load_served_traces(paths: Sequence[str | Path],
                       problems_dirs: Sequence[str | Path] = ()) -> list[ServedTrace]:
    """Load every trace (strictly; a bad one names its file) and find each one's problem source."""
    for directory in problems_dirs:
        if not Path(directory).is_dir():
            raise UsageError(f"--problems {directory}: not a folder")
    bundled = bundled_problems()
    served = []
    for path in expand_trace_paths(paths):
        trace = Trace.load(path)
        name = trace.metadata.problem
        places = [path.parent / f"{name}.py"]
        for directory in problems_dirs:
            places += [Path(directory) / f"{name}.py", Path(directory) / f"{Path(name).name}.py"]
        if name in bundled:
            places.append(bundled[name])
        source, source_from = None, ""
        for place in places:
            if place.is_file():
                source, source_from = place.read_text(encoding="utf-8"), str(place)
                break
        if source is None:
            for iteration in trace.iterations:
                users = [m["content"] for m in iteration.messages or [] if m["role"] == "user"]
                embedded = [s for text in users for s in embedded_sources(text)]
                if embedded:
                    source, source_from = embedded[-1], "its recorded prompt"
                    break
        item = ServedTrace(path=path, trace=trace, source_from=source_from or "none")
        if source is not None:
            item.sources = _source_variants(source)
        served.append(item)
    if not served:
        raise UsageError("no traces to serve")
    return served


def served_tokenizer_path(traces: Sequence[ServedTrace], tokenizer: str | None) -> tuple[str, set[int]]:
    """The tokenizer to serve with, and which traces (by index) already hold its ids."""
    if tokenizer is not None:
        same = {i for i, t in enumerate(traces)
                if t.trace.metadata.tokenizer.get("name_or_path") == tokenizer}
        return tokenizer, same
    kinds = {(t.trace.metadata.tokenizer["kind"], t.trace.metadata.tokenizer.get("name_or_path"))
             for t in traces}
    if len(kinds) == 1:
        kind, name = next(iter(kinds))
        if kind == HUGGINGFACE_KIND and name:
            return name, set(range(len(traces)))
    pieces = [t for t in traces if t.trace.metadata.tokenizer["kind"] != HUGGINGFACE_KIND]
    why = (f"{pieces[0].path} holds ids of the piece vocabulary "
           f"({pieces[0].trace.metadata.tokenizer['kind']}), which no OpenAI client tokenizes with"
           if pieces else "the traces were recorded with different tokenizers")
    raise UsageError(f"--tokenizer DIR is needed: {why}; give the tokenizer directory your client "
                     "uses (specgen optimize's --tokenizer)")


class Library:
    """The served traces by problem, and the matching of a request's prompt to one of them."""

    def __init__(self, traces: Sequence[ServedTrace]) -> None:
        self.traces = list(traces)
        self.by_problem: dict[str, list[ServedTrace]] = {}
        for served in self.traces:
            self.by_problem.setdefault(served.problem, []).append(served)
        self._next_sample: dict[str, int] = {}

    def match_problem(self, text: str, explicit: Any) -> list[ServedTrace]:
        if explicit is not None:
            if not isinstance(explicit, str) or explicit not in self.by_problem:
                raise RequestError(404, f"'problem' names {explicit!r}, which is not served; served: "
                                        f"{', '.join(sorted(self.by_problem))}", param="problem",
                                   kind="not_found_error")
            return self.by_problem[explicit]
        flat = normalized(text)
        best: tuple[int, int, str] | None = None
        for served in self.traces:
            for variant in served.sources:
                found = flat.rfind(variant)
                if found >= 0 and (best is None or (found, len(variant)) > best[:2]):
                    best = (found, len(variant), served.problem)
        if best is None:
            raise RequestError(
                404, "no served trace matches this request: its prompt embeds the source of none of "
                     f"the served problems ({', '.join(sorted(self.by_problem))}); send a prompt "
                     "with the problem's program, or name it in a 'problem' field",
                param="prompt", kind="not_found_error")
        return self.by_problem[best[2]]

    @staticmethod
    def turn_for(served: ServedTrace, text: str, flat: str) -> int:
        best, best_len = None, 0
        for index, message in enumerate(served.user_messages()):
            if message and len(message) > best_len and message in flat:
                best, best_len = index, len(message)
        if best is not None:
            return best
        numbers = [int(n) for n in _TURN_NUMBER.findall(text)]
        return served.turn_index(max(numbers) if numbers else 0)

    def pick_sample(self, candidates: list[ServedTrace], seed: Any) -> ServedTrace:
        if len(candidates) == 1:
            return candidates[0]
        if isinstance(seed, int) and not isinstance(seed, bool):
            return candidates[seed % len(candidates)]
        problem = candidates[0].problem
        index = self._next_sample.get(problem, 0)
        self._next_sample[problem] = index + 1
        return candidates[index % len(candidates)]
