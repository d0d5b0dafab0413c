from __future__ import annotations

from specgen.optimize.dedup import Deduplicator, fingerprint, normalize_source

A = '''import torch

class ModelNew(torch.nn.Module):
    """Fused version."""

    def forward(self, x):
        # one pass
        return torch.relu(x) * 2
'''
A_REFORMATTED = '''import torch
class ModelNew( torch.nn.Module ):
    def forward(self, x):   # the fused pass
        return (torch.relu(x) * 2)
'''
B = A.replace("* 2", "* 3")
BROKEN = "def f(:\n    return 1  # comment\n"
BROKEN_SPACED = "def f(:\n\n    return    1\n"


def test_comments_docstrings_and_formatting_do_not_matter() -> None:
    assert normalize_source(A) == normalize_source(A_REFORMATTED)
    assert fingerprint(A) == fingerprint(A_REFORMATTED)
    assert fingerprint(A) != fingerprint(B)


def test_sources_that_do_not_parse_are_compared_without_comments_and_whitespace() -> None:
    assert fingerprint(BROKEN) == fingerprint(BROKEN_SPACED)
    assert fingerprint(BROKEN) != fingerprint(BROKEN.replace("1", "2"))
    # An unterminated string makes tokenize fail too; comment lines still go.
    assert normalize_source('x = """\n# c\n') == normalize_source('x = """\n')


def test_strings_keep_their_content() -> None:
    cuda_a = 'src = """__global__ void k() { int a = 1; }"""\n'
    cuda_b = 'src = """__global__ void k() { int a = 2; }"""\n'
    assert fingerprint(cuda_a) != fingerprint(cuda_b)


def test_deduplicator_names_the_first_copy() -> None:
    dedup = Deduplicator()
    assert dedup.admit(A, "c000").duplicate_of is None
    assert dedup.admit(B, "c001").duplicate_of is None
    again = dedup.admit(A_REFORMATTED, "c002")
    assert again.duplicate_of == "c000" and again.fingerprint == fingerprint(A)
    assert len(dedup) == 2
