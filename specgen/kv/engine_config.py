"""Where the main job's KV pool lives, and the vLLM connector settings that put it there.

`specgen optimize --llm vllm` (and bench) choose with `--kv-pool`:

- `off`: no pool; a fork whose prefix the engine's own cache has evicted recomputes it;
- `host`: the pool in host memory (the CPU engine's case, or a GPU host with no spare GPU);
- `gpus`: the pool in spare memory of a profiling GPU (not the inference GPU), copied with the
  extension over P2P; refused when there is no such GPU;
- `auto` (the default): `gpus` where an evaluation GPU other than the inference GPU exists,
  else `host`.

Nothing here imports vLLM: `vllm_offload.py`, the spec itself, is loaded by vLLM inside its own
processes; this module only builds the settings it reads (`kv_connector_extra_config`).
"""
from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import UsageError

CHOICES = ("auto", "off", "host", "gpus")
SPEC_NAME = "SpecgenOffloadingSpec"
SPEC_MODULE = "specgen.kv.vllm_offload"
DEFAULT_POOL_GIB = 4.0
SEGMENT_BYTES = 64 << 20          # the unit the pool grows and shrinks by


@dataclass(frozen=True)
class KvPoolPlan:
    device: str                   # "" (off), "cpu" (host memory) or "cuda:N"
    pool_bytes: int
    reason: str                   # why this place, for the run's notice

    @property
    def on(self) -> bool:
        return bool(self.device)

    def extra_config(self, control_endpoint: str | None = None) -> dict:
        """vLLM's `kv_connector_extra_config` for specgen's offloading spec."""
        config = {"spec_name": SPEC_NAME, "spec_module_path": SPEC_MODULE,
                  "pool_device": self.device, "pool_bytes": self.pool_bytes,
                  "segment_bytes": min(SEGMENT_BYTES, self.pool_bytes),
                  # host memory is shared with everything else; a GPU keeps room for profiling
                  "headroom_bytes": (1 << 30) if self.device == "cpu" else (8 << 30)}
        if control_endpoint:
            config["control_endpoint"] = control_endpoint
        return config


def plan_kv_pool(choice: str, eval_devices: list[str], inference_device: str = "cuda:0",
                 pool_gib: float = DEFAULT_POOL_GIB) -> KvPoolPlan:
    """Where `--kv-pool CHOICE` puts the pool, given the evaluation devices and the GPU the engine
    runs on (the engine's own GPU is never taken for the pool)."""
    if choice not in CHOICES:
        raise UsageError(f"--kv-pool must be one of {', '.join(CHOICES)}, got {choice!r}")
    if not pool_gib > 0:
        raise UsageError(f"--kv-pool-gib must be > 0, got {pool_gib}")
    size = int(pool_gib * (1 << 30))
    if choice == "off":
        return KvPoolPlan("", 0, "switched off (--kv-pool off)")
    spare = [d for d in eval_devices if d.startswith("cuda:") and d != inference_device]
    if choice == "host" or (choice == "auto" and not spare):
        why = "asked for (--kv-pool host)" if choice == "host" else "no GPU besides the inference GPU"
        return KvPoolPlan("cpu", size, f"host memory: {why}")
    if not spare:
        raise UsageError(f"--kv-pool gpus needs an evaluation GPU besides the inference GPU "
                         f"{inference_device}; evaluation devices: {', '.join(eval_devices)}")
    return KvPoolPlan(spare[0], size, f"spare memory of profiling GPU {spare[0]}")
