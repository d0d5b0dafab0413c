"""Recognizing a candidate the job has already seen, whatever its comments and formatting.

Forks taken close together often write the same program with different comments, blank lines or
quoting; evaluating each copy would spend validation and profiling time on no new information.
Sources that parse are compared by their canonical `ast.unparse` form without docstrings; sources
that do not parse (they will fail to compile either way) are compared with comments and whitespace
stripped, so the same broken program is also evaluated once.
"""
from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from dataclasses import dataclass


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                del body[0]
                if not body and not isinstance(node, ast.Module):
                    body.append(ast.Pass())


def _drop_comment(line: str) -> str:
    """`line` without a trailing # comment, leaving a # inside a one-line string alone."""
    quote: str | None = None
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:index]
    return line


def _strip_comments_and_whitespace(source: str) -> str:
    try:
        tokens = [
            tok for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type != tokenize.COMMENT
        ]
        source = tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        # Unbalanced brackets or strings: strip comments line by line instead.
        source = "\n".join(_drop_comment(line) for line in source.splitlines())
    lines = (" ".join(line.split()) for line in source.splitlines())
    return "\n".join(line for line in lines if line)


def normalize_source(source: str) -> str:
    """A canonical form of `source` for deciding whether two candidates are the same program."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _strip_comments_and_whitespace(source)
    _strip_docstrings(tree)
    return ast.unparse(tree)


def fingerprint(source: str) -> str:
    """A short stable hash of the normalized source."""
    return hashlib.sha256(normalize_source(source).encode()).hexdigest()[:16]


@dataclass
class Admission:
    fingerprint: str
    duplicate_of: str | None        # candidate id of the first copy, or None when new


class Deduplicator:
    """Remembers every program a job has submitted; one instance per job."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def admit(self, source: str, candidate_id: str) -> Admission:
        """Record `source` under `candidate_id` unless an equivalent program came first."""
        key = fingerprint(source)
        first = self._first.get(key)
        if first is None:
            self._first[key] = candidate_id
        return Admission(key, first)

    def __len__(self) -> int:
        return len(self._first)
