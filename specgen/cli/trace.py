"""`specgen trace import FILE... --out DIR`: real reasoning logs become replayable traces.

    specgen trace import responses.jsonl --out traces/ --tokens-per-s 40
    specgen trace import stream.jsonl --out traces/                     # arrival times kept
    specgen trace import answer.txt --prompt prompt.md --out traces/ --tokens-per-s 40

The formats and rules are in `specgen.traces.importing`'s docstring.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="work with reasoning traces (import real reasoning)",
                                  description="Work with specgen reasoning traces.")
    actions = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "import", help="turn chat-completion responses, <think> text or stream chunk logs into traces",
        description="Import real reasoning into replayable traces, one per conversation (a turn "
                    "per iteration; independent samples of a problem are traces of their own): "
                    "chat-completion responses with reasoning_content (JSON or JSON "
                    "Lines), plain text with <think>...</think> reasoning, or streamed chunk logs "
                    "with arrival times.")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="input files")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="directory for the traces (created if missing)")
    p.add_argument("--tokens-per-s", type=float, default=None, metavar="RATE",
                   help="token rate for turns without arrival times (required when there are any)")
    p.add_argument("--ttft-s", type=float, default=0.5, metavar="S",
                   help="seconds to the first token under rate timing, or when absolute arrival "
                        "times come without a request time (default 0.5)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="local Hugging Face tokenizer directory for the model's own token ids "
                        "(default: a piece vocabulary built from the text)")
    p.add_argument("--prompt", type=Path, default=None, metavar="FILE",
                   help="the user prompt for inputs that carry no chat (plain text)")
    p.add_argument("--problem", default=None, metavar="NAME",
                   help="the problem's name for turns that name none and whose prompt does not tell")
    p.add_argument("--problems", dest="problems_dirs", action="append", default=[], type=Path,
                   metavar="DIR", help="a directory of KernelBench-format problems to match prompts "
                                       "against, besides the bundled ones (repeatable)")
    p.add_argument("--model", default=None, help="the model's name for the metadata "
                                                 "(default: the records' model field)")
    p.add_argument("--think-end", default="</think>", help="the tag that closes the reasoning")
    p.add_argument("--force", action="store_true", help="replace traces that exist in --out")
    p.add_argument("--max-record-mb", type=float, default=None, metavar="MB",
                   help="the most text one record may hold (a JSON value, a stream's text, a plain-text "
                        "turn); a larger one stops the import before it is read in full (default 8)")
    p.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    from specgen.traces.importing import MAX_RECORD_MB, ImportInterrupted, import_traces_detailed

    warnings: list[str] = []
    try:
        imported = import_traces_detailed(
            args.files, args.out, tokens_per_s=args.tokens_per_s, tokenizer=args.tokenizer,
            prompt=args.prompt, problem=args.problem, problems_dirs=args.problems_dirs, model=args.model,
            think_end=args.think_end, ttft_s=args.ttft_s, force=args.force,
            max_record_mb=MAX_RECORD_MB if args.max_record_mb is None else args.max_record_mb,
            on_warning=warnings.append)
    except ImportInterrupted as exc:
        # What the import wrote is gone again; the exit code is a shell's for the signal.
        print(f"specgen trace: {exc}: nothing was imported", file=sys.stderr)
        return 128 + exc.signum
    for item in imported:
        sample = "" if item.sample is None else f", sample {item.sample}"
        line = f"wrote {item.path} (problem {item.problem}{sample}, {item.turns} turn(s), timing {item.timing})"
        if item.problem_source is not None:
            line += f"; problem program {item.problem_source}"
        print(line)
    for warning in warnings:
        print(f"warning: {warning}")
    return 0
