"""`specgen trace import FILE... --out DIR`: real reasoning logs become replayable traces.
`specgen trace serve TRACES... --port P`: traces behind an OpenAI-compatible server.

    specgen trace import responses.jsonl --out traces/ --tokens-per-s 40
    specgen trace import stream.jsonl --out traces/                     # arrival times kept
    specgen trace import answer.txt --prompt prompt.md --out traces/ --tokens-per-s 40
    specgen trace serve traces/ --port 8000 --tokenizer DIR             # then --llm openai

The formats and rules are in `specgen.traces.importing`'s docstring; how the server matches a
request to a trace and paces it, in `specgen.traces.serve`'s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="work with reasoning traces (import real reasoning, serve traces)",
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
    _register_serve(actions)


def _register_serve(actions: argparse._SubParsersAction) -> None:
    from specgen.optimize.fork_models import replayable_fork_models
    from specgen.traces.serve import DEFAULT_MODEL_NAME, PACES

    p = actions.add_parser(
        "serve", help="serve traces as an OpenAI-compatible model (completions, chat, streaming, forks)",
        description="Serve recorded reasoning as an OpenAI-compatible server: a request is matched "
                    "to a trace by the problem source its prompt embeds, streamed at the recorded "
                    "or modelled pace, and a fork request (the reasoning so far, the think-end tag "
                    "and the instruction to answer) gets the fork answer the trace holds there. "
                    "Point `specgen optimize --llm openai --base-url http://HOST:PORT/v1 --model "
                    "NAME --tokenizer DIR` at it.")
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACES",
                   help="trace files, or folders of *.trace.json files")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free one; default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--model", default=DEFAULT_MODEL_NAME,
                   help=f"the model name served, which clients pass as --model (default {DEFAULT_MODEL_NAME})")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="the tokenizer directory clients use (default: the traces' own, when they "
                        "were recorded with a Hugging Face tokenizer)")
    p.add_argument("--pace", choices=PACES, default="recorded",
                   help="recorded: each token at its recorded time; modelled: the timing model's "
                        "decode rate for the requests running at once (default recorded)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="serve this many times faster than the pace (default 1; inf: no waiting)")
    p.add_argument("--timing", action="append", default=[], metavar="NAME=VALUE",
                   help="override the timing model (r1, knee, beta, prefill_tps, ttft_floor_s, kv_fetch_tps)")
    p.add_argument("--fork-model", choices=("recorded", *replayable_fork_models()), default="recorded",
                   help="what answers a fork: recorded (the trace's recorded fork answers; a trace "
                        "without any has its forks written by draft) or a fork model for every trace")
    p.add_argument("--problems", dest="problems_dirs", action="append", default=[], type=Path,
                   metavar="DIR", help="a folder of problem programs (NAME.py) to find a trace's "
                                       "problem source in, besides the bundled ones (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no line per request")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from specgen.engines.timing_model import TimingModel
    from specgen.errors import UsageError
    from specgen.optimize.fork_models import fork_writer
    from specgen.traces.serve import TraceServer, load_served_traces

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s")
    logging.getLogger("specgen.traces.serve").setLevel(logging.WARNING if args.quiet else logging.INFO)
    traces = load_served_traces(args.traces, args.problems_dirs)
    server = TraceServer(
        traces, tokenizer=args.tokenizer, model=args.model, pace=args.pace, speed=args.speed,
        timing=TimingModel.from_overrides(args.timing),
        writer=fork_writer("draft" if args.fork_model == "recorded" else args.fork_model),
        recorded_forks=args.fork_model == "recorded")

    def ready(url: str) -> None:
        pace = f"{args.pace} pace" + ("" if args.speed == 1 else f" x{args.speed:g}")
        print(f"serving {len(traces)} trace(s) as model {args.model!r} at {url} ({pace}; "
              f"tokenizer {server.tokens.path})", flush=True)
        for line in server.describe():
            print(f"  {line}", flush=True)

    asyncio.run(server.serve_until_stopped(args.host, args.port, on_ready=ready))
    return 0


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
        if item.records:
            # Which input records it holds, so a trace can be told from its record.
            shown = ", ".join(item.records[:5]) + (f" and {len(item.records) - 5} more"
                                                    if len(item.records) > 5 else "")
            line += f"; record(s) {shown}"
        print(line)
    for warning in warnings:
        print(f"warning: {warning}")
    return 0
