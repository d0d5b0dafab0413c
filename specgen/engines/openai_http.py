"""Backend for any OpenAI-compatible HTTP server: streaming `/v1/completions` with token-id prompts.

Works with `vllm serve` (see `specgen.engines.serve_vllm` on CPU-only machines), SGLang and
llama.cpp's server: all three accept `"prompt": [token ids]`, so fork prompts reach the server as the
exact ids of the reasoning stream and the server's prefix cache applies. Tokenizing happens here,
with the served model's tokenizer from local files.

Token ids of the generated text come from the stream itself where the server sends them (vLLM:
`"return_token_ids": true` puts `token_ids` in each chunk; llama.cpp: `tokens`). A server that
sends only text gets its text re-encoded here; the ids are then not guaranteed to be the ones the
model produced (`exact_token_ids` turns False and a warning is logged once), which costs forks their
prefix-cache hits but keeps them correct.

Prefix-cache hits are reported from the final usage chunk (`usage.prompt_tokens_details.cached_tokens`);
vLLM sends it when started with `--enable-prompt-tokens-details`. Abort closes the HTTP response:
all three servers abort a request whose client went away.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Literal

from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.engines.request_tracking import ActiveRequest, ActiveRequests
from specgen.engines.token_engine import TokenizedEngine
from specgen.engines.tokenizer_loading import HFTokenizer

log = logging.getLogger(__name__)

PromptFormat = Literal["token_ids", "text"]


class OpenAICompatEngine(TokenizedEngine):
    """A model served over HTTP by an OpenAI-compatible server.

    Args:
        base_url: the server's API root, e.g. "http://127.0.0.1:8000/v1" ("/v1" is added if missing).
        model: the model name the server serves (as listed by GET /v1/models).
        tokenizer: a local directory with the served model's tokenizer.
        api_key: sent as a bearer token if given.
        prompt_format: "token_ids" (exact, keeps prefix-cache hits) or "text" for servers that refuse
            token-id prompts (the prompt is decoded to text and the server re-tokenizes it).
        connect_timeout_s: how long to wait for a TCP connection.
        read_timeout_s: the longest silence allowed inside a stream (no chunk at all).
        extra_body: further JSON fields for every completion request (server-specific options).
        max_connections: concurrent HTTP connections (one per live generation); forks beyond it
            wait client-side for a free connection.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: str,
        api_key: str | None = None,
        prompt_format: PromptFormat = "token_ids",
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 300.0,
        extra_body: dict[str, Any] | None = None,
        max_connections: int = 256,
    ) -> None:
        if prompt_format not in ("token_ids", "text"):
            raise EngineError(f"openai: prompt_format must be 'token_ids' or 'text', got {prompt_format!r}")
        root = base_url.rstrip("/")
        if not root.startswith(("http://", "https://")):
            raise EngineError(f"openai: base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.prompt_format: PromptFormat = prompt_format
        self.exact_token_ids = True
        self._tokenizer = HFTokenizer(tokenizer, engine_name=self.name)
        self._api_key = api_key
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._extra_body = dict(extra_body or {})
        self._max_connections = max_connections
        self._session: Any = None           # aiohttp.ClientSession once started
        self._responses: dict[str, Any] = {}  # request id -> aiohttp response being read
        self._requests = ActiveRequests(self.name)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and check that the server serves `model` (a clear error otherwise)."""
        if self._session is not None:
            return
        import aiohttp

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        session = aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(limit=self._max_connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s, sock_read=self._read_timeout_s),
        )
        try:
            served = await self._served_models(session)
        except BaseException:
            await session.close()
            raise
        if self.model not in served:
            await session.close()
            raise EngineError(
                f"openai: the server at {self.base_url} does not serve model {self.model!r}; it serves "
                f"{served}; set the model name to one of them"
            )
        self._session = session

    async def _served_models(self, session: Any) -> list[str]:
        import aiohttp

        url = f"{self.base_url}/models"
        try:
            async with session.get(url) as response:
                body = await response.text()
                if response.status in (401, 403):
                    raise EngineError(f"openai: {url} refused the request ({response.status}); check api_key")
                if response.status != 200:
                    raise EngineError(f"openai: GET {url} answered {response.status}{_logged(url, body)}; "
                                      "is base_url right?")
        except aiohttp.ClientConnectorError as exc:
            raise EngineError(
                f"openai: cannot reach the server at {self.base_url} ({exc.os_error or exc}); "
                "is it running, and is base_url right?"
            ) from exc
        except asyncio.TimeoutError as exc:
            raise EngineError(
                f"openai: no answer from {url} within the timeout "
                f"(OpenAICompatEngine(connect_timeout_s={self._connect_timeout_s}, read_timeout_s={self._read_timeout_s}))"
            ) from exc
        except aiohttp.ClientError as exc:
            raise EngineError(f"openai: GET {url} failed ({type(exc).__name__}: {exc}); is base_url right?") from exc
        try:
            return [entry["id"] for entry in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"openai: GET {url} did not return an OpenAI model list{_logged(url, body)}; "
                              "is base_url right?") from exc

    async def close(self) -> None:
        for request_id in self._requests.ids():
            await self.abort(request_id)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- generation (encode/decode/reason/fork come from TokenizedEngine) ------------------------

    async def abort(self, request_id: str) -> None:
        if self._requests.mark_aborted(request_id) is None:
            return
        response = self._responses.pop(request_id, None)
        if response is not None:
            # Dropping the connection is how a client aborts: the server cancels the request.
            response.close()

    def _stream(self, request_id: str, kind: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        if not prompt_ids:
            raise EngineError(f"openai: {kind} {request_id!r} has an empty prompt")
        if self._session is None:
            raise EngineError("openai: engine not started; call `await engine.start()` first")
        request = self._requests.open(request_id, kind)
        return self._generate(request, prompt_ids, params)

    def _body(self, prompt_ids: list[int], params: GenerationParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids if self.prompt_format == "token_ids" else self.decode(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,       # vLLM: ids of each chunk's tokens
            "return_tokens": True,          # llama.cpp: the same, under another name
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.ignore_eos:
            body["ignore_eos"] = True
        body.update(self._extra_body)
        return body

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        """POST `body`; sent once more when the server closed the connection without answering.

        aiohttp reuses an idle keep-alive connection for up to 15 s; servers may close theirs
        sooner (`vllm serve` after 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE). A request sent on a
        connection the server has just closed, or closed while this event loop was too busy to
        notice, fails at once with ServerDisconnectedError, unread by the server; aiohttp resends
        only idempotent methods, never a POST. The second attempt takes an open connection or a
        new one.
        """
        import aiohttp

        try:
            return await self._session.post(url, json=body)
        except aiohttp.ServerDisconnectedError:
            return await self._session.post(url, json=body)

    async def _generate(self, request: ActiveRequest, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        import aiohttp

        kind, request_id = request.kind, request.request_id
        url = f"{self.base_url}/completions"
        what = f"{kind} {request_id!r} at {url}"
        received = 0
        try:
            if request.aborted:
                yield request.abort_delta()
                return
            try:
                response = await self._post(url, self._body(prompt_ids, params))
            except aiohttp.ClientConnectorError as exc:
                raise EngineError(
                    f"openai: cannot reach the server for {what} ({exc.os_error or exc}); is it still running?"
                ) from exc
            self._responses[request_id] = response
            if request.aborted:  # aborted while connecting
                response.close()
                yield request.abort_delta()
                return
            if response.status != 200:
                raise EngineError(f"openai: {what} was refused ({response.status})"
                                  f"{self._error_text(url, await response.text())}")
            finish_reason: str | None = None
            prompt_tokens: int | None = None
            cached_tokens: int | None = None
            saw_done = False
            async for raw_line in response.content:
                if request.aborted:
                    break
                line = raw_line.strip()
                if not line or line.startswith(b":"):
                    continue                          # SSE keep-alive or comment
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    saw_done = True
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError as exc:
                    raise EngineError(f"openai: {what} sent a malformed chunk"
                                      f"{_logged(url, payload.decode(errors='replace'))}") from exc
                if "error" in chunk:
                    raise EngineError(f"openai: {what} failed on the server"
                                      f"{self._error_text(url, json.dumps(chunk))}")
                usage = chunk.get("usage")
                if usage:
                    prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                    details = usage.get("prompt_tokens_details") or {}
                    cached_tokens = details.get("cached_tokens", cached_tokens)
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    token_ids = self._chunk_token_ids(choice, text)
                    received += len(token_ids)
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
                    if token_ids or text:
                        yield TokenDelta(token_ids=token_ids, text=text, t=time.monotonic())
            if request.aborted:
                yield request.abort_delta()
                return
            if finish_reason is None:
                raise EngineError(
                    f"openai: the stream of {what} was cut after {received} tokens (no finish_reason"
                    f"{'' if saw_done else ' and no [DONE]'}); the server may have crashed or dropped the connection"
                )
            yield TokenDelta(
                token_ids=[], text="", t=time.monotonic(), finished=True, finish_reason=finish_reason,
                num_cached_tokens=cached_tokens, num_prompt_tokens=prompt_tokens,
            )
        except EngineError:
            if request.aborted:
                yield request.abort_delta()
                return
            raise
        except asyncio.TimeoutError as exc:
            if request.aborted:
                yield request.abort_delta()
                return
            raise EngineError(
                f"openai: no data on the stream of {what} for {self._read_timeout_s} s "
                "(OpenAICompatEngine(read_timeout_s=...))"
            ) from exc
        except (aiohttp.ClientError, ConnectionError) as exc:
            if request.aborted:
                yield request.abort_delta()
                return
            raise EngineError(
                f"openai: the stream of {what} was cut after {received} tokens ({type(exc).__name__}: {exc}); "
                "the server may have crashed or dropped the connection"
            ) from exc
        finally:
            self._requests.close(request)
            response = self._responses.pop(request_id, None)
            if response is not None:
                response.close()

    def _chunk_token_ids(self, choice: dict[str, Any], text: str) -> list[int]:
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = choice.get("tokens")
        if isinstance(token_ids, list) and all(isinstance(t, int) for t in token_ids):
            return token_ids
        if not text:
            return []
        if self.exact_token_ids:
            self.exact_token_ids = False
            log.warning(
                "openai: %s sends no token ids in its stream; re-encoding its text, so fork prompts may "
                "miss the prefix cache", self.base_url,
            )
        return self.encode(text)

    @staticmethod
    def _error_text(url: str, body: str) -> str:
        """The server's own message in an OpenAI-format error (it says what to fix: a prompt too
        long, a token out of vocabulary); any other answer is logged here, not quoted."""
        try:
            error = json.loads(body).get("error")
            if isinstance(error, dict):
                return f": {error.get('message', error)}"
            if error:
                return f": {error}"
        except (ValueError, AttributeError):
            pass
        return _logged(url, body)


def _logged(url: str, body: str) -> str:
    """Log an answer that is not what the protocol says and return the words that point to it.

    Its bytes stay out of the error: an error travels to whoever asked for the job, and the answer
    of whatever sits at a URL is this host's to see."""
    log.warning("openai: the answer of %s (%d bytes): %.2000s", url, len(body), body)
    return f" (an answer of {len(body)} bytes, logged on the host that ran the engine)"
