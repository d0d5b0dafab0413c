"""A tiny random-weight reasoning-style model that vLLM's CPU engine loads in seconds.

Tests and benchmarks need a real model behind a real engine, and nothing can be downloaded here, so
the model is built locally: a Qwen2 with hidden size 64 and 2 layers (head size 32, the smallest the
CPU attention backend supports) and a byte-level BPE tokenizer trained by `tokenizers` on a small
corpus that ships in this module. The chat template opens the assistant turn with `<think>`, and
`<think>`/`</think>` are single tokens, so the model is driven exactly like a reasoning model.

Two choices make the random model convenient to test with:
- The output rows of special tokens and of non-ASCII bytes are zero, while the other rows have a
  large scale: their logit is 0 while the best ordinary token's logit is large and positive (the max
  of ~250 independent random projections), so generation never stops early on an end-of-text token
  and every piece of generated text is valid ASCII.
- Everything is seeded and the corpus is fixed, so two builds give identical files.

`build_tiny_model(directory)` is idempotent (`model_cache.build_once`): the finished model carries a marker file holding the
build recipe's version; a build goes to a temporary sibling directory and is renamed into place, so
concurrent callers (pytest workers, a benchmark beside a test run) never see a half-written model.
"""
from __future__ import annotations

from pathlib import Path

from specgen.engines.model_cache import build_once, cache_root

# Bump when anything below changes what is written, so cached copies are rebuilt.
TINY_MODEL_RECIPE_VERSION = 1
_MARKER_FILE = "specgen_tiny_model.json"

VOCAB_SIZE = 512
HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 2            # head size 32: the CPU attention backend's smallest
NUM_KV_HEADS = 1
MAX_POSITIONS = 16384    # long enough for multi-thousand-token reasoning plus forks
SEED = 1234

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
# Reasoning tags are added tokens but not "special": they stay in decoded text, as in real
# reasoning models, so a consumer can find where reasoning ends.
REASONING_TAGS = [THINK_START, THINK_END]

# Qwen-style chat markup; the generation prompt opens the reasoning section like reasoning models do.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)

# Training text for the tokenizer's merges: English reasoning about kernels plus Python/Triton/CUDA
# code, so the merges resemble what the real prompts contain and prompts tokenize compactly.
_CORPUS = [
    "Let me think about how to make this kernel faster. The reference model computes a matrix "
    "multiplication followed by a ReLU and a sum over the last dimension. We can fuse these into "
    "one kernel so that the intermediate tensor never goes to global memory.",
    "Wait, the inputs are float32 and the tolerance is 1e-4, so I should keep the accumulation in "
    "float32. The batch size is 128 and the hidden size is 4096. Each block handles one row.",
    "First, check the shapes. Then write the Triton kernel. The block size should be a power of two; "
    "let me try BLOCK_SIZE = 1024 and num_warps = 4. Actually that may spill registers.",
    "Hmm, but the softmax needs the maximum of the row before the exponent, otherwise it overflows. "
    "So the kernel does two passes: the first finds the max and the sum, the second writes the output.",
    "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n",
    "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
    "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return torch.relu(x)\n\n",
    "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
    "    def forward(self, x):\n        out = torch.empty_like(x)\n        n = x.numel()\n"
    "        grid = (triton.cdiv(n, 1024),)\n        relu_kernel[grid](x, out, n, BLOCK_SIZE=1024)\n"
    "        return out\n\n",
    "@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):\n"
    "    pid = tl.program_id(axis=0)\n    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n"
    "    mask = offsets < n_elements\n    x = tl.load(x_ptr + offsets, mask=mask)\n"
    "    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)\n\n",
    "def get_inputs():\n    return [torch.randn(batch_size, dim)]\n\n"
    "def get_init_inputs():\n    return []\n\n",
    "__global__ void relu_kernel(const float* x, float* out, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = fmaxf(x[i], 0.0f);\n}\n",
    "torch::Tensor relu_cuda(torch::Tensor x) {\n    auto out = torch::empty_like(x);\n"
    "    const int threads = 256;\n    const int blocks = (x.numel() + threads - 1) / threads;\n"
    "    return out;\n}\n",
    "The previous attempt was correct but only 1.1x faster than the reference. The profiler says the "
    "kernel is memory bound, so the next step is to vectorize the loads and to use more warps.",
    "Here is the final answer with the optimized kernel. It passes the correctness check and the "
    "speedup over the reference implementation is 2.3x on the given input shapes.",
]


def _build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(REASONING_TAGS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    wrapped.add_tokens(REASONING_TAGS, special_tokens=False)
    wrapped.chat_template = CHAT_TEMPLATE
    if len(wrapped) > VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer has {len(wrapped)} tokens, more than VOCAB_SIZE={VOCAB_SIZE}")
    return wrapped


def _silenced_token_ids(tokenizer) -> list[int]:
    """Ids the model must never emit: special/added tokens and tokens holding non-ASCII bytes."""
    byte_of_char = {ch: b for b, ch in _bytes_to_unicode().items()}
    silenced: list[int] = []
    added = {tok for tok in SPECIAL_TOKENS + REASONING_TAGS}
    for token, token_id in tokenizer.get_vocab().items():
        if token in added:
            silenced.append(token_id)
            continue
        raw = [byte_of_char.get(ch) for ch in token]
        if any(b is None or b >= 127 or (b < 32 and b not in (9, 10)) for b in raw):
            silenced.append(token_id)
    # Ids the tokenizer does not use at all (vocabulary padding) must not be emitted either.
    used = set(tokenizer.get_vocab().values())
    silenced.extend(i for i in range(VOCAB_SIZE) if i not in used)
    return sorted(set(silenced))


def _bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character map of GPT-2 style byte-level BPE."""
    byte_values = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    code_points = byte_values[:]
    shifted = 0
    for b in range(256):
        if b not in byte_values:
            byte_values.append(b)
            code_points.append(256 + shifted)
            shifted += 1
    return {b: chr(c) for b, c in zip(byte_values, code_points)}


def _build_model(tokenizer):  # -> transformers.Qwen2ForCausalLM
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=4 * HIDDEN_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # Peaky logits over ordinary tokens (see the module docstring); silenced rows stay at 0.
        model.lm_head.weight.normal_(mean=0.0, std=1.0)
        model.lm_head.weight[_silenced_token_ids(tokenizer)] = 0.0
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def build_tiny_model(directory: str | Path) -> str:
    """Build (once) the tiny model into `directory` and return its path as a string.

    `directory` is created if missing; if it already holds a finished build of the current recipe,
    nothing is done. The result loads with `vllm.LLM(model=path)`, `AsyncLLM` and
    `transformers.AutoModelForCausalLM.from_pretrained(path)`.
    """
    def build(staging: Path) -> None:
        tokenizer = _build_tokenizer()
        model = _build_model(tokenizer)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)

    return build_once(Path(directory), _MARKER_FILE,
                      {"recipe_version": TINY_MODEL_RECIPE_VERSION, "seed": SEED}, build)


def default_tiny_model_dir() -> Path:
    """Where tests and benchmarks cache the tiny model unless told otherwise."""
    return cache_root() / f"tiny-qwen2-v{TINY_MODEL_RECIPE_VERSION}"
