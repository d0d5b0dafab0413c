"""How long an LLM engine takes: the timing model of modelled replays, `specgen bench` and the
simulator.

Three parts, each overridable per run (`TimingModel.from_overrides`, `--timing NAME=VALUE`):

- **Decode**: tokens per second *per request* as a function of the number of sequences the engine
  runs at once, `r1` up to `knee` sequences and `r1 * (knee / n) ** beta` beyond. Flat first
  (decoding is bound by reading the weights, shared by the batch), then falling (bound by compute).
  Defaults from published serving figures for a large reasoning model: Qwen3-235B FP8 with TP8 ran
  55-57 tokens/s per request at 8-32 concurrent requests on 8x H100 (r1 = 56, knee = 32) and 26.7
  tokens/s at 128 concurrent on 8x H200 (beta = log(56 / 26.7) / log(128 / 32) = 0.53).
  Forks that run on the reasoner's engine raise n, so they slow the reasoning: contention comes out
  of the same curve.
- **Prefill** (time to first token): the prompt tokens not in the prefix cache, at `prefill_tps`
  tokens/s, plus `ttft_floor_s`; a cached prefix costs nothing; tokens fetched from the remote KV
  pool cost `1 / kv_fetch_tps` each. `prefill_tps` has no published figure behind it for that model
  and is stated as an assumption (override it with a measured one); `kv_fetch_tps` is
  `prefill_tps` times the pool's measured advantage (an 8K-token whole-model prefix fetched 169x
  faster than its prefill on H200, BENCHMARKS.md, "KV transfer").
- The curve's *shape* is checked against vLLM's CPU engine here (tools/decode_curve_bench.py:
  SmolLM2-135M at 1, 2, 4 and 8 concurrent sequences, the model fitted and compared point by point).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from specgen.errors import UsageError

KV_POOL_ADVANTAGE = 169.0        # prefix fetch vs prefill, measured (BENCHMARKS.md, KV transfer)


@dataclass(frozen=True)
class TimingModel:
    r1: float = 56.0             # decode tokens/s per request, up to `knee` running sequences
    knee: float = 32.0           # sequences the engine batches before per-request speed falls
    beta: float = 0.53           # how fast it falls past the knee: (knee / n) ** beta
    prefill_tps: float = 8000.0  # prompt tokens/s of prefill (assumed; see the module docstring)
    ttft_floor_s: float = 0.05   # scheduling and the first decode step, whatever the prompt
    kv_fetch_tps: float = 8000.0 * KV_POOL_ADVANTAGE  # remote-pool tokens/s into the local cache
    source: str = "published serving figures (Qwen3-235B FP8, 8x H100/H200)"

    def __post_init__(self) -> None:
        for name in ("r1", "knee", "prefill_tps", "kv_fetch_tps"):
            if not getattr(self, name) > 0:
                raise UsageError(f"timing model: {name} must be > 0, got {getattr(self, name)}")
        if self.beta < 0 or self.ttft_floor_s < 0:
            raise UsageError("timing model: beta and ttft_floor_s must be >= 0")

    def decode_tps(self, running: int) -> float:
        """Tokens/s of one request while `running` sequences (itself included) decode."""
        n = max(1, running)
        return self.r1 if n <= self.knee else self.r1 * (self.knee / n) ** self.beta

    def ttft_s(self, prompt_tokens: int, cached_tokens: int = 0, fetched_tokens: int = 0) -> float:
        """Time to the first token of a request whose prompt has `cached_tokens` in the local
        prefix cache and `fetched_tokens` more in the remote KV pool."""
        if not 0 <= cached_tokens + fetched_tokens <= prompt_tokens:
            raise ValueError("cached + fetched tokens must lie within the prompt")
        uncached = prompt_tokens - cached_tokens - fetched_tokens
        return self.ttft_floor_s + uncached / self.prefill_tps + fetched_tokens / self.kv_fetch_tps

    def scaled(self, decode: float = 1.0) -> "TimingModel":
        """The same model with every decode rate multiplied by `decode` (sensitivity runs)."""
        return replace(self, r1=self.r1 * decode)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_overrides(cls, overrides: list[str] | dict[str, str] | None = None,
                       base: "TimingModel | None" = None) -> "TimingModel":
        """`base` (default: the defaults) with `NAME=VALUE` overrides; an unknown name or a value
        that is not a number is a UsageError naming it."""
        base = base or cls()
        items = overrides.items() if isinstance(overrides, dict) else \
            [_split(item) for item in overrides or []]
        known = {f.name for f in fields(cls)} - {"source"}
        changes: dict[str, float] = {}
        for name, value in items:
            if name not in known:
                raise UsageError(f"timing model: unknown setting {name!r} (one of {', '.join(sorted(known))})")
            try:
                number = float(value)
            except ValueError:
                raise UsageError(f"timing model: {name}={value!r} is not a number") from None
            if not math.isfinite(number):
                raise UsageError(f"timing model: {name}={value!r} is not finite")
            changes[name] = number
        if not changes:
            return base
        return replace(base, **changes, source=f"{base.source}, overridden: "
                       + ", ".join(f"{k}={v:g}" for k, v in changes.items()))


def _split(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise UsageError(f"timing model: expected NAME=VALUE, got {item!r}")
    name, value = item.split("=", 1)
    return name.strip(), value.strip()


def fit_decode_curve(points: dict[int, float]) -> TimingModel:
    """The (r1, knee, beta) that fit measured per-request rates {running: tokens/s} best in the
    least-squares sense of log rates; a grid over the knee, beta in closed form for each."""
    if not points:
        raise ValueError("no points to fit")
    ns = sorted(points)
    best: tuple[float, float, float, float] | None = None
    for knee in [1.0 + 0.25 * i for i in range(int(4 * (max(ns) - 1)) + 1)]:
        steep = [n for n in ns if n > knee]
        # log r(n) = log r1 - beta * max(0, log(n / knee)): linear in (log r1, beta).
        xs = [math.log(n / knee) if n > knee else 0.0 for n in ns]
        ys = [math.log(points[n]) for n in ns]
        if not steep:
            log_r1, beta = sum(ys) / len(ys), 0.0
        else:
            mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
            sxx = sum((x - mean_x) ** 2 for x in xs)
            beta = -sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
            beta = max(beta, 0.0)
            log_r1 = mean_y + beta * mean_x
        error = sum((log_r1 - beta * x - y) ** 2 for x, y in zip(xs, ys))
        if best is None or error < best[0] - 1e-12:
            best = (error, math.exp(log_r1), knee, beta)
    assert best is not None
    _, r1, knee, beta = best
    return TimingModel(r1=r1, knee=knee, beta=beta, source="fitted to measured rates")
