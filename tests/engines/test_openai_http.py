"""The OpenAI-compatible backend against a real `vllm serve` on 127.0.0.1 (started by the launcher)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Iterator

import pytest

from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.engines.openai_http import OpenAICompatEngine
from tests.engines.conftest import VllmServer, free_port, vllm_serve

pytestmark = pytest.mark.vllm

SERVED_NAME = "tiny-reasoner"
SUFFIX = "</think>\n\nI will now write the final ModelNew code.\n"


@pytest.fixture(scope="module")
def vllm_server(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    with vllm_serve(tiny_model_path, SERVED_NAME, tmp_path_factory.mktemp("vllm-serve"),
                    "--max-model-len", "8192", "--dtype", "float32", "--enable-prefix-caching",
                    "--enable-prompt-tokens-details", "--enforce-eager") as server:
        yield server


@pytest.fixture(scope="module")
def http_engine(loop, vllm_server: VllmServer, tiny_model_path: str) -> Iterator[OpenAICompatEngine]:
    engine = OpenAICompatEngine(vllm_server.base_url, SERVED_NAME, tokenizer=tiny_model_path, read_timeout_s=60)
    loop.run(engine.start())
    yield engine
    loop.run(engine.close())


async def _collect(stream) -> tuple[list[TokenDelta], list[int]]:
    deltas = [delta async for delta in stream]
    return deltas, [t for d in deltas for t in d.token_ids]


def test_launcher_serves_and_streams_exact_token_ids(loop, http_engine: OpenAICompatEngine) -> None:
    engine = http_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Write a fast ReLU kernel."}])

    async def run() -> None:
        deltas, ids = await _collect(engine.reason("http-reason", prompt, GenerationParams(max_tokens=64)))
        assert len(ids) == 64 and engine.exact_token_ids      # ids came from the server's stream
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert deltas[-1].num_prompt_tokens == len(prompt)
        assert "".join(d.text for d in deltas) == engine.decode(ids)
        # A fork sent as ids continues exactly like the same ids sent as one prompt.
        suffix = engine.encode(SUFFIX)
        _, forked = await _collect(engine.fork("http-fork", prompt, ids[:40], suffix, GenerationParams(max_tokens=16)))
        _, direct = await _collect(engine.reason("http-direct", prompt + ids[:40] + suffix, GenerationParams(max_tokens=16)))
        assert forked == direct and len(forked) == 16

    loop.run(run(), timeout_s=180)


def test_fork_is_served_from_the_servers_prefix_cache(loop, http_engine: OpenAICompatEngine) -> None:
    engine = http_engine
    content = " ".join(f"step{i % 89} of the plan" for i in range(500))
    prompt = engine.chat_prompt_ids([{"role": "user", "content": content}])
    suffix = engine.encode(SUFFIX)

    async def run() -> None:
        reasoning: list[int] = []
        fork_result: list[tuple[list[TokenDelta], list[int]]] = []
        async for delta in engine.reason("http-cache-reason", prompt, GenerationParams(max_tokens=400)):
            reasoning += delta.token_ids
            if len(reasoning) >= 300 and not fork_result:
                fork_result.append(await _collect(engine.fork(
                    "http-cache-fork", prompt, reasoning[:300], suffix, GenerationParams(max_tokens=8)
                )))
        deltas, ids = fork_result[0]
        final = deltas[-1]
        assert final.num_prompt_tokens == len(prompt) + 300 + len(suffix)
        assert final.num_cached_tokens is not None and final.num_cached_tokens > len(prompt)
        assert len(ids) == 8

    loop.run(run(), timeout_s=180)


def test_abort_closes_the_request_and_server_keeps_serving(loop, http_engine: OpenAICompatEngine, vllm_server: VllmServer) -> None:
    engine = http_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Think for a very long time."}])

    async def run() -> None:
        received = 0
        after: list[TokenDelta] = []
        aborted_at = None
        async for delta in engine.reason("http-abort", prompt, GenerationParams(max_tokens=7000)):
            if aborted_at is not None:
                after.append(delta)
                continue
            received += len(delta.token_ids)
            if received >= 20:
                aborted_at = time.monotonic()
                await engine.abort("http-abort")
        assert len(after) == 1 and after[0].finish_reason == "abort" and not after[0].token_ids
        assert after[0].t - aborted_at < 0.05
        for _ in range(200):               # the server notices the closed connection and aborts
            if vllm_server.running_requests() == 0:
                break
            await asyncio.sleep(0.05)
        assert vllm_server.running_requests() == 0
        _, ids = await _collect(engine.reason("http-abort", prompt, GenerationParams(max_tokens=10)))
        assert len(ids) == 10

    loop.run(run(), timeout_s=180)


def test_many_concurrent_forks_over_http(loop, vllm_server: VllmServer, http_engine: OpenAICompatEngine) -> None:
    engine = http_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Optimize softmax."}])
    suffix = engine.encode(SUFFIX)

    # Each fork long enough to outlast the API server's admission of the others, even on a loaded
    # machine (it admits requests one by one; forks shorter than that gap would finish before the
    # next arrives, and run one after another however the client sent them).
    forks, tokens = 16, 1024

    async def run() -> None:
        _, reasoning = await _collect(engine.reason("http-many-reason", prompt, GenerationParams(max_tokens=512)))
        steps_before = vllm_server.engine_steps()
        results = await asyncio.gather(*(
            _collect(engine.fork(f"http-many-{p}", prompt, reasoning[:p], suffix,
                                 GenerationParams(max_tokens=tokens, ignore_eos=True)))
            for p in range(32, 32 * forks + 1, 32)
        ))
        steps = vllm_server.engine_steps() - steps_before
        assert len(results) == forks
        assert all(len(ids) == tokens and deltas[-1].finish_reason == "length" for deltas, ids in results)
        # The forks ran side by side in the server, not one after another: one after another, the
        # engine would have taken a step per generated token (forks x tokens); batched, a step
        # decodes a token of every running fork. Counted by the engine itself, so no poll can miss
        # it. At most (forks - 1) x tokens steps means at least a whole fork's tokens came in steps
        # shared with others. (Not all 16 at one instant: the API server admits requests one by
        # one, and on a loaded 2-core machine that took half the forks' time: 9,217 steps of 16,384
        # in one run, where the bound was forks x tokens / 2.)
        assert tokens <= steps <= (forks - 1) * tokens, (steps, forks * tokens)

    loop.run(run(), timeout_s=180)


def test_text_prompts_for_servers_that_refuse_ids(loop, vllm_server: VllmServer, http_engine: OpenAICompatEngine, tiny_model_path: str) -> None:
    text_engine = OpenAICompatEngine(vllm_server.base_url, SERVED_NAME, tokenizer=tiny_model_path, prompt_format="text")
    prompt = http_engine.chat_prompt_ids([{"role": "user", "content": "Make GELU fast."}])

    async def run() -> None:
        await text_engine.start()
        try:
            _, by_text = await _collect(text_engine.reason("text-prompt", prompt, GenerationParams(max_tokens=12)))
        finally:
            await text_engine.close()
        _, by_ids = await _collect(http_engine.reason("id-prompt", prompt, GenerationParams(max_tokens=12)))
        assert by_text == by_ids

    loop.run(run(), timeout_s=120)


def test_server_side_rejections_are_clear(loop, http_engine: OpenAICompatEngine) -> None:
    async def run() -> None:
        with pytest.raises(EngineError, match="refused \\(400\\).*out of vocabulary|out of vocabulary"):
            await _collect(http_engine.reason("http-bad-id", [5, 99999], GenerationParams(max_tokens=4)))
        with pytest.raises(EngineError, match="maximum context length|max_model_len"):
            await _collect(http_engine.reason("http-too-long", [5] * 9000, GenerationParams(max_tokens=4)))
        stream = http_engine.reason("http-dup", [5, 6], GenerationParams(max_tokens=2))
        with pytest.raises(EngineError, match="already running"):
            http_engine.reason("http-dup", [5, 6], GenerationParams(max_tokens=2))
        await _collect(stream)

    loop.run(run(), timeout_s=120)


def test_wrong_model_and_unreachable_server(loop, vllm_server: VllmServer, tiny_model_path: str) -> None:
    wrong = OpenAICompatEngine(vllm_server.base_url, "no-such-model", tokenizer=tiny_model_path)
    with pytest.raises(EngineError, match=f"does not serve model 'no-such-model'.*{SERVED_NAME}"):
        loop.run(wrong.start())
    unreachable = OpenAICompatEngine(f"http://127.0.0.1:{free_port()}", SERVED_NAME, tokenizer=tiny_model_path)
    with pytest.raises(EngineError, match="cannot reach the server at http://127.0.0.1:\\d+/v1"):
        loop.run(unreachable.start())
    with pytest.raises(EngineError, match="not started"):
        unreachable.reason("x", [1], GenerationParams())


def test_silent_server_hits_the_read_timeout(loop, tiny_model_path: str) -> None:
    """A server that accepts the request and then says nothing: the error names read_timeout_s."""
    async def run() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.readuntil(b"\r\n\r\n")
            length = int(next((l.split(b":")[1] for l in request.split(b"\r\n") if l.lower().startswith(b"content-length")), b"0"))
            if length:
                await reader.readexactly(length)
            if request.startswith(b"GET /v1/models"):
                body = json.dumps({"data": [{"id": SERVED_NAME}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(30)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = OpenAICompatEngine(f"http://127.0.0.1:{port}", SERVED_NAME, tokenizer=tiny_model_path, read_timeout_s=0.5)
        try:
            await engine.start()
            with pytest.raises(EngineError, match="read_timeout_s"):
                await _collect(engine.reason("silent", [1, 2], GenerationParams(max_tokens=4)))
        finally:
            await engine.close()
            server.close()

    loop.run(run(), timeout_s=60)


def test_request_on_a_keep_alive_connection_the_server_closed_is_sent_again(loop, tiny_model_path: str) -> None:
    """A server closes an idle keep-alive connection (`vllm serve`: after 5 s) just as a request
    goes out on it: the request is sent again on a new connection, not reported as a cut stream."""
    connections: list[list[bytes]] = []

    async def run() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served: list[bytes] = []
            connections.append(served)
            while True:
                try:
                    request = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                length = int(next((l.split(b":")[1] for l in request.split(b"\r\n") if l.lower().startswith(b"content-length")), b"0"))
                if length:
                    await reader.readexactly(length)
                served.append(request.split(b" ", 2)[1])
                if len(served) > 1:           # its keep-alive timer ran out as the request came
                    break
                if request.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [{"id": SERVED_NAME}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                else:
                    events = [{"choices": [{"text": "ab", "token_ids": [7, 8], "finish_reason": "length"}]}, "[DONE]"]
                    body = b"".join(b"data: %s\n\n" % (e if isinstance(e, str) else json.dumps(e)).encode() for e in events)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = OpenAICompatEngine(f"http://127.0.0.1:{port}", SERVED_NAME, tokenizer=tiny_model_path)
        try:
            await engine.start()              # its connection stays in the pool
            _, ids = await _collect(engine.reason("after-idle", [1, 2], GenerationParams(max_tokens=2)))
        finally:
            await engine.close()
            server.close()
        assert ids == [7, 8]
        assert connections == [[b"/v1/models", b"/v1/completions"], [b"/v1/completions"]]

    loop.run(run(), timeout_s=60)


def test_stream_cut_by_a_dying_server_is_an_error(loop, http_engine: OpenAICompatEngine, vllm_server: VllmServer) -> None:
    """Runs last in this module: it kills the server in the middle of a stream."""
    prompt = http_engine.chat_prompt_ids([{"role": "user", "content": "Think."}])

    async def run() -> None:
        received = 0
        with pytest.raises(EngineError, match="was cut after \\d+ tokens") as info:
            # ignore_eos: the random-weight model sometimes ends its answer within 10 tokens, and
            # the stream then finishes before the server is killed (1 run in 7 here).
            async for delta in http_engine.reason("http-cut", prompt,
                                                  GenerationParams(max_tokens=7000, ignore_eos=True)):
                received += len(delta.token_ids)
                if received >= 10 and vllm_server.process.poll() is None:
                    vllm_server.kill()
        assert "http-cut" in str(info.value)
        with pytest.raises(EngineError, match="cannot reach the server"):
            await _collect(http_engine.reason("http-after-death", prompt, GenerationParams(max_tokens=4)))

    loop.run(run(), timeout_s=120)
