from __future__ import annotations

from specgen.optimize.extraction import (
    CodeBlockScanner,
    defines_model_new,
    extract_candidate,
    extract_fork_candidate,
    find_code_blocks,
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
