"""Naming a turn's problem: an explicit field or `--problem`, else the `class Model` source its
prompt embeds, matched against the bundled problems and the `--problems` directories; a complete
source that matches none becomes a problem of its own, written beside the trace, named after the
record's own name for it where it has one (fields.NAME_KEYS: `name`, `problem_file`,
`task_name`; a KernelBench path like `level1/19_ReLU.py` gives `level1_19_ReLU`), else
`imported_<hash>`.

Names of unknown problems are given in input order, one per program: the first program to ask
for a name gets it; another program asking for the same name, or for one the bundled problems,
`--problems` or any record's explicit `problem` field already use, gets the name with its source's
hash (`<name>_<hash>`); a program seen again keeps the name it got first. So an import of the same files names the same problems the same.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specgen.traces.importing.turns import TraceImportError, Turn

_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_CLASS_MODEL = re.compile(r"^class[ \t]+Model\b[ \t]*[(:]", re.MULTILINE)
_CODE_LINE = re.compile(
    r"^(\s|$|#|@|import\s|from\s|def\s|class\s|if\s|for\s|while\s|with\s|try:|except|else:|elif\s|"
    r"return\b|\"\"\"|'''|[)\]}]|[A-Za-z_][\w.]*\s*(\[[^\]]*\])?\s*(:[^=]*)?=[^=]|[A-Za-z_][\w.]*\()")


def normalized(source: str) -> str:
    return "".join(source.split())


def _without_docstring(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = source.splitlines(keepends=True)
        return "".join(lines[first.end_lineno:])
    return None


def _is_complete(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    names = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    return {"Model", "get_inputs", "get_init_inputs"} <= names


@dataclass
class _Problem:
    name: str
    path: Path
    bundled: bool


class ProblemIndex:
    def __init__(self, dirs: Sequence[Path]) -> None:
        from specgen.traces.bundled import bundled_problems

        self.by_name: dict[str, _Problem] = {}
        for name, path in bundled_problems().items():
            self.by_name[name] = _Problem(name, path, True)
        for directory in dirs:
            if not directory.is_dir():
                raise TraceImportError(f"--problems {directory}: not a directory")
            for path in sorted(directory.glob("*.py")):
                if not path.name.startswith("_"):
                    self.by_name[path.stem] = _Problem(path.stem, path, False)
        self.by_source: dict[str, str] = {}
        self.variants: list[tuple[str, str]] = []          # (normalized text, name), for substring search
        for name, problem in self.by_name.items():
            try:
                source = problem.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TraceImportError(f"problem file {problem.path}: cannot be read ({exc})") from None
            for variant in (source, _without_docstring(source)):
                if variant and variant.strip():
                    key = normalized(variant)
                    self.by_source.setdefault(key, name)
                    self.variants.append((key, name))
        self._cache: dict[str, tuple[str | None, str | None]] = {}
        self._unknown_names: dict[str, str] = {}      # normalized source -> the name it was given
        self._unknown_sources: dict[str, str] = {}    # and back
        self._reserved: set[str] = set()

    def reserve(self, names: Sequence[str]) -> None:
        """Names the records give their problems explicitly (`problem` fields, `--problem`): not
        given to an unknown problem by its record's name."""
        self._reserved.update(names)

    def name_unknown(self, source: str, hint: str | None) -> str:
        """The name of a complete source that matches no known problem (see the module doc)."""
        key = normalized(source)
        named = self._unknown_names.get(key)
        if named is not None:
            return named
        digest = _source_hash(source)
        readable = readable_name(hint) if hint else None
        if readable is None:
            name = f"imported_{digest}"
        elif readable in self.by_name or readable in self._unknown_sources or readable in self._reserved:
            name = f"{readable}_{digest}"
        else:
            name = readable
        self._unknown_names[key] = name
        self._unknown_sources[name] = key
        return name

    def match(self, source: str) -> str | None:
        for variant in (source, _without_docstring(source)):
            if variant:
                name = self.by_source.get(normalized(variant))
                if name is not None:
                    return name
        return None

    def recover(self, texts: list[str]) -> tuple[str | None, str | None]:
        """(matched problem name, or None; the last complete embedded source, or None)."""
        key = "\x00".join(texts)
        if key not in self._cache:
            self._cache[key] = self._recover(texts)
        return self._cache[key]

    def _recover(self, texts: list[str]) -> tuple[str | None, str | None]:
        candidates = [source for text in texts for source in embedded_sources(text)]
        matched = [name for name in (self.match(source) for source in candidates) if name]
        if matched:
            return matched[-1], None          # the last: a prompt's example comes before its task
        best: tuple[int, int, str] | None = None
        for text in texts:
            flat = normalized(text)
            for variant, name in self.variants:
                if len(variant) < 40:
                    continue
                found = flat.rfind(variant)
                if found >= 0 and (best is None or (found, len(variant)) > best[:2]):
                    best = (found, len(variant), name)
        if best is not None:
            return best[2], None
        complete = [source for source in candidates if _is_complete(source)]
        return None, (complete[-1] if complete else None)


def embedded_sources(text: str) -> list[str]:
    """The `class Model` programs a prompt embeds: fenced code blocks defining Model (and not
    ModelNew), else the stretch of raw text around a `class Model` line that parses as Python."""
    from specgen.traces.extraction import defines_model_new, find_code_blocks

    sources = [block.source for block in find_code_blocks(text)
               if _CLASS_MODEL.search(block.source) and not defines_model_new(block.source)]
    if sources:
        return sources
    lines = text.splitlines(keepends=True)
    found = []
    for index, line in enumerate(lines):
        if _CLASS_MODEL.match(line):
            source = _raw_program(lines, index)
            if source is not None:
                found.append(source)
    return found


def _raw_program(lines: list[str], class_line: int, max_tries: int = 400) -> str | None:
    start = class_line
    while start > 0 and _CODE_LINE.match(lines[start - 1]):
        start -= 1
    end = class_line + 1
    while end < len(lines) and _CODE_LINE.match(lines[end]):
        end += 1
    tries = 0
    for first in range(start, class_line + 1):
        for last in range(end, class_line, -1):
            tries += 1
            if tries > max_tries:
                return None
            source = "".join(lines[first:last]).strip("\n") + "\n"
            try:
                ast.parse(source)
            except SyntaxError:
                continue
            return source
    return None


def _source_hash(source: str) -> str:
    return hashlib.sha256(normalized(source).encode("utf-8")).hexdigest()[:10]


_LEVEL = re.compile(r"^level\d+$", re.IGNORECASE)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def readable_name(text: str) -> str | None:
    """A problem name (a file name too) from a record's name for its problem: the last part of a
    path without `.py`, with a KernelBench level folder kept in front (`level1/19_ReLU.py` ->
    `level1_19_ReLU`: problem numbers repeat across levels), characters other than letters,
    digits, `_`, `.` and `-` made `_`; None when nothing is left."""
    parts = [part for part in text.strip().replace("\\", "/").split("/") if part]
    if not parts:
        return None
    last = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
    if len(parts) > 1 and _LEVEL.match(parts[-2]):
        last = f"{parts[-2]}_{last}"
    name = _NOT_NAME.sub("_", last).strip("._-")[:80]
    return name or None


@dataclass
class _Resolved:
    name: str
    write_source: str | None       # a program to write beside the trace as <name>.py


def resolve_problem(turn: Turn, index: ProblemIndex, default_problem: str | None) -> _Resolved:
    place = turn.place
    messages = turn.messages or []
    user_texts = [m["content"] for m in messages if m["role"] == "user"] or [m["content"] for m in messages]
    name, field_name = turn.problem, turn.problem_field
    if name is None and default_problem is not None:
        name, field_name = default_problem, "problem (--problem)"
    if name is not None:
        if not _NAME.match(name) or any(part in (".", "..") for part in name.split("/")):
            raise place.error(f"problem name {name!r} must be letters, digits, '_', '.', '-' (parts split by '/')",
                              field_name)
        known = index.by_name.get(name)
        if known is not None:
            return _Resolved(name, None if known.bundled else known.path.read_text(encoding="utf-8"))
        _, source = index.recover(user_texts) if user_texts else (None, None)
        if source is None:
            raise place.error(
                f"unknown problem {name!r}: not bundled, not in --problems, and the prompt embeds no "
                "complete class Model source (class Model, get_inputs, get_init_inputs) to write beside "
                "the trace", field_name)
        return _Resolved(name, source)
    if turn.messages is None:
        raise place.error(
            "unknown problem: the record names none (problem, problem_name, metadata.problem) and has no "
            "prompt to recover it from; give --problem NAME or --prompt FILE", "messages")
    matched, source = index.recover(user_texts)
    if matched is not None:
        known = index.by_name[matched]
        return _Resolved(matched, None if known.bundled else known.path.read_text(encoding="utf-8"))
    if source is None:
        raise place.error(
            "unknown problem: no bundled problem (or --problems file) matches the prompt, and it embeds "
            "no complete class Model source (class Model, get_inputs, get_init_inputs)", "messages")
    return _Resolved(index.name_unknown(source, turn.name), source)
