"""`specgen trace serve`: recorded reasoning behind an OpenAI-compatible HTTP server.

The server answers what `vllm serve` answers for a reasoning model, from traces instead of a model,
so that everything which talks to a live server (the HTTP engine, forks, aborts, many jobs at once)
runs on realistic reasoning on any machine, a CI runner included:

- `GET /v1/models` lists one model (`--model`, default "specgen-trace");
- `POST /v1/completions` and `POST /v1/chat/completions`, streamed as server-sent events or not,
  with `token_ids` in each choice (`return_token_ids` / `return_tokens`, as vLLM and llama.cpp
  name it), `reasoning_content` deltas in chat, usage with `prompt_tokens_details.cached_tokens`
  (`stream_options.include_usage`); `max_tokens` (default: no limit), `stop`, `stop_token_ids`
  and `seed` are honoured, sampling settings are accepted and have no effect;
- `GET /stats`: requests running, the most at once, and how each kind ended (aborts included);
- a client that closes its connection aborts its request at once (the handler is cancelled
  while it waits for the next token), and every other request goes on.

**Tokens.** Prompts arrive as token ids of the client's tokenizer (or as text), so the server
holds that tokenizer (`--tokenizer DIR`, or the trace's own when it was recorded with a Hugging
Face tokenizer): prompts are decoded with it, and a trace's text is streamed as its ids. A trace whose
ids are another tokenizer's (the piece vocabulary of hand-written and generated traces) is
re-tokenized as a whole segment at a time, each token timed by the recorded chunk its last
character arrived in; the text streamed is the recorded text exactly.

**Which trace.** A request is matched to a problem first, then to a sample and a turn:

1. the problem: a `"problem"` field of the request naming a served problem; else the served
   problem whose source (its program, compared without whitespace, also without its docstring)
   the prompt embeds, the last found where several are. A trace's problem source is the
   `<problem>.py` beside the trace (what `specgen trace import` writes), else one in a
   `--problems` folder, else the bundled problem of that name, else the `class Model` program
   its recorded prompt embeds. No match is a 404 whose message names the served problems;
2. the sample, where several traces pose the problem: the request's `seed` modulo their number,
   else each reasoning request takes the next in turn;
3. the turn: the recorded turn whose user message the prompt holds (the longest); else the
   highest earlier turn number that specgen's own feedback names ("- iteration N, ...",
   "- Iteration N produced no ..."), so the N-th prompt of a job replays turn N; else the first.
   Past the last recorded turn, the last one again (the state the recording ended in).

**Reasoning or fork.** A completion prompt holding the trace's think-end tag is a fork: the
reasoning so far is the text before the last tag (the fork suffix of `optimize/fork_prompt.py`
starts with it), located in a recorded reasoning by the longest prefix the text ends with; a chat
whose last message is the assistant's is a fork, its reasoning so far the message's
`reasoning_content` (or its content before the tag). The fork is answered at the number of the
trace's reasoning tokens that prefix covers, as `ReplayEngine.fork` answers it: the trace's
recording there or the nearest earlier one (an empty answer before the first), with its recorded
timing. A trace without recorded forks (imported and generated ones), or every trace when the
server is given a fork model (`--fork-model draft|named`), has its forks written by the fork
writer instead (`optimize/fork_models.py`; the command passes it in). Anything else is a
reasoning request, answered with the turn's reasoning, the think-end tag and the final answer.

**Pace.** `recorded`: each token at its recorded time divided by `--speed` (a written fork answer,
which has none, after the timing model's time to first token, then at the turn's mean recorded
rate). `modelled`: as `ModelledEngine` paces it, every request at the timing model's
`decode_tps(n)` with n the requests decoding on this server at that moment, after a time to
first token that counts a fork's prompt as cached up to the last whole block before its suffix.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import math
import re
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal, Sequence

from specgen.engines.timing_model import TimingModel
from specgen.engines.tokenizer_loading import HFTokenizer
from specgen.errors import UsageError
from specgen.traces.bundled import TRACE_SUFFIX, bundled_problems
from specgen.traces.format import HUGGINGFACE_KIND, Iteration, Segment, Trace
from specgen.traces.importing.problems import embedded_sources, normalized
from specgen.traces.modelled import CACHE_BLOCK, STEP_S, ForkWriter

log = logging.getLogger(__name__)

Pace = Literal["recorded", "modelled"]
PACES = ("recorded", "modelled")
DEFAULT_MODEL_NAME = "specgen-trace"
# Characters of a recorded reasoning's start looked for in a fork prompt; shorter reasoning so far
# is too little to place and counts as a fork at position 0.
ANCHOR_CHARS = 32
# Shorter problem sources (whitespace removed) could turn up in any prompt by chance.
MIN_SOURCE_CHARS = 40
_TURN_NUMBER = re.compile(r"^- [Ii]teration (\d+)[ ,]", re.MULTILINE)


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI-format error naming the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


# -- tokens and timelines --------------------------------------------------------------------------


class ServedTokenizer:
    """The client's tokenizer, as the server needs it: ids with the character each token ends at."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.hf = HFTokenizer(path, engine_name="trace serve")
        self.vocab_size = self.hf.vocab_size      # loads it now: a bad directory fails at start-up

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text) if text else []

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)

    def encode_with_ends(self, text: str) -> list[tuple[int, int]] | None:
        """(id, end offset in `text`) of each token of `text`, or None without a fast tokenizer."""
        backend = getattr(self.hf.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        encoding = backend.encode(text, add_special_tokens=False)
        return list(zip(encoding.ids, (end for _, end in encoding.offsets)))

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        try:
            return len(self.hf.chat_prompt_ids(messages))
        except Exception:  # noqa: BLE001 - no chat template: count the text
            return len(self.encode("\n".join(m["content"] for m in messages)))


@dataclass
class Timeline:
    """What one answer streams: token ids, where each token's text ends in `text`, and when it is
    due (seconds from the request's start, recorded pace). Tokens from `answer_from` on are the
    answer (after the reasoning); a fork's answer is all answer."""

    ids: list[int]
    ends: list[int]
    times: list[float]
    text: str
    answer_from: int

    def char_end(self, tokens: int) -> int:
        """Where the text of the first `tokens` tokens ends."""
        return self.ends[tokens - 1] if tokens else 0

    @classmethod
    def join(cls, first: "Timeline", second: "Timeline") -> "Timeline":
        shift = len(first.text)
        return cls(first.ids + second.ids, first.ends + [end + shift for end in second.ends],
                   first.times + second.times, first.text + second.text, len(first.ids))


EMPTY = Timeline([], [], [], "", 0)


def segment_timeline(segment: Segment, tokens: ServedTokenizer, same_ids: bool) -> Timeline:
    """A recorded segment as the served tokenizer's tokens, each due when its text was recorded."""
    ids: list[int] = []
    ends: list[int] = []
    times: list[float] = []
    text = segment.text
    if same_ids:
        offset = 0
        for chunk in segment.chunks:
            for index, token_id in enumerate(chunk.token_ids):
                ids.append(token_id)
                ends.append(offset + (len(chunk.text) if index == len(chunk.token_ids) - 1 else 0))
                times.append(chunk.t)
            offset += len(chunk.text)
        return Timeline(ids, ends, times, text, 0)
    encoded = tokens.encode_with_ends(text)
    if encoded is None:
        # No offsets: each chunk on its own (its ids still decode to its text).
        offset = 0
        for chunk in segment.chunks:
            chunk_ids = tokens.encode(chunk.text)
            for index, token_id in enumerate(chunk_ids):
                ids.append(token_id)
                ends.append(offset + (len(chunk.text) if index == len(chunk_ids) - 1 else 0))
                times.append(chunk.t)
            offset += len(chunk.text)
        return Timeline(ids, ends, times, text, 0)
    starts: list[int] = []
    offset = 0
    for chunk in segment.chunks:
        starts.append(offset)
        offset += len(chunk.text)
    end = 0
    for token_id, token_end in encoded:
        end = max(end, token_end)
        ids.append(token_id)
        ends.append(end)
        # A token is due once its last character had arrived.
        times.append(segment.chunks[max(0, bisect.bisect_right(starts, max(end - 1, 0)) - 1)].t)
    if ends:
        ends[-1] = len(text)
    return Timeline(ids, ends, times, text, 0)


def text_timeline(text: str, tokens: ServedTokenizer, first_s: float, rate: float) -> Timeline:
    """Text with no recorded timing: the first token after `first_s`, then `rate` tokens/s."""
    encoded = tokens.encode_with_ends(text)
    if encoded is None:
        encoded = [(token_id, 0) for token_id in tokens.encode(text)]
    ends, end = [], 0
    for _, token_end in encoded:
        end = max(end, token_end)
        ends.append(end)
    if ends:
        ends[-1] = len(text)
    times = [first_s + index / rate for index in range(len(encoded))]
    return Timeline([token_id for token_id, _ in encoded], ends, times, text, 0)


# -- served traces ---------------------------------------------------------------------------------


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


# -- requests --------------------------------------------------------------------------------------


@dataclass
class Limits:
    max_tokens: int | None
    stop: list[str]
    stop_token_ids: set[int]


@dataclass
class Parsed:
    """A request, read: the text its problem and turn are found in, and for a fork what it forks."""

    text: str
    prompt_tokens: int
    fork: bool
    reasoning_so_far: str = ""            # fork: the text that ends with the reasoning so far
    suffix_text: str = ""                 # fork: what follows it (the think-end tag, the instruction)


@dataclass
class Plan:
    kind: str                             # "reason" | "fork"
    served: ServedTrace
    turn: int
    timeline: Timeline
    ttft_s: float                         # modelled pace only
    cached_tokens: int
    position: int | None = None           # fork: the trace's reasoning tokens before it
    answered_by: str = ""                 # fork: "recording", a writer's name, or "nothing"


@dataclass
class Piece:
    ids: list[int]
    text: str
    answer: bool
    finish_reason: str | None


class TraceServer:
    """Serves traces over HTTP; see the module docstring.

    Args:
        traces: the traces, as `load_served_traces` makes them.
        tokenizer: the tokenizer directory clients use (None: the traces' own, when they name one).
        model: the model name served.
        pace: "recorded" or "modelled".
        speed: time scale; 2.0 serves twice as fast, `float("inf")` without waiting.
        timing: the timing model (modelled pace; time to first token of written fork answers).
        writer: writes fork answers where the trace has no recording (or always, with
            `recorded_forks=False`); None answers such forks with nothing.
        recorded_forks: answer forks from the trace's recordings where it has any.
    """

    def __init__(self, traces: Sequence[ServedTrace], *, tokenizer: str | None = None,
                 model: str = DEFAULT_MODEL_NAME, pace: Pace = "recorded", speed: float = 1.0,
                 timing: TimingModel | None = None, writer: ForkWriter | None = None,
                 recorded_forks: bool = True) -> None:
        if pace not in PACES:
            raise UsageError(f"pace must be one of {', '.join(PACES)}, got {pace!r}")
        if not speed > 0:
            raise UsageError(f"--speed must be > 0, got {speed}")
        if not traces:
            raise UsageError("no traces to serve")
        self.traces = list(traces)
        path, same = served_tokenizer_path(self.traces, tokenizer)
        self.tokens = ServedTokenizer(path)
        self._same_ids = {id(self.traces[i]) for i in same}
        self.model = model
        self.pace: Pace = pace
        self.speed = float(speed)
        self.timing = timing or TimingModel()
        self.writer = writer
        self.recorded_forks = recorded_forks
        self.by_problem: dict[str, list[ServedTrace]] = {}
        for served in self.traces:
            self.by_problem.setdefault(served.problem, []).append(served)
        self._next_sample: dict[str, int] = {}
        self.decoding = 0                  # requests in their decode phase (modelled pace)
        self.stats: dict[str, int] = {"running": 0, "peak_running": 0, "requests": 0,
                                      "reason": 0, "fork": 0, "finished": 0, "aborted": 0,
                                      "refused": 0, "failed": 0}
        self._runner: Any = None
        self.port: int | None = None

    # -- what a fork is answered with --------------------------------------------------------------

    def fork_answers(self, served: ServedTrace) -> str:
        if self.recorded_forks and served.recorded_forks:
            return "recorded"
        return self.writer.name if self.writer is not None else "nothing"

    def describe(self) -> list[str]:
        """A line per trace: what it serves and from where its problem is matched."""
        lines = []
        for served in self.traces:
            turns = len(served.iterations)
            match = (f"matched by its source ({served.source_from})" if served.sources
                     else "no problem source found: reached only by a request's 'problem' field")
            lines.append(f"{served.path}: problem {served.problem}, {turns} turn(s), forks answered "
                         f"by {self.fork_answers(served)}; {match}")
        return lines

    # -- matching ----------------------------------------------------------------------------------

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

    async def plan(self, parsed: Parsed, body: dict[str, Any]) -> Plan:
        candidates = self.match_problem(parsed.text, body.get("problem"))
        flat = normalized(parsed.text)
        if not parsed.fork:
            served = self.pick_sample(candidates, body.get("seed"))
            turn = self.turn_for(served, parsed.text, flat)
            timeline = served.turn_timeline(turn, self.tokens, id(served) in self._same_ids)
            return Plan("reason", served, turn, timeline, self.timing.ttft_s(parsed.prompt_tokens), 0)
        found: tuple[ServedTrace, int, int] | None = None
        for served in candidates:
            preferred = self.turn_for(served, parsed.text, flat)
            for turn in [preferred] + [t for t in range(len(served.iterations)) if t != preferred]:
                chars = reasoning_prefix(parsed.reasoning_so_far, served.iterations[turn].reasoning.text)
                if chars is not None and (found is None or chars > found[2]):
                    found = (served, turn, chars)
        if found is None:
            # Too little reasoning so far to place: the start of the likeliest turn.
            served = candidates[0]
            found = (served, self.turn_for(served, parsed.text, flat), 0)
        served, turn, chars = found
        iteration = served.iterations[turn]
        position = served.position_at(turn, chars)
        suffix_tokens = len(self.tokens.encode(parsed.suffix_text))
        shared = max(0, parsed.prompt_tokens - suffix_tokens)
        cached = (shared // CACHE_BLOCK) * CACHE_BLOCK
        ttft = self.timing.ttft_s(parsed.prompt_tokens, cached_tokens=cached)
        same_ids = id(served) in self._same_ids
        answered_by = self.fork_answers(served)
        if answered_by == "recorded":
            recording = iteration.fork_at(position)
            if recording is None:
                timeline, answered_by = EMPTY, "nothing (before the first recording)"
            else:
                timeline = served.fork_timeline(turn, iteration.forks.index(recording), self.tokens,
                                                same_ids)
                answered_by = f"the recording at {recording.position}"
        elif self.writer is not None:
            try:
                text = await self.writer.write(iteration, position, iteration.reasoning.text[:chars],
                                               parsed.suffix_text)
            except Exception as exc:  # noqa: BLE001 - a writer's failure is this request's, not the server's
                raise RequestError(500, f"fork writer {self.writer.name!r} failed: {exc}",
                                   kind="server_error") from exc
            rate = served.mean_rate(turn) or served.trace.metadata.token_rate or self.timing.r1
            timeline = text_timeline(text, self.tokens, ttft, rate) if text else EMPTY
        else:
            timeline = EMPTY
        return Plan("fork", served, turn, timeline, ttft, cached, position, answered_by)

    # -- pacing ------------------------------------------------------------------------------------

    async def _recorded(self, timeline: Timeline) -> AsyncIterator[tuple[int, int]]:
        start = time.monotonic()
        count, index = len(timeline.ids), 0
        while index < count:
            wait = start + timeline.times[index] / self.speed - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            end = index + 1
            # Every token already due goes in one event, as an engine step batches them; the
            # reasoning and the answer never share one (chat sends them as different fields).
            limit = timeline.answer_from if index < timeline.answer_from else count
            while end < limit and start + timeline.times[end] / self.speed <= now:
                end += 1
            yield index, end
            index = end

    async def _modelled(self, timeline: Timeline, ttft_s: float) -> AsyncIterator[tuple[int, int]]:
        if ttft_s > 0 and math.isfinite(self.speed):
            await asyncio.sleep(ttft_s / self.speed)
        count, index, progress = len(timeline.ids), 0, 0.0
        self.decoding += 1
        try:
            last = time.monotonic()
            while index < count:
                await asyncio.sleep(STEP_S if math.isfinite(self.speed) else 0)
                now = time.monotonic()
                if math.isfinite(self.speed):
                    progress += self.timing.decode_tps(self.decoding) * (now - last) * self.speed
                else:
                    progress = count
                last = now
                due = min(count, int(progress))
                while index < due:
                    limit = timeline.answer_from if index < timeline.answer_from else count
                    end = min(due, limit)
                    yield index, end
                    index = end
        finally:
            self.decoding -= 1

    async def pieces(self, plan: Plan, limits: Limits) -> AsyncIterator[Piece]:
        """The plan's answer as it comes due, cut by the request's limits as an engine cuts it.

        Text that may be the start of a stop string is held back until the next tokens say
        whether it is one, so that no part of a stop string ever reaches the client."""
        timeline = plan.timeline
        count = len(timeline.ids)
        schedule = (self._recorded(timeline) if self.pace == "recorded"
                    else self._modelled(timeline, plan.ttft_s))
        sent_tokens = sent_chars = 0
        async with contextlib.aclosing(schedule):
            async for start, end in schedule:
                end, end_char, finish = self._cut(timeline, start, end, limits)
                if finish is None and end >= count:
                    finish = "stop"
                release, release_char = end, end_char
                if finish is None and limits.stop:
                    held = _stop_prefix(timeline.text[sent_chars:end_char], limits.stop)
                    if held:
                        while release > sent_tokens and timeline.ends[release - 1] > end_char - held:
                            release -= 1
                        release_char = timeline.char_end(release)
                if sent_tokens < timeline.answer_from < release:
                    # Held reasoning goes out on its own: chat sends it as another field.
                    boundary = timeline.char_end(timeline.answer_from)
                    yield Piece(timeline.ids[sent_tokens:timeline.answer_from],
                                timeline.text[sent_chars:boundary], False, None)
                    sent_tokens, sent_chars = timeline.answer_from, boundary
                if release > sent_tokens or finish is not None:
                    yield Piece(timeline.ids[sent_tokens:release], timeline.text[sent_chars:release_char],
                                sent_tokens >= timeline.answer_from, finish)
                    sent_tokens, sent_chars = release, release_char
                if finish is not None:
                    return
        yield Piece([], "", True, "stop")

    @staticmethod
    def _cut(timeline: Timeline, start: int, end: int, limits: Limits) -> tuple[int, int, str | None]:
        """Where tokens `start:end` stop being sent (a token index and a character offset), and
        why the answer ends there, if it does: `max_tokens`, a stop token, a stop string."""
        finish = None
        if limits.max_tokens is not None and end >= limits.max_tokens:
            end, finish = limits.max_tokens, "length"
        for index in range(start, end):
            if timeline.ids[index] in limits.stop_token_ids:
                end, finish = index + 1, "stop"
                break
        end_char = timeline.char_end(end)
        if limits.stop:
            begin = timeline.char_end(start)
            hits = [timeline.text.find(stop, max(0, begin - len(stop) + 1), end_char) for stop in limits.stop]
            hits = [hit for hit in hits if hit >= 0]
            if hits:
                # The stop string is not sent (as OpenAI servers do), nor a token it begins in.
                end_char, finish = min(hits), "stop"
                kept = start
                while kept < end and timeline.ends[kept] <= end_char:
                    kept += 1
                end = kept
        return end, end_char, finish

    # -- HTTP --------------------------------------------------------------------------------------

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "specgen",
             "root": self.model, "parent": None}]})

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="")

    async def _stats(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(dict(self.stats, decoding=self.decoding))

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def _chat_completions(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Any, *, chat: bool) -> Any:
        from aiohttp import web

        try:
            body = await self._read_body(request)
            self._check_model(body)
            parsed = self._parse_chat(body) if chat else self._parse_completion(body)
            limits = _limits(body, chat)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(400, "'stream' must be true or false", param="stream")
            options = body.get("stream_options") or {}
            if not isinstance(options, dict):
                raise RequestError(400, "'stream_options' must be an object", param="stream_options")
            plan = await self.plan(parsed, body)
        except RequestError as exc:
            self.stats["refused"] += 1
            log.info("refused (%d): %s", exc.status, exc.message)
            return web.json_response(exc.body(), status=exc.status)
        want_ids = bool(body.get("return_token_ids") or body.get("return_tokens"))
        self.stats["requests"] += 1
        self.stats[plan.kind] += 1
        self.stats["running"] += 1
        self.stats["peak_running"] = max(self.stats["peak_running"], self.stats["running"])
        reply = _Reply(chat=chat, model=self.model, want_ids=want_ids, think_end=self.think_end(plan),
                       prompt_tokens=parsed.prompt_tokens, cached_tokens=plan.cached_tokens,
                       include_usage=bool(options.get("include_usage")))
        outcome = "aborted"
        try:
            if stream:
                result = await self._stream(request, plan, limits, reply)
            else:
                result = await self._collect(plan, limits, reply)
            outcome = reply.finish_reason or "aborted"
            return result
        except Exception:
            outcome = "failed"
            raise
        finally:
            self.stats["running"] -= 1
            if outcome == "aborted":
                self.stats["aborted"] += 1
            elif outcome == "failed":
                self.stats["failed"] += 1
            else:
                self.stats["finished"] += 1
            where = "" if plan.position is None else f" at {plan.position} tokens ({plan.answered_by})"
            log.info("%s %s (%s) turn %d%s: %d tokens, %s", plan.kind, plan.served.problem,
                     plan.served.path.name, plan.turn + 1, where, reply.completion_tokens, outcome)

    def think_end(self, plan: Plan) -> str:
        return plan.served.trace.metadata.think_end

    async def _stream(self, request: Any, plan: Plan, limits: Limits, reply: "_Reply") -> Any:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(data: dict[str, Any] | str) -> None:
            payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            await response.write(f"data: {payload}\n\n".encode("utf-8"))

        try:
            if reply.chat:
                await send(reply.chunk({"role": "assistant", "content": ""}, None, []))
            stream = self.pieces(plan, limits)
            async with contextlib.aclosing(stream):
                async for piece in stream:
                    for event in reply.events(piece):
                        await send(event)
            if reply.include_usage:
                await send(reply.usage_chunk())
            await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            reply.finish_reason = None          # the client is gone: an abort
        return response

    async def _collect(self, plan: Plan, limits: Limits, reply: "_Reply") -> Any:
        from aiohttp import web

        stream = self.pieces(plan, limits)
        async with contextlib.aclosing(stream):
            async for piece in stream:
                reply.events(piece)
        return web.json_response(reply.whole())

    async def _read_body(self, request: Any) -> dict[str, Any]:
        try:
            body = await request.json(loads=json.loads)
        except ValueError as exc:
            raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model", self.model)
        if model != self.model:
            raise RequestError(404, f"the model {model!r} does not exist; this server serves "
                                    f"{self.model!r}", param="model", kind="not_found_error")
        if body.get("n") not in (None, 1):
            raise RequestError(400, "'n' must be 1: a trace holds one answer per request", param="n")
        if body.get("echo"):
            raise RequestError(400, "'echo' is not supported", param="echo")

    def _parse_completion(self, body: dict[str, Any]) -> Parsed:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            text, prompt_tokens = prompt, len(self.tokens.encode(prompt))
        elif isinstance(prompt, list) and prompt:
            for index, token_id in enumerate(prompt):
                if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                    raise RequestError(400, f"prompt[{index}] = {token_id!r} is not a token id",
                                       param="prompt")
                if token_id >= self.tokens.vocab_size:
                    raise RequestError(400, f"prompt[{index}] = {token_id} is out of vocabulary (the "
                                            f"served tokenizer {self.tokens.path} has "
                                            f"{self.tokens.vocab_size} tokens)", param="prompt")
            text, prompt_tokens = self.tokens.decode(prompt), len(prompt)
        else:
            raise RequestError(400, "'prompt' must be a non-empty string or list of token ids (one "
                                    "prompt per request)", param="prompt")
        tags = {served.trace.metadata.think_end for served in self.traces}
        cut = max((text.rfind(tag), tag) for tag in tags)
        if cut[0] < 0:
            return Parsed(text, prompt_tokens, fork=False)
        return Parsed(text, prompt_tokens, fork=True, reasoning_so_far=text[:cut[0]],
                      suffix_text=text[cut[0]:])

    def _parse_chat(self, body: dict[str, Any]) -> Parsed:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        read: list[dict[str, str]] = []
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(400, f"messages[{index}] must be an object with a string 'role'",
                                   param=f"messages[{index}]")
            read.append({"role": message["role"],
                         "content": _content_text(message.get("content"), f"messages[{index}].content")})
        last = messages[-1]
        if last["role"] != "assistant":
            text = "\n".join(m["content"] for m in read)
            return Parsed(text, self.tokens.prompt_tokens(read), fork=False)
        # The assistant's turn, begun: a fork from the reasoning it holds.
        context = read[:-1]
        content = read[-1]["content"]
        reasoning = last.get("reasoning_content", last.get("reasoning"))
        if reasoning is not None and not isinstance(reasoning, str):
            raise RequestError(400, f"messages[{len(messages) - 1}].reasoning_content must be a string",
                               param=f"messages[{len(messages) - 1}].reasoning_content")
        if reasoning is None:
            tags = {served.trace.metadata.think_end for served in self.traces}
            cut = max((content.rfind(tag), tag) for tag in tags)[0]
            reasoning, suffix = (content[:cut], content[cut:]) if cut >= 0 else (content, "")
        else:
            suffix = content
        text = "\n".join(m["content"] for m in context)
        prompt_tokens = (self.tokens.prompt_tokens(context) + len(self.tokens.encode(reasoning))
                         + len(self.tokens.encode(suffix)))
        return Parsed(text, prompt_tokens, fork=True, reasoning_so_far=reasoning, suffix_text=suffix)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on `host:port` (0: a free port, then in `self.port`); returns the API root."""
        from aiohttp import web

        # Cancelling the handler of a request whose client went away is how an abort stops its
        # stream while it waits for its next token.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self.port = self._runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def serve_until_stopped(self, host: str, port: int,
                                  on_ready: Callable[[str], None] = lambda url: None) -> None:
        """Serve until SIGINT or SIGTERM."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        url = await self.start(host, port)
        try:
            on_ready(url)
            await stop.wait()
        finally:
            await self.close()


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"{where}[{index}] must be a text part "
                                        "({'type': 'text', 'text': ...})", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"{where} must be a string or a list of text parts", param=where)


def _stop_prefix(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` begin one of `stops` without completing it."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def _limits(body: dict[str, Any], chat: bool) -> Limits:
    keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = next((body[k] for k in keys if body.get(k) is not None), None)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}",
                           param="max_tokens")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "'stop' must be a string or a list of non-empty strings", param="stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in stop_ids):
        raise RequestError(400, "'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    return Limits(max_tokens, list(stop), set(stop_ids))


@dataclass
class _Reply:
    """One request's answer in the OpenAI wire format, as events or as one response."""

    chat: bool
    model: str
    want_ids: bool
    think_end: str
    prompt_tokens: int
    cached_tokens: int
    include_usage: bool
    request_id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    completion_tokens: int = 0
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    reasoning: str = ""
    content: str = ""
    _answer_started: bool = False

    def _answer_text(self, text: str) -> str:
        # Chat answers carry the answer without the tag that closed the reasoning, as vLLM's
        # reasoning parsers send it.
        if not self._answer_started:
            self._answer_started = True
            if text.startswith(self.think_end):
                return text[len(self.think_end):]
        return text

    def chunk(self, delta: dict[str, Any] | str, finish: str | None, ids: list[int]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        if self.want_ids:
            choice["token_ids"] = ids
        return {"id": self.request_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}

    def events(self, piece: Piece) -> list[dict[str, Any]]:
        self.completion_tokens += len(piece.ids)
        self.token_ids.extend(piece.ids)
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
        if not piece.ids and not piece.text and piece.finish_reason is None:
            return []
        if not self.chat:
            self.content += piece.text
            return [self.chunk(piece.text, piece.finish_reason, piece.ids)]
        if piece.answer:
            text = self._answer_text(piece.text)
            self.content += text
            delta: dict[str, Any] = {"content": text}
        else:
            self.reasoning += piece.text
            delta = {"reasoning_content": piece.text}
        return [self.chunk(delta, piece.finish_reason, piece.ids)]

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.request_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": self.usage()}

    def whole(self) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": self.content}
            if self.reasoning:
                message["reasoning_content"] = self.reasoning
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": self.content, "logprobs": None,
                      "finish_reason": self.finish_reason, "stop_reason": None}
        if self.want_ids:
            choice["token_ids"] = self.token_ids
        return {"id": self.request_id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage()}
