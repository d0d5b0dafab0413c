#!/usr/bin/env python3
"""Build the bundled hand-written traces from their readable sources.

    python tools/make_traces.py            # every specgen/data/traces/sources/*.md
    python tools/make_traces.py --check    # rebuild in memory, fail if a bundled file differs
    python tools/make_traces.py --generated            # the generated trace of the CPU first run
    python tools/make_traces.py --generated --check    # fail if it differs from a fresh one

A source is a Markdown file: a front matter block (problem, token_rate, fork_token_rate, ttft_s,
fork_ttft_s, created, notes), then sections `# iteration N` (the reasoning) and `# final` (what
follows the think-end tag). Inside a section two directives, each on a line of its own:

    %% fork FILE       from this point on, a fork writes the program in FILE
    %% include FILE    FILE's program as a ```python block, right here in the text

FILE names a candidate program in `sources/PROBLEM/`: a real kernel that `specgen eval` validates
and profiles. A fork writes it without its module docstring (a fork answers tersely) and closes
the code fence the fork prompt opened; the fork prompt suffix recorded is the optimize loop's own.
The traces are marked hand-written in their metadata; their timing comes from the stated token
rate, never from a model.

`--generated` writes instead the one generated trace that `specgen optimize` replays by default on
a host without a GPU: `specgen.traces.synthetic.generate_traces` for the problem
`DEFAULT_CPU_PROBLEM` (specgen/traces/bundled.py), language cpp, one turn, seed 0,
into `specgen/data/traces/generated/`. Nothing about it is chosen here: the seed is fixed at 0
and the generator's measured distributions decide the reasoning, its drafts and its answer.
Its metadata says it is generated, by which command, with which seed.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.optimize.fork_prompt import FORK_INSTRUCTION  # noqa: E402
from specgen.traces.bundled import PROBLEMS_DIR, TRACE_SUFFIX, TRACES_DIR  # noqa: E402
from specgen.traces.format import TraceBuilder  # noqa: E402

SOURCES_DIR = TRACES_DIR / "sources"
THINK_END = "</think>"
FRONT_MATTER_KEYS = {"problem", "token_rate", "fork_token_rate", "ttft_s", "fork_ttft_s",
                     "created", "notes"}


class SourceError(ValueError):
    pass


@dataclass
class Section:
    kind: str                                   # "iteration" | "final"
    text: str = ""
    forks: list[tuple[int, str]] = field(default_factory=list)   # (char offset, program file)


def without_docstring(source: str) -> str:
    """The program without its module docstring (and the blank lines after it)."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
            getattr(tree.body[0], "value", None), ast.Constant) and isinstance(
            tree.body[0].value.value, str):
        lines = source.splitlines(keepends=True)
        return "".join(lines[tree.body[0].end_lineno:]).lstrip("\n")
    return source


def parse_source(path: Path) -> tuple[dict[str, str], list[Section]]:
    text = path.read_text()
    if not text.startswith("---\n"):
        raise SourceError(f"{path}: must start with a '---' front matter block")
    head, _, body = text[4:].partition("\n---\n")
    meta: dict[str, str] = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() not in FRONT_MATTER_KEYS:
            raise SourceError(f"{path}: bad front matter line {line!r} "
                              f"(keys: {', '.join(sorted(FRONT_MATTER_KEYS))})")
        meta[key.strip()] = value.strip()
    programs = SOURCES_DIR / meta.get("problem", "")
    sections: list[Section] = []
    for number, line in enumerate(body.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped.startswith("# iteration"):
            sections.append(Section("iteration"))
            continue
        if stripped == "# final":
            sections.append(Section("final"))
            continue
        if not sections:
            if stripped:
                raise SourceError(f"{path}:{number}: text before the first '# iteration'")
            continue
        section = sections[-1]
        if stripped.startswith("%%"):
            words = stripped[2:].split()
            if len(words) != 2 or words[0] not in ("fork", "include"):
                raise SourceError(f"{path}:{number}: directive must be '%% fork FILE' or "
                                  f"'%% include FILE'")
            program = programs / words[1]
            if not program.is_file():
                raise SourceError(f"{path}:{number}: {program} does not exist")
            if words[0] == "fork":
                if section.kind != "iteration":
                    raise SourceError(f"{path}:{number}: forks belong to the reasoning")
                section.forks.append((len(section.text.rstrip("\n")) + 1, words[1]))
            else:
                section.text += "```python\n" + program.read_text() + "```\n"
            continue
        section.text += line
    return meta, sections


def unique_marker(text: str, offset: int, source: Path) -> str:
    """The shortest stretch of text ending at `offset` that occurs nowhere else."""
    for length in range(24, offset + 1, 8):
        marker = text[max(0, offset - length):offset]
        if text.count(marker) == 1:
            return marker
    raise SourceError(f"{source}: no unique text before the fork at char {offset}")


def build(path: Path):  # -> Trace
    meta, sections = parse_source(path)
    problem = meta.get("problem", "")
    if not (PROBLEMS_DIR / f"{problem}.py").is_file():
        raise SourceError(f"{path}: problem {problem!r} is not a bundled problem")
    builder = TraceBuilder(
        token_rate=float(meta["token_rate"]), problem=problem,
        fork_token_rate=float(meta.get("fork_token_rate") or meta["token_rate"]),
        ttft_s=float(meta.get("ttft_s", 0.5)), fork_ttft_s=float(meta.get("fork_ttft_s", 0.15)),
        notes=meta.get("notes", ""), think_end=THINK_END)
    programs = SOURCES_DIR / problem
    pairs = list(zip(sections[::2], sections[1::2]))
    if len(sections) % 2 or any(r.kind != "iteration" or f.kind != "final" for r, f in pairs):
        raise SourceError(f"{path}: sections must alternate '# iteration N' and '# final'")
    for reasoning, final in pairs:
        text = reasoning.text.strip("\n") + "\n"
        forks = []
        for offset, program in reasoning.forks:
            offset = min(offset, len(text))
            completion = without_docstring((programs / program).read_text()) + "```\n"
            forks.append((unique_marker(text, offset, path), completion))
        builder.add_iteration(text, forks=forks, final_text=final.text.strip("\n") + "\n",
                              suffix_text="\n" + THINK_END + FORK_INSTRUCTION)
    trace = builder.build()
    # A fixed date keeps rebuilt files identical to the bundled ones.
    trace.metadata.created = meta.get("created", "2026-11-01T00:00:00Z")
    return trace


def output_path(source: Path) -> Path:
    return TRACES_DIR / f"{source.stem}{TRACE_SUFFIX}"


GENERATED_SEED = 0
# The CPU first run's kernels are compiled C++ (they run natively, so their speedup is measured
# code, not PyTorch calls); the generator falls back to the other languages only for kinds the
# problem has no C++ candidate of (its wrong and cheating answers).
GENERATED_LANGS = ("cpp",)
GENERATED_COMMAND = "python tools/make_traces.py --generated"


def build_generated():  # -> (Trace, TurnPlan)
    """The CPU first run's trace: one generated turn of DEFAULT_CPU_PROBLEM, seed 0."""
    from specgen.traces.bundled import DEFAULT_CPU_PROBLEM
    from specgen.traces.synthetic import generate_traces

    traces, plans = generate_traces([DEFAULT_CPU_PROBLEM], turns=1, seed=GENERATED_SEED,
                                    langs=GENERATED_LANGS)
    trace = traces[0]
    trace.metadata.notes = (f"generated by `{GENERATED_COMMAND}`: "
                            f"specgen.traces.synthetic.generate_traces(['{DEFAULT_CPU_PROBLEM}'], "
                            f"turns=1, seed={GENERATED_SEED}, langs={GENERATED_LANGS}), from "
                            f"measured distributions of real reasoning (see that module's "
                            f"docstring); not hand-written, not tuned")
    trace.metadata.created = "2026-12-04T00:00:00Z"    # fixed, so that a rebuild is identical
    return trace, plans[0][0]


def main_generated(check: bool) -> int:
    from specgen.traces.bundled import generated_trace_path

    trace, plan = build_generated()
    target = generated_trace_path(trace.metadata.problem)
    summary = (f"{trace.iterations[0].reasoning.num_tokens} reasoning tokens, answer "
               f"{plan.final} ({'correct' if plan.correct else 'incorrect'} by its kind), "
               f"{len(plan.drafts)} complete draft(s) at "
               + ("/".join(f"{p:.0%}" for p, _, _ in plan.drafts) or "-"))
    if check:
        fresh = json.loads(json.dumps(trace.to_json()))
        bundled = json.loads(target.read_text()) if target.is_file() else None
        print(f"{target.name}: {'differs' if fresh != bundled else 'up to date'} ({summary})")
        return 0 if fresh == bundled else 1
    target.parent.mkdir(parents=True, exist_ok=True)
    trace.save(target)
    print(f"wrote {target.relative_to(REPO)} ({summary})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", type=Path,
                        help="source files (default: every sources/*.md)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; fail when a bundled trace differs from its source")
    parser.add_argument("--generated", action="store_true",
                        help="the generated trace of the CPU first run instead (seed 0, one turn)")
    args = parser.parse_args(argv)
    if args.generated:
        return main_generated(args.check)
    sources = args.sources or sorted(SOURCES_DIR.glob("*.md"))
    stale = []
    for source in sources:
        trace = build(source)
        target = output_path(source)
        summary = ", ".join(
            f"iteration {i + 1}: {it.reasoning.num_tokens} reasoning tokens, forks at "
            + "/".join(str(f.position) for f in it.forks)
            for i, it in enumerate(trace.iterations))
        if args.check:
            fresh = json.loads(json.dumps(trace.to_json()))
            bundled = json.loads(target.read_text()) if target.is_file() else None
            if fresh != bundled:
                stale.append(target)
            print(f"{target.name}: {'differs' if fresh != bundled else 'up to date'} ({summary})")
        else:
            trace.save(target)
            print(f"wrote {target.relative_to(REPO)} ({summary})")
    if stale:
        print("stale: " + ", ".join(str(p) for p in stale) + " (run tools/make_traces.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
