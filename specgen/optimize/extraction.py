"""Finding candidate programs in generated text.

A candidate is a complete Python program that defines `class ModelNew`. Models write it inside a
fenced code block (```python ... ```), sometimes several times as they refine it; the last complete
one is the answer. Reasoning text may also contain finished code blocks long before the answer:
`CodeBlockScanner` finds them while the text is still streaming, so a kernel the model already wrote
in its reasoning becomes a candidate without forking anything.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# An opening or closing fence: three or more backticks or tildes, an optional info string.
_FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b[ \t]*[(:]", re.MULTILINE)
# Info strings that can hold a Python program; CUDA/C++ blocks are not candidates by themselves
# (a load_inline candidate carries its CUDA inside a Python string).
_PYTHON_LANGS = {"", "python", "py", "python3", "python3.11", "python3.12"}


@dataclass
class CodeBlock:
    """One fenced block found in a text."""

    language: str                 # info string, lower-cased ("" when none)
    source: str                   # the lines between the fences
    start: int                    # offset of the opening fence line in the text
    end: int                      # offset just past the closing fence line (or the text's end)
    closed: bool                  # a closing fence was seen

    @property
    def is_candidate(self) -> bool:
        return self.language in _PYTHON_LANGS and defines_model_new(self.source)


def defines_model_new(source: str) -> bool:
    """True when `source` defines `class ModelNew` at the start of some line."""
    return _MODEL_NEW.search(source) is not None


def _closes(line: str, fence: str) -> bool:
    # CommonMark: a closing fence uses the same character, at least as many, and no info string.
    stripped = line.strip()
    return (
        len(stripped) >= len(fence)
        and set(stripped) == {fence[0]}
        and len(line) - len(line.lstrip(" \t")) <= 3
    )


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced block of `text`, in order; a block still open at the end has `closed=False`."""
    blocks: list[CodeBlock] = []
    offset = 0
    fence: str | None = None
    language = ""
    block_start = 0
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if fence is None:
            match = _FENCE.match(bare)
            if match:
                fence = match.group("fence")
                language = match.group("info").lower()
                block_start = offset
                body = []
        elif _closes(bare, fence):
            blocks.append(CodeBlock(language, "".join(body), block_start, offset + len(line), True))
            fence = None
        else:
            body.append(line)
        offset += len(line)
    if fence is not None:
        blocks.append(CodeBlock(language, "".join(body), block_start, len(text), False))
    return blocks


def extract_candidate(text: str, *, accept_unclosed: bool = False) -> str | None:
    """The last complete program defining `ModelNew` in `text`, or None.

    `accept_unclosed` also accepts a final block whose closing fence never came (a generation that
    stopped on the fence as a stop string). Text with no fences at all that is itself a program
    defining ModelNew (a model answering with bare code) is accepted as it is.
    """
    blocks = find_code_blocks(text)
    for block in reversed(blocks):
        if block.is_candidate and (block.closed or accept_unclosed):
            return _clean(block.source)
    if not blocks and defines_model_new(text):
        return _clean(text)
    return None


def extract_fork_candidate(text: str, *, opened_fence: bool) -> str | None:
    """The candidate in a fork's output.

    A fork prompt may end inside an opened ```python fence: then the fork's text up to the closing
    fence (or to where a stop string or the length limit cut it) is its answer, whatever it holds.
    A program that does not define ModelNew or does not parse is still the fork's answer; its
    evaluation says what is wrong, and that goes back to the model as feedback. A complete
    ModelNew block of its own later in the text wins over the opened block.
    """
    if not opened_fence or _FENCE.match(text.lstrip("\n").split("\n", 1)[0]):
        # No fence left open, or the model opened one of its own anyway.
        return extract_candidate(text, accept_unclosed=True)
    blocks = find_code_blocks("```python\n" + text)
    programs = [b for b in blocks if b.is_candidate]
    if programs:
        return _clean(programs[-1].source)
    body = blocks[0].source
    return _clean(body) if body.strip() else None


def _clean(source: str) -> str:
    return source.strip("\n") + "\n"


class CodeBlockScanner:
    """Finds fenced blocks as a text streams in, reporting each one once when it closes.

    Feed it the whole text so far (it only reads what it has not yet read); only complete lines are
    parsed, so a fence split across two deltas is still recognized.
    """

    def __init__(self) -> None:
        self._consumed = 0                 # offset of the first unread line
        self._fence: str | None = None
        self._language = ""
        self._block_start = 0
        self._body: list[str] = []

    @property
    def in_code_block(self) -> bool:
        """True while the text read so far ends inside an open fence."""
        return self._fence is not None

    def feed(self, text: str) -> list[CodeBlock]:
        """Blocks that closed in the part of `text` not read before."""
        closed: list[CodeBlock] = []
        end = text.rfind("\n") + 1          # read complete lines only
        if end <= self._consumed:
            return closed
        for line in text[self._consumed:end].splitlines(keepends=True):
            self._read_line(line, closed)
        return closed

    def finish(self, text: str) -> list[CodeBlock]:
        """Read the last, unterminated line once the stream has ended."""
        closed = self.feed(text)
        if self._consumed < len(text):
            self._read_line(text[self._consumed:], closed)
        return closed

    def _read_line(self, line: str, closed: list[CodeBlock]) -> None:
        bare = line.rstrip("\r\n")
        if self._fence is None:
            match = _FENCE.match(bare)
            if match:
                self._fence = match.group("fence")
                self._language = match.group("info").lower()
                self._block_start = self._consumed
                self._body = []
        elif _closes(bare, self._fence):
            closed.append(
                CodeBlock(self._language, "".join(self._body), self._block_start,
                          self._consumed + len(line), True)
            )
            self._fence = None
        else:
            self._body.append(line)
        self._consumed += len(line)


# -- kernels inside a program ----------------------------------------------------------------------
_CUDA_KERNEL = re.compile(r"__global__\s+(?:void|[\w:<>]+)\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
_TRITON_KERNEL = re.compile(r"@triton\.jit[^\n]*\n(?:[ \t]*@[^\n]*\n)*[ \t]*def[ \t]+(\w+)")


def kernel_names(source: str) -> list[str]:
    """Names of the custom kernels a program defines (CUDA `__global__` functions inside its
    source strings, `@triton.jit` functions), in order of appearance."""
    names = [m.group(1) for m in _CUDA_KERNEL.finditer(source)]
    names += [m.group(1) for m in _TRITON_KERNEL.finditer(source)]
    return list(dict.fromkeys(names))


def kernel_bodies(source: str) -> tuple[str, ...]:
    """The program's kernels with all white space removed, for telling whether two programs carry
    the same kernel: each `__global__` function up to its matching brace, each `@triton.jit`
    function to its end. A program with neither is represented by the whole of it."""
    bodies: list[str] = []
    for match in _CUDA_KERNEL.finditer(source):
        depth, end = 0, None
        for index in range(match.end(), len(source)):
            if source[index] == "{":
                depth += 1
            elif source[index] == "}":
                depth -= 1
                if depth == 0:
                    end = index + 1
                    break
        bodies.append(source[match.start():end or len(source)])
    for match in _TRITON_KERNEL.finditer(source):
        indent_end = source.find("\n", match.end())
        lines, index = [], indent_end + 1 if indent_end >= 0 else len(source)
        for line in source[index:].splitlines():
            if line.strip() and not line[:1].isspace():
                break
            lines.append(line)
        bodies.append(match.group(0) + "\n".join(lines))
    if not bodies:
        bodies = [source]
    return tuple("".join(body.split()) for body in bodies)
