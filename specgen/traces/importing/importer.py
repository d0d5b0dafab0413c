"""The import's entry points: the options checked, every input read, its turns' problems named
and its records grouped before anything is written; then each conversation built into a `Trace`
and written.
"""
from __future__ import annotations

import datetime as _datetime
import math
import warnings
from pathlib import Path
from typing import Callable, Iterable, Sequence

from specgen.traces.format import Iteration, SourceRecord, Trace, TraceMetadata
from specgen.traces.importing.conversations import Record, deduplicated, group_conversations
from specgen.traces.importing.problems import ProblemIndex, resolve_problem
from specgen.traces.importing.records import read_turns
from specgen.traces.importing.staging import ImportedTrace, Interrupts, write_all
from specgen.traces.importing.text import read_file
from specgen.traces.importing.tokens import HFTokens, Pieces, segment
from specgen.traces.importing.turns import MAX_RECORD_MB, Settings, TraceImportError, Turn, think_start_tag
from specgen.traces.tokenizer import TOKENIZER_KIND as PIECES_KIND


class TraceImportWarning(UserWarning):
    """Something in the input that was imported with care (duplicates); the import went on."""


def _iso(epoch: float | None) -> str:
    moment = (_datetime.datetime.fromtimestamp(epoch, _datetime.timezone.utc) if epoch is not None
              and 0 < epoch < 1e11 else _datetime.datetime.now(_datetime.timezone.utc))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def import_traces(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    tokens_per_s: float | None = None,
    tokenizer: str | Path | None = None,
    prompt: str | Path | None = None,
    problem: str | None = None,
    problems_dirs: Sequence[str | Path] = (),
    model: str | None = None,
    think_end: str = "</think>",
    ttft_s: float = 0.5,
    force: bool = False,
    max_record_mb: float = MAX_RECORD_MB,
    on_warning: Callable[[str], None] | None = None,
) -> list[Path]:
    """Import reasoning logs into trace files under `out_dir` (one per conversation; see the package
    docstring); returns their paths.

    Args:
        paths: input files (see the package docstring for the formats).
        out_dir: where the traces (and the problem programs they need) go; created if missing.
        tokens_per_s: the token rate for turns without arrival times (required when there are any).
        tokenizer: a local Hugging Face tokenizer directory (default: a piece vocabulary).
        prompt: a file holding the user prompt, for turns that carry no chat (plain text).
        problem: the problem's name for turns that name none.
        problems_dirs: directories of KernelBench-format problems to match prompts against.
        model: the model's name for the metadata (default: the records' `model` field).
        think_end: the tag that closes the reasoning.
        ttft_s: seconds from the request to the first token under rate timing.
        force: replace trace files that already exist in `out_dir`.
        max_record_mb: the most text one record may hold (a JSON value, a stream's text, a
            plain-text turn), in MB (10^6 characters); a larger one stops the import.
        on_warning: called with each warning line (duplicates); default: `warnings.warn` with a
            `TraceImportWarning`.
    """
    return [item.path for item in import_traces_detailed(
        paths, out_dir, tokens_per_s=tokens_per_s, tokenizer=tokenizer, prompt=prompt, problem=problem,
        problems_dirs=problems_dirs, model=model, think_end=think_end, ttft_s=ttft_s, force=force,
        max_record_mb=max_record_mb, on_warning=on_warning, _caller_depth=2)]


def import_traces_detailed(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    tokens_per_s: float | None = None,
    tokenizer: str | Path | None = None,
    prompt: str | Path | None = None,
    problem: str | None = None,
    problems_dirs: Sequence[str | Path] = (),
    model: str | None = None,
    think_end: str = "</think>",
    ttft_s: float = 0.5,
    force: bool = False,
    max_record_mb: float = MAX_RECORD_MB,
    on_warning: Callable[[str], None] | None = None,
    _caller_depth: int = 1,
) -> list[ImportedTrace]:
    """`import_traces`, returning what was written for each trace."""
    with Interrupts() as interrupts:
        return _import(
            [Path(p) for p in paths], Path(out_dir), tokens_per_s=tokens_per_s, tokenizer=tokenizer,
            prompt=prompt, problem=problem, problems_dirs=problems_dirs, model=model, think_end=think_end,
            ttft_s=ttft_s, force=force, max_record_mb=max_record_mb, interrupts=interrupts,
            warn=on_warning or _python_warnings(_caller_depth))


def _python_warnings(depth: int) -> Callable[[str], None]:
    """Warning lines as `TraceImportWarning`s, shown at the line that called the import."""
    return lambda line: warnings.warn(line, TraceImportWarning, stacklevel=depth + 4)


def _import(paths: list[Path], out_dir: Path, *, tokens_per_s: float | None, tokenizer: str | Path | None,
            prompt: str | Path | None, problem: str | None, problems_dirs: Sequence[str | Path],
            model: str | None, think_end: str, ttft_s: float, force: bool, max_record_mb: float,
            interrupts: Interrupts, warn: Callable[[str], None]) -> list[ImportedTrace]:
    if not paths:
        raise TraceImportError("no input files given")
    if tokens_per_s is not None and not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise TraceImportError(f"--tokens-per-s must be > 0, got {tokens_per_s}")
    if not (math.isfinite(ttft_s) and ttft_s >= 0):
        raise TraceImportError(f"--ttft-s must be >= 0, got {ttft_s}")
    if not (math.isfinite(max_record_mb) and max_record_mb > 0):
        raise TraceImportError(f"--max-record-mb must be > 0, got {max_record_mb}")
    if not think_end:
        raise TraceImportError("--think-end must not be empty")
    prompt_messages = None
    if prompt is not None:
        prompt_messages = [{"role": "user", "content": read_file(Path(prompt))}]
    settings = Settings(think_end=think_end, think_start=think_start_tag(think_end), prompt=prompt_messages,
                        ttft_s=ttft_s, max_record_chars=max(1, int(max_record_mb * 1e6)))
    index = ProblemIndex([Path(d) for d in problems_dirs])

    # Read everything first: nothing is written unless every input imports.
    records: list[Record] = []
    sources: dict[str, str | None] = {}
    order = 0
    read = [(path, read_turns(path, settings)) for path in paths]
    # Names the records give explicitly are theirs: an unknown problem named after a record's
    # `name` field never takes one of them, whichever comes first in the input.
    index.reserve([turn.problem for _, turns in read for turn in turns if turn.problem is not None]
                  + ([problem] if problem is not None else []))
    for path, turns in read:
        units: dict[tuple[int, str], Record] = {}
        for turn in turns:
            if turn.messages is None:
                turn.messages = prompt_messages
            turn.order = order
            order += 1
            resolved = resolve_problem(turn, index, problem)
            unit = units.get((turn.unit, resolved.name))
            if unit is None:
                unit = units[(turn.unit, resolved.name)] = Record(resolved.name, [])
                records.append(unit)
            unit.turns.append(turn)
            if sources.get(resolved.name) is None:
                sources[resolved.name] = resolved.write_source
    by_problem: dict[str, list[Record]] = {}
    for record in deduplicated(records, warn):
        by_problem.setdefault(record.problem, []).append(record)

    tokens_shared = HFTokens(str(tokenizer)) if tokenizer is not None else None
    traces: list[tuple[str, str | None, Trace, str | None]] = []
    for name, problem_records in by_problem.items():
        conversations = group_conversations(name, problem_records, think_end)
        for number, (key, turns) in enumerate(conversations):
            sample = None if len(conversations) == 1 else key if key is not None else str(number)
            trace = _trace(name, turns, tokens_shared, tokens_per_s=tokens_per_s, ttft_s=ttft_s, model=model,
                           think_end=think_end,
                           sample=None if sample is None else f"sample {sample} of {len(conversations)}")
            traces.append((name, sample, trace, sources.get(name)))
    return write_all(out_dir, traces, force, interrupts)


def _trace(name: str, turns: list[Turn], tokens_shared: "HFTokens | None", *, tokens_per_s: float | None,
           ttft_s: float, model: str | None, think_end: str, sample: str | None) -> Trace:
    recorded = [turn for turn in turns if turn.reasoning_times is not None]
    timed_by_rate = [turn for turn in turns if turn.reasoning_times is None]
    if recorded and timed_by_rate:
        raise timed_by_rate[0].place.error(
            f"problem {name!r} mixes turns with arrival times ({recorded[0].place.file}, line "
            f"{recorded[0].place.line}) and turns without; import them separately", "t")
    if timed_by_rate and tokens_per_s is None:
        raise timed_by_rate[0].place.error(
            "no arrival times: this turn has no token timing, so give --tokens-per-s RATE (rate timing)",
            "t")
    timing = "recorded" if recorded else "rate"
    tokens = tokens_shared or Pieces()
    iterations = []
    for turn in turns:
        reasoning = segment(turn.reasoning, tokens, 0, turn.reasoning_times, tokens_per_s, ttft_s)
        final = segment(turn.final, tokens, reasoning.num_tokens, turn.final_times, tokens_per_s, ttft_s)
        # Each turn keeps its record (file, line, id), so a trace can be traced back to its input.
        iterations.append(Iteration(reasoning=reasoning, final=final, forks=[],
                                    messages=[dict(m) for m in turn.messages] if turn.messages else None,
                                    record=SourceRecord(turn.place.file, turn.place.line, turn.record_id)))
    models = list(dict.fromkeys(turn.model for turn in turns if turn.model))
    files = list(dict.fromkeys(turn.place.file for turn in turns))
    metadata = TraceMetadata(
        model=model or ", ".join(models) or "unknown",
        tokenizer=tokens.spec(),
        hand_written=False,
        problem=name,
        token_rate=float(tokens_per_s) if timing == "rate" else None,
        notes=f"imported by specgen trace import from {', '.join(files)}: "
              + (f"{sample}, " if sample else "") + f"{len(turns)} turn(s), "
              + ("arrival times as recorded" if timing == "recorded" else f"timed at {tokens_per_s:g} tokens/s"),
        think_end=think_end,
        created=_iso(next((turn.created for turn in turns if turn.created is not None), None)),
        timing=timing,
        imported_from=files,
    )
    vocab = list(tokens.vocab) if tokens.kind == PIECES_KIND else None
    return Trace(metadata=metadata, iterations=iterations, vocab=vocab)
