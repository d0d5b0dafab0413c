from __future__ import annotations

import os
from pathlib import Path

import torch

from specgen.engines import tiny_model
from specgen.engines.tiny_model import THINK_END, THINK_START, build_tiny_model


def test_chat_template_opens_reasoning(tiny_tokenizer) -> None:
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Make relu fast."}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    ids = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Make relu fast."}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert ids[-2] == tiny_tokenizer.convert_tokens_to_ids(THINK_START)


def test_think_tags_are_single_tokens_kept_in_text(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode(f"x{THINK_END}\nanswer", add_special_tokens=False)
    end_id = tiny_tokenizer.convert_tokens_to_ids(THINK_END)
    assert end_id in ids
    assert len(tiny_tokenizer.vocab) <= tiny_model.VOCAB_SIZE
    # Reasoning tags survive skip_special_tokens, as in real reasoning models.
    assert THINK_END in tiny_tokenizer.decode(ids, skip_special_tokens=True)


def test_byte_level_round_trip(tiny_tokenizer) -> None:
    text = "def f(x):\n\treturn x * 2  # ünïcode ✓\n"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


def test_build_is_idempotent_and_deterministic(tmp_path: Path, tiny_model_path: str) -> None:
    first = build_tiny_model(tmp_path / "m")
    weights = Path(first) / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "m") == first
    assert weights.stat().st_mtime_ns == stamp            # not rebuilt
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (Path(first) / name).read_bytes() == (Path(tiny_model_path) / name).read_bytes()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no staging left behind


def test_stale_build_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("{}")              # an interrupted or old build
    path = build_tiny_model(target)
    assert (Path(path) / "model.safetensors").is_file()
    assert (Path(path) / "specgen_tiny_model.json").is_file()


def test_greedy_text_is_ascii_and_never_ends_early(tiny_model_path: str, tiny_tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=64, do_sample=False)
    new_ids = out[0, prompt["input_ids"].shape[1]:].tolist()
    assert len(new_ids) == 64                              # no end-of-text before max_new_tokens
    special = {tiny_tokenizer.convert_tokens_to_ids(t) for t in tiny_model.SPECIAL_TOKENS + tiny_model.REASONING_TAGS}
    assert not special & set(new_ids)
    text = tiny_tokenizer.decode(new_ids)
    assert text.isascii() and "\ufffd" not in text
