"""`specgen` command line: every command's glue, and nothing else imports it.

One module per command (`eval`, `runtime`: serve, node and keys, `optimize` with the job it builds
from its flags in `optimize_job`, `trace`, `bench`, `simulate`), each exposing
`register(subparsers)`, adding parsers whose `func(args) -> int` runs the command. They turn flags
into the library's typed configs and call the library; no library module imports this package.
Modules import heavy packages (torch, vLLM) inside their command functions so that `specgen
--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from specgen.errors import SpecgenError, UsageError

COMMAND_MODULES = [
    "specgen.cli.eval",
    "specgen.cli.runtime",
    "specgen.cli.optimize",
    "specgen.cli.trace",
    "specgen.cli.bench",
    "specgen.cli.simulate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specgen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from specgen.runtime.plugins import PluginError, load_plugins

    try:
        load_plugins()    # before the parser: `--llm` and `--fork-model` offer the plug-ins' names
    except PluginError as exc:
        print(f"specgen: error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"specgen {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except SpecgenError as exc:
        # Raised on purpose with a message that says what went wrong (an unreachable scheduler, a
        # refused key...): the message, not a traceback.
        print(f"specgen {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
