from __future__ import annotations

import random

from specgen.traces.tokenizer import MAX_PIECE_CHARS, SPECIAL_TOKENS, PieceTokenizer, render_chat, split_pieces


def test_pieces_cover_text_and_respect_length() -> None:
    text = "Let me think.\n\n    def relu_kernel(x_ptr, n):  # ünï ✓ 12345\n</think>\nok"
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert "</think>" in pieces                                 # tags stay whole
    assert all(len(p) <= MAX_PIECE_CHARS for p in pieces if p not in SPECIAL_TOKENS)
    assert " me" in pieces                                      # words keep their leading space


def test_round_trip_on_arbitrary_text_with_and_without_vocab() -> None:
    rng = random.Random(7)
    alphabet = "ab \n\t_.:é✓😀1<>/think|{}"
    trained = PieceTokenizer()
    trained.encode("think about the kernel: a_b 12", extend=True)
    empty = PieceTokenizer()
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for tokenizer in (trained, empty):
            assert tokenizer.decode(tokenizer.encode(text)) == text


def test_ids_are_stable_across_a_saved_vocabulary() -> None:
    first = PieceTokenizer()
    text = "The kernel is memory bound; vectorize the loads."
    ids = first.encode(text, extend=True)
    again = PieceTokenizer(first.vocab)
    assert again.encode(text) == ids
    assert again.decode(ids) == text
    # Unknown text falls back to bytes, one token each, and still decodes exactly.
    unknown = again.encode(" zzzq")
    assert len(unknown) == len(" zzzq".encode())
    assert again.decode(unknown) == " zzzq"


def test_vocabulary_rejects_duplicates() -> None:
    import pytest

    with pytest.raises(ValueError, match="appears twice"):
        PieceTokenizer(["ab", "ab"])
    with pytest.raises(ValueError, match="outside"):
        PieceTokenizer(["ab"]).token_text(10_000)


def test_chat_prompt_opens_reasoning() -> None:
    tokenizer = PieceTokenizer()
    ids = tokenizer.chat_prompt_ids([{"role": "user", "content": "Make it fast"}])
    assert tokenizer.decode(ids) == render_chat([{"role": "user", "content": "Make it fast"}])
    assert ids[-2] == tokenizer.special_id("<think>")
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n<think>\n")
