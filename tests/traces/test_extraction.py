from __future__ import annotations

import pytest

from specgen.traces.bundled import PROBLEMS_DIR
from specgen.traces.extraction import (
    CodeBlockScanner,
    defines_model_new,
    extract_candidate,
    extract_fork_candidate,
    find_code_blocks,
    find_drafts,
)

FIRST = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
SECOND = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 1\n"


def fenced(body: str, lang: str = "python") -> str:
    return f"```{lang}\n{body}```\n"


def test_last_complete_model_new_block_wins() -> None:
    text = ("First idea:\n" + fenced(FIRST) + "Better:\n" + fenced(SECOND)
            + "A helper:\n" + fenced("def helper():\n    pass\n"))
    assert extract_candidate(text) == SECOND


def test_non_python_blocks_and_unclosed_blocks_are_not_candidates() -> None:
    text = fenced("class ModelNew {};\n", "cpp") + "```python\n" + FIRST
    assert extract_candidate(text) is None
    assert extract_candidate(text, accept_unclosed=True) == FIRST


def test_bare_code_answer_without_fences() -> None:
    assert extract_candidate(FIRST) == FIRST
    assert extract_candidate("no code here at all") is None


def test_model_new_detection_needs_a_class_statement() -> None:
    assert defines_model_new("class ModelNew(nn.Module):\n")
    assert defines_model_new("    class ModelNew:\n")
    assert not defines_model_new("# we replace Model with ModelNew later\n")
    assert not defines_model_new("class ModelNewer(nn.Module):\n")


def test_longer_fences_and_tildes() -> None:
    text = "````python\n" + FIRST + "```\nstill inside\n````\n"
    (block,) = find_code_blocks(text)
    assert block.closed and "still inside" in block.source
    assert find_code_blocks("~~~py\nx = 1\n~~~\n")[0].language == "py"


def test_fork_text_in_an_opened_fence_is_the_answer_even_if_broken() -> None:
    assert extract_fork_candidate(FIRST + "```\nThat should work.", opened_fence=True) == FIRST
    # No ModelNew, no closing fence: still the fork's answer; evaluation will say what is wrong.
    assert extract_fork_candidate("def oops(:\n", opened_fence=True) == "def oops(:\n"
    assert extract_fork_candidate("  \n", opened_fence=True) is None
    # A complete ModelNew block written after closing the opened one wins.
    text = "x = 1\n```\nLet me restate:\n" + fenced(SECOND)
    assert extract_fork_candidate(text, opened_fence=True) == SECOND
    # The model opened a fence of its own although the prompt had opened one.
    assert extract_fork_candidate("```python\n" + FIRST, opened_fence=True) == FIRST


def test_scanner_reports_each_block_once_whatever_the_delta_split() -> None:
    text = "Thinking\n" + fenced(FIRST) + "more thinking\n" + fenced("x = 1\n", "") + "end"
    for step in (1, 2, 3, 7, 1000):
        scanner = CodeBlockScanner()
        found = []
        inside_seen = False
        for end in range(step, len(text) + step, step):
            found += scanner.feed(text[:end])
            inside_seen |= scanner.in_code_block
        found += scanner.finish(text)
        assert [b.source for b in found] == [FIRST, "x = 1\n"], step
        assert [b.is_candidate for b in found] == [True, False]
        assert inside_seen == (step < len(text)) and not scanner.in_code_block


def test_scanner_finish_reads_a_last_line_without_newline() -> None:
    scanner = CodeBlockScanner()
    text = "```python\n" + FIRST + "```"
    assert scanner.feed(text) == []
    (block,) = scanner.finish(text)
    assert block.source == FIRST


# -- unfenced drafts -------------------------------------------------------------------------------

CUDA_PROGRAM = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>

__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

torch::Tensor scale(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="scale", cpp_sources="torch::Tensor scale(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["scale"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.scale(x)
'''
TRITON_PROGRAM = '''import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK": 1024})],
    key=["n"],
)
@triton.jit
def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        double_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel())
        return y
'''
PROSE = "Let me think about the memory layout first, then the launch.\n\n"
AFTER = "\n\nWait, the block size might not divide the size, so the mask matters.\n"


def streamed(text: str, step: int, ended: bool = True) -> list:
    """What the scanner reports fed `text` `step` characters at a time, with the length of the
    text it had been given when it reported each."""
    scanner = CodeBlockScanner()
    found = []
    for end in range(step, len(text) + step, step):
        found += [(b, min(end, len(text))) for b in scanner.feed(text[:end]) if b.is_candidate]
    if ended:
        found += [(b, len(text)) for b in scanner.finish(text) if b.is_candidate]
    return found


def assert_streams_alike(text: str) -> list:
    """Every chunking reports what the one-shot extractor finds, in order, each draft as soon as
    the text shows it has ended (`known_at`) and not before; without `finish`, what
    `find_drafts(ended=False)` finds."""
    for ended in (True, False):
        want = [(b.source, b.start, b.end, b.known_at) for b in find_drafts(text, ended=ended)]
        for step in (1, 2, 3, 7, 64, 1000, len(text) + 1):
            got = streamed(text, step, ended)
            assert [(b.source, b.start, b.end, b.known_at) for b, _ in got] == want, (step, ended)
            for block, seen in got:
                assert block.known_at <= seen < block.known_at + step, (step, block.known_at, seen)
    return find_drafts(text)


def test_fenced_drafts_are_the_closed_candidate_blocks_whatever_the_chunks() -> None:
    text = ("Thinking\n" + fenced(FIRST) + "a helper\n" + fenced("x = 1\n") + fenced("int x;\n", "cpp")
            + "```python\n" + SECOND)                       # the last block never closes
    drafts = assert_streams_alike(text)
    assert [b.source for b in drafts] == [FIRST]
    assert [b.source for b in drafts] == [b.source for b in find_code_blocks(text)
                                          if b.closed and b.is_candidate]
    assert all(b.fenced and b.known_at == b.end for b in drafts)


@pytest.mark.parametrize("program", [CUDA_PROGRAM, TRITON_PROGRAM])
def test_an_unfenced_program_is_a_draft_once_prose_follows_it(program: str) -> None:
    text = PROSE + program + AFTER
    (draft,) = assert_streams_alike(text)
    assert draft.source == program and not draft.fenced and draft.is_candidate
    assert text[draft.start:draft.end] == program.rstrip("\n")
    # Known from the first words of the prose line after it, not its end.
    assert draft.known_at == text.index("Wait, the block") + len("Wait, the b")
    assert extract_candidate(text) == program


def test_the_end_of_the_text_or_a_fence_ends_an_unfenced_program() -> None:
    assert [b.source for b in find_drafts(PROSE + CUDA_PROGRAM)] == [CUDA_PROGRAM]
    # A stream still open may go on with more of the program: not yet a draft.
    assert find_drafts(PROSE + CUDA_PROGRAM, ended=False) == []
    text = PROSE + CUDA_PROGRAM + "```python\n" + SECOND + "```\n"
    drafts = assert_streams_alike(text)
    assert [(b.source, b.fenced) for b in drafts] == [(CUDA_PROGRAM, False), (SECOND, True)]
    assert drafts[0].known_at == text.index("```python") + len("```python\n")


def test_statements_after_the_class_belong_to_the_program_until_prose() -> None:
    tail = "\n\ndef get_inputs():\n    return [torch.randn(16)]\n"
    text = PROSE + CUDA_PROGRAM + tail + "\nOkay\n\nSo that is the whole program, let me check it.\n"
    (draft,) = assert_streams_alike(text)
    # "Okay" parses as a name, but a program does not say it: the draft ends before it.
    assert draft.source == CUDA_PROGRAM + tail


def test_prose_between_the_parts_of_a_program_is_left_out() -> None:
    with_prose = (CUDA_PROGRAM
                  .replace("\ncuda_source", "\nNow the CUDA source for the kernel:\n\ncuda_source")
                  .replace("\next = load_inline",
                           "\nThen the binding, compiled on first use:\next = load_inline")
                  .replace("\n\nclass ModelNew", "\n\nAnd the module that calls it.\n\nclass ModelNew"))
    (draft,) = assert_streams_alike(PROSE + with_prose + AFTER)
    for line in ("Now the CUDA", "Then the binding", "And the module"):
        assert line not in draft.source
    assert _code(draft.source) == _code(CUDA_PROGRAM)
    # A long passage of prose means the code above it is some other thought: no imports, no draft.
    long_gap = CUDA_PROGRAM.replace("\n\nclass ModelNew", "\n\n" + "Let me think about it more. " * 30
                                    + "\n\nclass ModelNew")
    assert find_drafts(PROSE + long_gap + AFTER) == []


def _code(source: str) -> list[str]:
    return [line for line in source.splitlines() if line.strip()]


def test_incomplete_programs_are_not_drafts() -> None:
    cut_string = CUDA_PROGRAM[:CUDA_PROGRAM.index("torch::Tensor scale(")]
    no_forward = CUDA_PROGRAM.replace("def forward(self, x):", "def run(self, x):")
    cut_class = CUDA_PROGRAM.replace("return ext.scale(x)", "return ext.scale(x,")
    cut_forward = CUDA_PROGRAM.replace("return ext.scale(x)", "y = ext.scale(x)")  # parses
    sketch = CUDA_PROGRAM[CUDA_PROGRAM.index("class ModelNew"):]       # no imports, no kernel
    misplaced = CUDA_PROGRAM.replace("\n\nclass ModelNew", "\nreturn ext\n\nclass ModelNew")  # parses only
    for program in (cut_string, no_forward, cut_class, cut_forward, sketch, misplaced):
        assert assert_streams_alike(PROSE + program + AFTER) == [], program[:60]
    # A string cut off earlier does not take a later complete program with it.
    text = PROSE + cut_string + AFTER + "\nLet me write the whole thing again.\n\n" + TRITON_PROGRAM + AFTER
    assert [b.source for b in assert_streams_alike(text)] == [TRITON_PROGRAM]


def test_two_drafts_are_two_candidates_in_order() -> None:
    text = (PROSE + CUDA_PROGRAM + AFTER + "\nOr with Triton:\n\n" + TRITON_PROGRAM + AFTER
            + "\nThe final version, fenced:\n\n" + fenced(SECOND) + "\nAnd one more time plainly.\n\n"
            + CUDA_PROGRAM.replace("2.0f", "3.0f") + AFTER)
    drafts = assert_streams_alike(text)
    assert [b.source for b in drafts] == [CUDA_PROGRAM, TRITON_PROGRAM, SECOND,
                                          CUDA_PROGRAM.replace("2.0f", "3.0f")]
    assert [b.fenced for b in drafts] == [False, False, True, False]
    assert [b.start for b in drafts] == sorted(b.start for b in drafts)
    # Programs written one right after the other: a second ModelNew class ends the first.
    back_to_back = PROSE + CUDA_PROGRAM + "\n" + TRITON_PROGRAM + AFTER
    assert [b.source for b in find_drafts(back_to_back)] == [CUDA_PROGRAM, TRITON_PROGRAM]
    assert extract_candidate(text) == CUDA_PROGRAM.replace("2.0f", "3.0f")


def test_every_bundled_candidate_written_without_a_fence_is_found_as_it_is() -> None:
    paths = sorted((PROBLEMS_DIR / "candidates").rglob("*.py"))
    assert len(paths) > 40
    for path in paths:
        source = path.read_text()
        text = PROSE + "Putting it all together:\n\n" + source.rstrip() + AFTER
        assert [b.source for b in find_drafts(text)] == [source.strip("\n") + "\n"], path.name
        assert len(find_drafts(text, ended=False)) == 1, path.name


def test_answers_keep_their_fenced_behaviour_and_gain_unfenced_programs() -> None:
    # An answer of plain code with a closing remark: the program, without the remark.
    assert extract_candidate(CUDA_PROGRAM + "\nThis launches one thread per element.\n") == CUDA_PROGRAM
    # Bare code that is not a complete program is still the answer (its evaluation says why).
    broken = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x:\n"
    assert extract_candidate(broken) == broken
    # A later fenced block still wins over an earlier unfenced program, and the reverse.
    assert extract_candidate(CUDA_PROGRAM + AFTER + fenced(SECOND)) == SECOND
    assert extract_candidate(fenced(SECOND) + PROSE + CUDA_PROGRAM) == CUDA_PROGRAM
