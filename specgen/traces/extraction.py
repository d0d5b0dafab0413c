"""Finding candidate programs in generated text.

A candidate is a complete Python program that defines `class ModelNew`. Models write it inside a
fenced code block (```python ... ```), sometimes several times as they refine it; the last complete
one is the answer. Reasoning also writes whole programs as plain text without a fence (public
QwQ-32B traces on KernelBench: counting unfenced code, the final kernel is drafted before the
answer in 39 of 96 turns, against 21 with fenced blocks only). `CodeBlockScanner` finds both kinds
while the text is still streaming, so a kernel the model already wrote in its reasoning becomes a
candidate without forking anything; `find_drafts` is the same scanner run over a whole text.

An unfenced draft is a stretch of code around a `class ModelNew` line at column 0: the statements
above it back to the program's imports (a short prose passage between two statements is left out,
a long one ends the program), the class, and the statements after it up to the first prose line.
It is a draft only when the whole compiles, imports something, and its ModelNew has a `forward`
that returns: a cut-off string, a syntax error, a class without forward or cut off inside it, or a
class sketch without the rest of the program is not a candidate.
"""
from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass

# An opening or closing fence: three or more backticks or tildes, an optional info string.
_FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b[ \t]*[(:]", re.MULTILINE)
# Info strings that can hold a Python program; CUDA/C++ blocks are not candidates by themselves
# (a load_inline candidate carries its CUDA inside a Python string).
_PYTHON_LANGS = {"", "python", "py", "python3", "python3.11", "python3.12"}

# -- unfenced code ---------------------------------------------------------------------------------
# A line at column 0 that no Python statement can begin: a capitalized word and two more words
# ("Let me think", "Wait, the input", "So the plan"), a bold marker, a numbered list item. C++ inside
# a CUDA source string rarely looks like this ("Tensor out = ..." does not: its third word is "=").
# The match only needs the line's first words, so a stream knows a draft has ended as soon as they
# arrive; the match is the same on any longer prefix of the line, so where it ends does not depend
# on how the text was split into deltas.
_PROSE = re.compile(r"[A-Z][a-z']*,?[ \t]+[a-z']+,?[ \t]+[A-Za-z'(]|\*\*|\d+\.[ \t]+[A-Za-z]")
_CLASS_LINE = re.compile(r"class[ \t]+ModelNew\b[ \t]*[(:]")
# Lines at column 0 that continue the statement above rather than begin one.
_CONTINUATION = re.compile(r"[)\]}]|(?:else|elif|except|finally)\b")
_WINDOW_CHARS = 64_000      # how far above its class a draft's statements are looked for
_MAX_DRAFT_CHARS = 64_000   # a class still open after this much text is not a draft
_MAX_PARSES = 128           # parse attempts when looking above one class
_GAP_LINES = 3              # prose tolerated between two statements of one program ...
_GAP_CHARS = 400            # ... an explanation line or two; more ends the program above


@dataclass
class CodeBlock:
    """One fenced block, or one unfenced draft, found in a text."""

    language: str                 # info string, lower-cased ("" when none)
    source: str                   # the lines between the fences (an unfenced draft: its program)
    start: int                    # offset of the opening fence line (unfenced: first program line)
    end: int                      # offset just past the closing fence line (or the text's end;
                                  # unfenced: past the last program line)
    closed: bool                  # a closing fence was seen (an unfenced draft is always complete)
    fenced: bool = True
    # How much of the text a stream must have delivered for the scanner to report this block: the
    # closing fence line's end; for an unfenced draft, where the text after it shows it has ended.
    known_at: int | None = None

    def __post_init__(self) -> None:
        if self.known_at is None:
            self.known_at = self.end

    @property
    def is_candidate(self) -> bool:
        if not self.fenced:
            return True           # reported only once it compiled as a ModelNew program
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


def find_drafts(text: str, *, ended: bool = True) -> list[CodeBlock]:
    """Every complete program defining ModelNew in `text`, in order: closed fenced candidate
    blocks and unfenced drafts. This is `CodeBlockScanner` run over the text, so it finds what the
    loop finds while the text streams. `ended=False` leaves out what only the end of the text would
    complete (a last line without its newline, a draft nothing has followed yet): what a stream
    that is cut off there, without `finish`, has reported; the loop reads reasoning that ends with
    its think-end tag that way."""
    scanner = CodeBlockScanner()
    found = scanner.feed(text)
    if ended:
        found += scanner.finish(text)
    return [block for block in found if block.is_candidate]


def extract_candidate(text: str, *, accept_unclosed: bool = False) -> str | None:
    """The last complete program defining `ModelNew` in `text`, or None.

    `accept_unclosed` also accepts a final block whose closing fence never came (a generation that
    stopped on the fence as a stop string). Text with no fences and no complete program that still
    defines ModelNew (a model answering with bare, broken code) is accepted as it is: its
    evaluation says what is wrong.
    """
    blocks = find_code_blocks(text)
    if accept_unclosed and blocks and not blocks[-1].closed and blocks[-1].is_candidate:
        return _clean(blocks[-1].source)
    drafts = find_drafts(text)
    if drafts:
        return _clean(drafts[-1].source)
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


# -- statements of unfenced code -------------------------------------------------------------------

def _parse(source: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():       # invalid escapes in drafts are not our warnings
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _kind(tree: ast.Module) -> str:
    """What a run of top-level statements is: `import`, `comment` (nothing but comments),
    `docstring`, `prose` (bare names or tuples of them: "Wait", "Right, okay" parse, but a program
    does not write them), or `code`."""
    body = tree.body
    if not body:
        return "comment"
    if all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body):
        return "import"
    if (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return "docstring"
    if all(isinstance(node, ast.Expr) and not isinstance(node.value, (ast.Call, ast.Await, ast.Constant))
           for node in body):
        return "prose"
    return "code"


def _model_new_with_forward(tree: ast.Module) -> bool:
    """A ModelNew class whose `forward` returns something: a forward without a return is one cut
    off before its end (every forward returns its output), though what is left may parse."""
    return any(
        isinstance(node, ast.ClassDef) and node.name == "ModelNew"
        and any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "forward"
                and any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(item))
                for item in node.body)
        for node in tree.body
    )


def _compiles(source: str) -> bool:
    """Past the parser too: `return` outside a function, a late `from __future__` import."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<draft>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


@dataclass
class _Pending:
    """An unfenced `class ModelNew` whose program has not ended yet."""

    class_index: int              # the class line, an index into the scanner's lines
    piece_start: int              # first line of the statement being read
    included_end: int             # past the last line of the statements kept so far
    class_done: bool = False      # the class itself compiled with a forward
    chars: int = 0


class CodeBlockScanner:
    """Finds fenced blocks and unfenced drafts as a text streams in, reporting each once, in
    order: a fenced block when its fence closes, an unfenced draft when the text after it shows it
    has ended (a prose line, a line that is not a statement, a fence, another ModelNew class) or
    `finish` is called.

    Feed it the whole text so far (it only reads what it has not yet read); only complete lines are
    parsed, so a fence split across two deltas is still recognized, except that the first words of
    an unfinished line may already say that it is prose. Each line is read once and each statement
    of unfenced code parsed about once, so the work per delta is that delta's, plus a bounded look
    above a `class ModelNew` line when its program ends.
    """

    def __init__(self) -> None:
        self._consumed = 0                 # offset of the first unread line
        self._fence: str | None = None
        self._language = ""
        self._block_start = 0
        self._body: list[str] = []
        # Unfenced text read since the last fence or draft (only the last _WINDOW_CHARS or so).
        self._lines: list[str] = []
        self._offsets: list[int] = []
        self._chars = 0
        self._pending: _Pending | None = None

    @property
    def in_code_block(self) -> bool:
        """True while the text read so far ends inside an open fence."""
        return self._fence is not None

    def feed(self, text: str) -> list[CodeBlock]:
        """Blocks and drafts that completed in the part of `text` not read before."""
        closed: list[CodeBlock] = []
        end = text.rfind("\n") + 1          # read complete lines only
        if end > self._consumed:
            for line in text[self._consumed:end].splitlines(keepends=True):
                self._read_line(line, closed)
        if self._pending is not None and self._consumed < len(text):
            self._peek(text, closed)
        return closed

    def finish(self, text: str) -> list[CodeBlock]:
        """Read the last, unterminated line once the stream has ended; the end of the text ends
        an unfenced draft."""
        closed = self.feed(text)
        if self._consumed < len(text):
            for line in text[self._consumed:].splitlines(keepends=True):
                self._read_line(line, closed)
        if self._pending is not None:
            self._close_piece(len(self._lines), len(text), closed)
            self._end_draft(len(text), closed)
        return closed

    def _read_line(self, line: str, closed: list[CodeBlock]) -> None:
        bare = line.rstrip("\r\n")
        if self._fence is None:
            match = _FENCE.match(bare)
            if match:
                end = self._consumed + len(line)
                if self._pending is not None:
                    self._close_piece(len(self._lines), end, closed)
                    self._end_draft(end, closed)
                self._lines, self._offsets, self._chars = [], [], 0
                self._fence = match.group("fence")
                self._language = match.group("info").lower()
                self._block_start = self._consumed
                self._body = []
            else:
                self._read_unfenced(line, closed)
        elif _closes(bare, self._fence):
            end = self._consumed + len(line)
            closed.append(CodeBlock(self._language, "".join(self._body), self._block_start, end, True))
            self._fence = None
        else:
            self._body.append(line)
        self._consumed += len(line)

    # -- unfenced drafts ---------------------------------------------------------------------------

    def _starts_statement(self, line: str, index: int) -> bool:
        """`line`, at `index` of the unfenced lines, begins a statement (or prose) at column 0."""
        if not line.strip() or line[0] in " \t" or _CONTINUATION.match(line):
            return False
        if index == 0:
            return True
        above = self._lines[index - 1]
        return not (above.rstrip("\r\n").endswith("\\") or above.startswith("@"))

    def _read_unfenced(self, line: str, closed: list[CodeBlock]) -> None:
        index = len(self._lines)
        self._lines.append(line)
        self._offsets.append(self._consumed)
        self._chars += len(line)
        pending = self._pending
        starts = self._starts_statement(line, index)
        if pending is not None:
            pending.chars += len(line)
            if pending.chars > _MAX_DRAFT_CHARS:
                self._pending = None
            elif starts:
                prose = _PROSE.match(line)
                if prose:
                    at = self._consumed + prose.end()
                    self._close_piece(index, at, closed)
                    self._end_draft(at, closed)
                else:
                    at = self._consumed + len(line)
                    self._close_piece(index, at, closed)
                    if self._pending is not None and _CLASS_LINE.match(line):
                        self._end_draft(at, closed)     # a new class: the program above ended
        if self._pending is None:
            if starts and _CLASS_LINE.match(line):
                index = len(self._lines) - 1            # _end_draft may have dropped lines
                self._pending = _Pending(index, index, index, chars=len(line))
            elif self._chars > 2 * _WINDOW_CHARS:
                self._trim()

    def _peek(self, text: str, closed: list[CodeBlock]) -> None:
        """The unfinished last line may already show, by its first words, that it is prose."""
        index = len(self._lines)
        head = text[self._consumed:self._consumed + 200]
        if self._fence is None and self._starts_statement(head, index):
            prose = _PROSE.match(head)
            if prose:
                at = self._consumed + prose.end()
                self._close_piece(index, at, closed)
                self._end_draft(at, closed)

    def _close_piece(self, upto: int, at: int, closed: list[CodeBlock]) -> None:
        """The statement from `piece_start` ends before line `upto`: keep it, or end the draft
        before it when it is not code that continues the program (`at`: how much text that
        took)."""
        pending = self._pending
        if pending is None or upto <= pending.piece_start:
            return
        tree = _parse("".join(self._lines[pending.piece_start:upto]))
        if not pending.class_done:
            if tree is None or not _model_new_with_forward(tree):
                self._pending = None           # a cut-off or broken class: no draft
                return
            pending.class_done = True
            pending.included_end = upto
        elif tree is not None and _kind(tree) in ("code", "docstring"):
            pending.included_end = upto
        elif tree is not None and _kind(tree) == "comment":
            pass                               # kept only if code follows it
        else:
            # Prose, broken code, or imports: those open another program (one written right
            # after this one), not the rest of this one.
            self._end_draft(at, closed)
            return
        pending.piece_start = upto

    def _end_draft(self, at: int, closed: list[CodeBlock]) -> None:
        """The pending class's program has ended: report it if it is one."""
        pending, self._pending = self._pending, None
        if pending is None or not pending.class_done:
            return
        above = self._statements_above(pending.class_index)
        if above is not None:
            ranges = above + [(pending.class_index, pending.included_end)]
            source = _clean("".join("".join(self._lines[a:b]) for a, b in ranges))
            if _compiles(source):
                first = ranges[0][0]
                last = pending.included_end - 1
                while last > first and not self._lines[last].strip():
                    last -= 1
                end = self._offsets[last] + len(self._lines[last].rstrip("\r\n"))
                closed.append(CodeBlock("", source, self._offsets[first], end, True,
                                        fenced=False, known_at=at))
                # Later drafts start after this one.
                del self._lines[:pending.included_end], self._offsets[:pending.included_end]
                self._chars = sum(len(line) for line in self._lines)

    def _statements_above(self, class_index: int) -> list[tuple[int, int]] | None:
        """Line ranges of the program's statements above its class, top first, or None when no
        imports open it. Walks up from the class: a line at column 0 begins a statement when the
        lines from it to the statement below parse; a prose line (and any lines below it that never
        parsed) is left out, unless prose runs longer than _GAP_LINES / _GAP_CHARS; once the
        imports are reached only imports, comments and a module docstring above them belong."""
        lines = self._lines
        ranges: list[tuple[int, int]] = []
        below = class_index                  # first line of the statement below
        gap_lines = gap_chars = walked = parses = 0
        phase = "body"                       # body -> imports -> docstring, from the class up
        quoted = False                       # a triple quote between this line and `below`
        for index in range(class_index - 1, -1, -1):
            line = lines[index]
            walked += len(line)
            if walked > _WINDOW_CHARS or parses > _MAX_PARSES:
                break
            if not self._starts_statement(line, index):
                quoted = quoted or '"""' in line or "'''" in line
                continue
            kind = "prose"
            # A prose-like line with a triple quote below it may sit inside a string (a module
            # docstring, a CUDA source) whose statement begins higher up.
            if not _PROSE.match(line) or quoted:
                parses += 1
                tree = _parse("".join(lines[index:below]))
                if tree is None and line.startswith("@") and ranges:
                    # A decorator on more than one line: it belongs to the statement below.
                    tree = _parse("".join(lines[index:ranges[-1][1]]))
                    if tree is not None:
                        below = ranges.pop()[1]
                if tree is None:
                    quoted = quoted or '"""' in line or "'''" in line
                    continue                 # the statement begins higher up, or this is prose
                kind = _kind(tree)
            if kind == "prose":
                skipped = [l for l in lines[index:below] if l.strip()]
                gap_lines += len(skipped)
                gap_chars += sum(len(l) for l in skipped)
                if gap_lines > _GAP_LINES or gap_chars > _GAP_CHARS:
                    break
                below = index
                quoted = False
                continue
            allowed = {"body": ("code", "import", "comment", "docstring"),
                       "imports": ("import", "comment", "docstring"),
                       "docstring": ("comment",)}[phase]
            if kind not in allowed:
                break
            if kind == "import" and phase == "body":
                phase = "imports"
            elif kind == "docstring" and phase == "imports":
                phase = "docstring"
            ranges.append((index, below))
            below = index
            gap_lines = gap_chars = 0
            quoted = False
        if phase == "body":
            return None
        return ranges[::-1]

    def _trim(self) -> None:
        """Keep the last _WINDOW_CHARS or so of unfenced text: a draft never looks further up."""
        kept, cut = 0, len(self._lines)
        while cut > 0 and kept + len(self._lines[cut - 1]) <= _WINDOW_CHARS:
            cut -= 1
            kept += len(self._lines[cut])
        del self._lines[:cut], self._offsets[:cut]
        self._chars = kept


# -- kernels inside a program ----------------------------------------------------------------------
_CUDA_KERNEL = re.compile(r"__global__\s+(?:void|[\w:<>]+)\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
_TRITON_KERNEL = re.compile(r"@triton\.jit[^\n]*\n(?:[ \t]*@[^\n]*\n)*[ \t]*def[ \t]+(\w+)")


def kernel_names(source: str) -> list[str]:
    """Names of the custom kernels a program defines (CUDA `__global__` functions inside its
    source strings, `@triton.jit` functions), in order of appearance."""
    names = [m.group(1) for m in _CUDA_KERNEL.finditer(source)]
    names += [m.group(1) for m in _TRITON_KERNEL.finditer(source)]
    return list(dict.fromkeys(names))


def first_naming(reasoning_text: str, final_program: str) -> int | None:
    """Offset in the reasoning text where any kernel of the final program is first named."""
    offsets = [reasoning_text.find(name) for name in kernel_names(final_program)]
    offsets = [o for o in offsets if o >= 0]
    return min(offsets) if offsets else None


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
