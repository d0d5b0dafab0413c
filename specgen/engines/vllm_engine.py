"""vLLM in-process backend: `AsyncLLM` with prefix caching, prompts always given as token ids.

The engine core runs in a child process even here (vLLM's design); this object lives in the
caller's event loop and streams `RequestOutput` deltas. A fork's prompt is the reasoning stream's
exact token ids plus a suffix, so it hits the prefix cache blocks the reasoning stream filled
(including blocks produced by decoding), and each fork's first delta reports `num_cached_tokens`.

vLLM is imported only inside `start()`: importing it costs seconds and needs the `vllm` extra.
A script that starts this engine must guard its entry point with `if __name__ == "__main__":`
because the engine core is started with multiprocessing's spawn method.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any, AsyncIterator

from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.engines.request_tracking import ActiveRequest, ActiveRequests
from specgen.engines.token_engine import TokenizedEngine
from specgen.engines.tokenizer_loading import HFTokenizer


class VLLMEngine(TokenizedEngine):
    """vLLM's `AsyncLLM` in this process.

    Args:
        model: a model directory (or a name resolvable offline by vLLM).
        tokenizer: tokenizer directory if it differs from `model`.
        max_model_len: longest prompt + generation; defaults to the model's own limit.
        kv_cache_gib: KV cache size in GiB (vLLM's `kv_cache_memory_bytes`); on the CPU engine the
            `VLLM_CPU_KVCACHE_SPACE` environment variable, if set, takes precedence.
        dtype: weights/activations dtype ("auto", "float32", "bfloat16", ...).
        enable_prefix_caching: keep True for forks to reuse the reasoning prefix.
        startup_timeout_s: how long `start()` waits for the engine to come up.
        engine_args: any further `AsyncEngineArgs` fields, passed through unchanged.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        dtype: str = "auto",
        enable_prefix_caching: bool = True,
        seed: int = 0,
        startup_timeout_s: float = 600.0,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self._tokenizer = HFTokenizer(tokenizer or model, engine_name=self.name)
        self._max_model_len = max_model_len
        self._kv_cache_gib = kv_cache_gib
        self._dtype = dtype
        self._enable_prefix_caching = enable_prefix_caching
        self._seed = seed
        self._startup_timeout_s = startup_timeout_s
        self._extra_engine_args = dict(engine_args or {})
        self._llm: Any = None               # vllm.v1.engine.async_llm.AsyncLLM once started
        self._start_lock: asyncio.Lock | None = None
        self._requests = ActiveRequests(self.name)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def async_llm(self) -> Any:
        """The underlying `AsyncLLM` (for benchmarks and tests that compare against raw vLLM)."""
        if self._llm is None:
            raise EngineError("vllm: engine not started; call `await engine.start()` first")
        return self._llm

    def configure(self, **engine_args: Any) -> None:
        """Further `AsyncEngineArgs` fields (e.g. `kv_transfer_config`), before `start()`: settings
        known only once the rest of the job is up, such as the KV pool's control endpoint."""
        if self._llm is not None:
            raise EngineError("vllm: configure() after the engine started has no effect")
        self._extra_engine_args.update(engine_args)

    async def start(self) -> None:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._llm is not None:
                return
            try:
                self._llm = await asyncio.wait_for(
                    asyncio.to_thread(self._build_engine), timeout=self._startup_timeout_s
                )
            except asyncio.TimeoutError:
                raise EngineError(
                    f"vllm: engine for {self.model!r} did not come up within {self._startup_timeout_s:.0f} s "
                    "(VLLMEngine(startup_timeout_s=...))"
                ) from None

    def _build_engine(self) -> Any:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(
                f"vllm: cannot import vLLM ({exc}); install it (`make install-vllm` on CPU machines)"
            ) from exc
        kwargs: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self._tokenizer.path,
            dtype=self._dtype,
            enable_prefix_caching=self._enable_prefix_caching,
            seed=self._seed,
            disable_log_stats=True,
        )
        if self._max_model_len is not None:
            kwargs["max_model_len"] = self._max_model_len
        if self._kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(self._kv_cache_gib * (1 << 30))
        kwargs.update(self._extra_engine_args)
        if self.model.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(self.model)):
            raise EngineError(f"vllm: model directory {self.model!r} does not exist")
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise EngineError(f"vllm: bad engine argument ({exc}); check VLLMEngine(engine_args=...)") from exc
        except Exception as exc:
            raise EngineError(f"vllm: engine arguments for model {self.model!r} rejected: {exc}") from exc
        try:
            return AsyncLLM.from_engine_args(args)
        except Exception as exc:  # vLLM raises many types here; all mean "could not start"
            raise EngineError(f"vllm: engine for model {self.model!r} failed to start: {exc}") from exc

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        for request_id in self._requests.ids():
            self._requests.mark_aborted(request_id)
        await asyncio.to_thread(llm.shutdown)
        # AsyncLLM.__del__ calls shutdown() again; at interpreter exit that runs after vLLM's module
        # globals are gone and prints a TypeError. The engine is already down: make it a no-op.
        llm.shutdown = lambda timeout=None: None

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix block (benchmarks and tests compare cached against uncached)."""
        if not await self.async_llm.reset_prefix_cache():
            raise EngineError("vllm: reset_prefix_cache refused (requests still running hold blocks)")

    # -- generation (encode/decode/reason/fork come from TokenizedEngine) ------------------------

    async def abort(self, request_id: str) -> None:
        request = self._requests.mark_aborted(request_id)
        if request is not None and self._llm is not None:
            await self._llm.abort(request_id)

    def _sampling_params(self, params: GenerationParams) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )

    def _stream(
        self, request_id: str, kind: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[TokenDelta]:
        # The id is claimed at call time, so a duplicate fails at once and an abort that comes before
        # the caller's first read still counts. Iterate or `aclose()` every stream to release its id.
        if not prompt_ids:
            raise EngineError(f"vllm: {kind} {request_id!r} has an empty prompt")
        llm = self.async_llm
        request = self._requests.open(request_id, kind)
        return self._generate(llm, request, prompt_ids, params)

    async def _generate(
        self, llm: Any, request: ActiveRequest, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[TokenDelta]:
        from vllm.inputs import TokensPrompt

        kind, request_id = request.kind, request.request_id
        if request.aborted:  # aborted before the first read: never submit it
            self._requests.close(request)
            yield request.abort_delta()
            return
        first = True
        generator = llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), self._sampling_params(params), request_id)
        try:
            async for output in generator:
                if request.aborted:
                    break
                completion = output.outputs[0]
                delta = TokenDelta(
                    token_ids=list(completion.token_ids),
                    text=completion.text,
                    t=time.monotonic(),
                    finished=output.finished,
                    finish_reason=completion.finish_reason if output.finished else None,
                )
                if first:
                    delta.num_cached_tokens = output.num_cached_tokens or 0
                    delta.num_prompt_tokens = len(prompt_ids)
                    first = False
                yield delta
                if output.finished:
                    return
            if request.aborted:
                yield request.abort_delta()
                return
            raise EngineError(f"vllm: stream of {kind} {request_id!r} ended without a finished output")
        except EngineError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if request.aborted:
                yield request.abort_delta()
                return
            raise EngineError(self._explain(kind, request_id, len(prompt_ids), params, exc)) from exc
        finally:
            self._requests.close(request)
            # Closing vLLM's generator aborts the request there if it is still running.
            await generator.aclose()

    def _explain(self, kind: str, request_id: str, prompt_len: int, params: GenerationParams, exc: Exception) -> str:
        cause = exc.__cause__ or exc
        text = f"{type(cause).__name__}: {cause}"
        if "EngineDead" in type(exc).__name__ or "EngineDead" in type(cause).__name__:
            return f"vllm: the engine process died during {kind} {request_id!r} ({text}); restart the engine"
        if "max_model_len" in text or "maximum context length" in text or "too long" in text:
            return (
                f"vllm: {kind} {request_id!r} does not fit: prompt {prompt_len} tokens + max_tokens "
                f"{params.max_tokens} ({text}); raise VLLMEngine(max_model_len=...) or shorten the prompt"
            )
        return f"vllm: {kind} {request_id!r} failed: {text}"


def command_line_engine(model: str, tokenizer: str | None = None) -> VLLMEngine:
    """The engine `specgen optimize/bench --llm vllm` start, with defaults that fit the host.

    Without a GPU, vLLM's CPU engine sizes its KV cache as a share of one NUMA node's memory and
    refuses to start when less than that share is free (common on small hosts); a fixed 2 GiB
    cache (or `VLLM_CPU_KVCACHE_SPACE`) and eager mode (compiling the model takes minutes on a
    CPU) start everywhere the tests run."""
    try:
        import torch

        on_gpu = torch.cuda.is_available()
    except ImportError:
        on_gpu = False
    if on_gpu:
        return VLLMEngine(model, tokenizer=tokenizer)
    return VLLMEngine(model, tokenizer=tokenizer,
                      kv_cache_gib=None if os.environ.get("VLLM_CPU_KVCACHE_SPACE") else 2.0,
                      engine_args={"enforce_eager": True})
