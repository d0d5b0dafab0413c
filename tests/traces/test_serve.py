"""`specgen trace serve`: traces behind an OpenAI-compatible server, driven by the project's own
HTTP engine (and by plain HTTP where the engine does not go: chat completions, bad requests).

One server runs as a real `specgen trace serve` subprocess for the module, serving the bundled
hand-written trace (recorded forks) and the generated one (forks written by the draft model) at
50 times their recorded pace, with the tiny model's tokenizer (a real Hugging Face one, which the
engine needs); the tests of matching rules and of the modelled pace run a server in this process.
"""
from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import msgspec
import pytest

from specgen.cli import main
from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.engines.openai_http import OpenAICompatEngine
from specgen.engines.timing_model import TimingModel
from specgen.messages import OptimizeResult
from specgen.optimize import prompts
from specgen.optimize.fork_models import latest_draft
from specgen.optimize.fork_prompt import FORK_INSTRUCTION, FORK_STOP, ForkPromptBuilder
from specgen.traces.bundled import bundled_problem, bundled_trace, generated_trace_path
from specgen.traces.extraction import extract_fork_candidate
from specgen.traces.format import Iteration, Trace, TraceBuilder
from specgen.traces.serve import Parsed, RequestError, TraceServer, load_served_traces

SPEED = 50.0
MODEL = "specgen-trace"
HAND_WRITTEN = "fused_elementwise"      # bundled trace with recorded forks
GENERATED = "layernorm"                 # generated trace: no recorded forks


class Served:
    def __init__(self, process: subprocess.Popen, base_url: str, log_path: Path) -> None:
        self.process = process
        self.base_url = base_url
        self.log_path = log_path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def server(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log_path = tmp_path_factory.mktemp("trace-serve") / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "specgen.cli", "trace", "serve", str(bundled_trace(HAND_WRITTEN)),
             str(generated_trace_path(GENERATED)), "--port", "0", "--tokenizer", tiny_model_path,
             "--speed", str(SPEED)],
            stdout=subprocess.PIPE, stderr=log, env=dict(os.environ, HF_HUB_OFFLINE="1"),
            start_new_session=True)
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready or process.poll() is not None and not ready:
                pytest.fail(f"trace serve did not start:\n{log_path.read_text(errors='replace')}")
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                pytest.fail(f"trace serve exited ({process.wait()}):\n{log_path.read_text(errors='replace')}")
            line += byte
        words = line.decode()
        assert words.startswith("serving 2 trace(s) as model 'specgen-trace' at http://127.0.0.1:"), words
        yield Served(process, words.split(" at ", 1)[1].split(" ", 1)[0], log_path)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


@pytest.fixture(scope="module")
def engine(loop, server: Served, tiny_model_path: str) -> Iterator[OpenAICompatEngine]:
    engine = OpenAICompatEngine(server.base_url, MODEL, tokenizer=tiny_model_path, read_timeout_s=60)
    loop.run(engine.start())
    yield engine
    loop.run(engine.close())


def _chat(problem: str) -> list[dict[str, str]]:
    return prompts.chat(bundled_problem(problem).read_text(), [], None)


def _turn(problem: str, index: int = 0) -> Iteration:
    path = bundled_trace(problem) or generated_trace_path(problem)
    return Trace.load(path).iterations[index]


def _position(iteration: Iteration, chars: int) -> int:
    """The trace's reasoning tokens whose text lies within the first `chars` characters."""
    seen_chars = tokens = 0
    for chunk in iteration.reasoning.chunks:
        seen_chars += len(chunk.text)
        if seen_chars > chars:
            break
        tokens += len(chunk.token_ids)
    return tokens


def _until_stop(text: str) -> str:
    cut = text.find(FORK_STOP[0])
    return text if cut < 0 else text[:cut]


async def _collect(stream) -> tuple[list[TokenDelta], list[int], str]:
    deltas = [delta async for delta in stream]
    return deltas, [t for d in deltas for t in d.token_ids], "".join(d.text for d in deltas)


async def _post(url: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
    """POST and read the whole answer: (status, JSON body) or (status, [SSE payloads])."""
    async with aiohttp.ClientSession() as session:
        kwargs = {"data": raw, "headers": {"Content-Type": "application/json"}} if raw is not None \
            else {"json": body}
        async with session.post(url, **kwargs) as response:
            if response.content_type == "text/event-stream":
                events = []
                async for line in response.content:
                    line = line.strip()
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
                return response.status, events
            return response.status, await response.json()


async def _stats(server: Served) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.base_url.removesuffix("/v1") + "/stats") as response:
            return await response.json()


# -- reasoning ---------------------------------------------------------------------------------------


def test_reasoning_streams_at_the_recorded_pace(loop, engine: OpenAICompatEngine) -> None:
    iteration = _turn(HAND_WRITTEN)
    prompt = engine.chat_prompt_ids(_chat(HAND_WRITTEN))
    recorded_s = iteration.final.duration_s / SPEED

    async def run() -> None:
        began = time.monotonic()
        deltas, ids, text = await _collect(engine.reason("pace", prompt, GenerationParams(max_tokens=100000)))
        elapsed = time.monotonic() - began
        # The whole turn, exactly as recorded: reasoning, the think-end tag, the answer.
        assert text == iteration.reasoning.text + iteration.final.text
        assert engine.exact_token_ids and engine.decode(ids) == text      # ids came from the stream
        assert deltas[-1].finished and deltas[-1].finish_reason == "stop"
        assert deltas[-1].num_prompt_tokens == len(prompt)
        # Streamed as it came due, not at once, and no sooner than the recording allows.
        assert len(deltas) > 200
        assert 0.9 * recorded_s <= elapsed <= recorded_s + 5, (elapsed, recorded_s)
        first_half = sum(1 for d in deltas if d.t - deltas[0].t < recorded_s / 2)
        assert 0.2 * len(deltas) < first_half < 0.8 * len(deltas)

    loop.run(run(), timeout_s=60)


def test_the_nth_prompt_of_a_job_replays_the_nth_turn(loop, engine: OpenAICompatEngine) -> None:
    source = bundled_problem(HAND_WRITTEN).read_text()
    user = prompts.user_prompt(source, [], None, notes=["Iteration 1 produced no complete ```python "
                                                        "block defining ModelNew (reasoning ended: stop)."])
    prompt = engine.chat_prompt_ids([{"role": "system", "content": prompts.SYSTEM_PROMPT},
                                     {"role": "user", "content": user}])

    async def run() -> None:
        deltas, _, text = await _collect(engine.reason("turn2", prompt, GenerationParams(max_tokens=300)))
        assert deltas[-1].finish_reason == "length"
        assert _turn(HAND_WRITTEN, 1).reasoning.text.startswith(text) and len(text) > 300
        assert not _turn(HAND_WRITTEN, 0).reasoning.text.startswith(text)

    loop.run(run(), timeout_s=60)


def test_chat_completions_stream_reasoning_content_then_content(loop, server: Served) -> None:
    iteration = _turn(HAND_WRITTEN)

    async def run() -> None:
        status, events = await _post(f"{server.base_url}/chat/completions", {
            "model": MODEL, "messages": _chat(HAND_WRITTEN), "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}})
        assert status == 200 and events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"])
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert reasoning == iteration.reasoning.text
        assert content == iteration.final.text.removeprefix("</think>")
        # No delta mixes the two, and the reasoning comes first.
        kinds = [("reasoning_content" in c["choices"][0]["delta"], "content" in c["choices"][0]["delta"])
                 for c in chunks[1:] if c["choices"]]
        assert all(r != c for r, c in kinds)
        first_content = kinds.index((False, True))
        assert all(r for r, _ in kinds[:first_content]) and not any(r for r, _ in kinds[first_content:])
        assert all(isinstance(c["choices"][0]["token_ids"], list) for c in chunks if c["choices"])
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == [] and usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0

        # Not streamed: one message with both parts.
        status, whole = await _post(f"{server.base_url}/chat/completions", {
            "model": MODEL, "messages": _chat(HAND_WRITTEN), "max_tokens": 50})
        message = whole["choices"][0]["message"]
        assert status == 200 and whole["choices"][0]["finish_reason"] == "length"
        assert iteration.reasoning.text.startswith(message["reasoning_content"]) and message["content"] == ""
        assert whole["usage"]["completion_tokens"] == 50
        status, whole = await _post(f"{server.base_url}/completions", {
            "model": MODEL, "prompt": prompts.user_prompt(bundled_problem(HAND_WRITTEN).read_text(), [], None),
            "max_tokens": 30, "return_token_ids": True})
        choice = whole["choices"][0]
        assert status == 200 and choice["finish_reason"] == "length" and len(choice["token_ids"]) == 30
        assert iteration.reasoning.text.startswith(choice["text"]) and choice["text"]

    loop.run(run(), timeout_s=60)


# -- forks -------------------------------------------------------------------------------------------


def test_a_fork_mid_stream_gets_the_recorded_answer_there(loop, engine: OpenAICompatEngine) -> None:
    iteration = _turn(HAND_WRITTEN)
    prompt = engine.chat_prompt_ids(_chat(HAND_WRITTEN))
    fork_prompts = ForkPromptBuilder(engine)
    params = GenerationParams(max_tokens=4096, stop=list(FORK_STOP))

    async def run() -> None:
        ids: list[int] = []
        forks: list[tuple[int, list[TokenDelta], str]] = []
        stream = engine.reason("fork-reason", prompt, GenerationParams(max_tokens=6000))
        fork_points = [150, 4000]          # before the first recording, then past one
        async for delta in stream:
            ids += delta.token_ids
            if fork_points and len(ids) >= fork_points[0]:
                # As the loop forks: from the ids so far, while the reasoning goes on.
                fork_points.pop(0)
                deltas, _, text = await _collect(engine.fork(
                    f"fork-{len(forks)}", prompt, ids[:], fork_prompts.suffix_ids(), params))
                forks.append((len(ids), deltas, text))
        assert len(forks) == 2
        (early_at, early, early_text), (late_at, late, late_text) = forks
        assert _position(iteration, len(engine.decode(ids[:early_at]))) < iteration.forks[0].position
        assert early_text == "" and early[-1].finish_reason == "stop"
        position = _position(iteration, len(engine.decode(ids[:late_at])))
        recording = iteration.fork_at(position)
        assert recording is not None and recording.position < position
        assert late_text == _until_stop(recording.completion.text) and late[-1].finish_reason == "stop"
        # The fork's prompt is reported, and all but its suffix counted as cached, as a prefix
        # cache would hold the reasoning's blocks.
        assert late[-1].num_prompt_tokens == len(prompt) + late_at + len(fork_prompts.suffix_ids())
        assert len(prompt) + late_at - 16 <= late[-1].num_cached_tokens <= len(prompt) + late_at

    loop.run(run(), timeout_s=60)


def test_a_trace_without_recorded_forks_answers_with_the_draft_so_far(loop, engine: OpenAICompatEngine) -> None:
    reasoning = _turn(GENERATED).reasoning.text
    prompt = engine.chat_prompt_ids(_chat(GENERATED))
    suffix = ForkPromptBuilder(engine).suffix_ids()
    at = len(reasoning) * 95 // 100           # past the draft the generated reasoning writes
    draft = latest_draft(reasoning[:at])
    assert draft is not None

    async def run() -> None:
        _, _, text = await _collect(engine.fork("draft-fork", prompt, engine.encode(reasoning[:at]), suffix,
                                                GenerationParams(max_tokens=8000, stop=list(FORK_STOP))))
        assert extract_fork_candidate(text, opened_fence=True) == draft

    loop.run(run(), timeout_s=60)


def test_a_chat_fork_with_reasoning_content_gets_the_recorded_answer(loop, server: Served) -> None:
    iteration = _turn(HAND_WRITTEN)
    recording = iteration.forks[1]
    chars = len("".join(c.text for c in iteration.reasoning.chunks[:recording.position]))
    reasoning = iteration.reasoning.text[:chars]
    assert _position(iteration, chars) == recording.position

    async def run() -> None:
        status, whole = await _post(f"{server.base_url}/chat/completions", {
            "model": MODEL, "messages": [*_chat(HAND_WRITTEN), {
                "role": "assistant", "reasoning_content": reasoning, "content": FORK_INSTRUCTION}],
            "stop": FORK_STOP})
        assert status == 200, whole
        message = whole["choices"][0]["message"]
        assert message["content"] == _until_stop(recording.completion.text)
        assert "reasoning_content" not in message

    loop.run(run(), timeout_s=60)


# -- aborts and concurrency --------------------------------------------------------------------------


def test_an_abort_stops_that_stream_and_the_server_keeps_serving(loop, engine: OpenAICompatEngine,
                                                                server: Served) -> None:
    prompt = engine.chat_prompt_ids(_chat(HAND_WRITTEN))

    async def run() -> None:
        before = await _stats(server)
        received, after, aborted_at = 0, [], None
        async for delta in engine.reason("abort-me", prompt, GenerationParams(max_tokens=100000)):
            if aborted_at is not None:
                after.append(delta)
                continue
            received += len(delta.token_ids)
            if received >= 500:
                aborted_at = time.monotonic()
                await engine.abort("abort-me")
        assert len(after) == 1 and after[0].finish_reason == "abort" and not after[0].token_ids
        # The server saw the connection close and ended that request, long before its recording.
        for _ in range(100):
            stats = await _stats(server)
            if stats["running"] == 0 and stats["aborted"] == before["aborted"] + 1:
                break
            await asyncio.sleep(0.05)
        assert stats["running"] == 0 and stats["aborted"] == before["aborted"] + 1, stats
        assert time.monotonic() - aborted_at < 2
        deltas, ids, _ = await _collect(engine.reason("abort-me", prompt, GenerationParams(max_tokens=20)))
        assert len(ids) == 20 and deltas[-1].finish_reason == "length"

    loop.run(run(), timeout_s=60)


def test_concurrent_reasoning_and_forks_run_side_by_side(loop, engine: OpenAICompatEngine,
                                                         server: Served) -> None:
    iteration = _turn(HAND_WRITTEN)
    prompt = engine.chat_prompt_ids(_chat(HAND_WRITTEN))
    suffix = ForkPromptBuilder(engine).suffix_ids()
    chunk_chars = [len(c.text) for c in iteration.reasoning.chunks]
    fork_chars = [sum(chunk_chars[:fork.position]) for fork in iteration.forks]

    async def timed(stream) -> tuple[float, str, list[TokenDelta]]:
        began = time.monotonic()
        deltas, _, text = await _collect(stream)
        return time.monotonic() - began, text, deltas

    async def run() -> None:
        reasoning = [engine.reason(f"many-{i}", prompt, GenerationParams(max_tokens=4000)) for i in range(4)]
        forks = [engine.fork(f"many-fork-{i}", prompt, engine.encode(iteration.reasoning.text[:chars]),
                             suffix, GenerationParams(max_tokens=4096, stop=list(FORK_STOP)))
                 for i, chars in enumerate(fork_chars)]
        began = time.monotonic()
        results = await asyncio.gather(*(timed(s) for s in reasoning + forks))
        wall = time.monotonic() - began
        for _, text, deltas in results[:4]:
            assert deltas[-1].finish_reason == "length" and iteration.reasoning.text.startswith(text)
        for (_, text, _), fork in zip(results[4:], iteration.forks):
            assert text == _until_stop(fork.completion.text)
        # Side by side: the whole took much less than one after another would.
        assert wall < 0.6 * sum(seconds for seconds, _, _ in results), (wall, [r[0] for r in results])
        assert (await _stats(server))["peak_running"] >= len(results)

    loop.run(run(), timeout_s=90)


# -- bad requests ------------------------------------------------------------------------------------


def test_unmatched_and_malformed_requests_get_a_clear_error(loop, engine: OpenAICompatEngine,
                                                             server: Served, tiny_model_path: str) -> None:
    completions = f"{server.base_url}/completions"

    async def run() -> None:
        # A problem no served trace poses: the engine's error carries the server's message.
        softmax = engine.chat_prompt_ids(_chat("softmax"))
        with pytest.raises(EngineError, match=r"refused \(404\): no served trace matches this request.*"
                                              r"fused_elementwise, layernorm"):
            await _collect(engine.reason("unmatched", softmax, GenerationParams(max_tokens=5)))
        cases = [
            ({"model": MODEL, "prompt": "x", "problem": "softmax"}, 404, "'problem' names 'softmax'"),
            ({"model": MODEL}, 400, "'prompt' must be"),
            ({"model": MODEL, "prompt": [1, -2]}, 400, "prompt[1] = -2 is not a token id"),
            ({"model": MODEL, "prompt": [1, 10 ** 6]}, 400, "out of vocabulary"),
            ({"model": MODEL, "prompt": softmax, "max_tokens": 0}, 400, "'max_tokens' must be a positive"),
            ({"model": MODEL, "prompt": softmax, "stop": 3}, 400, "'stop' must be"),
            ({"model": "other", "prompt": softmax}, 404, "the model 'other' does not exist"),
            ({"model": MODEL, "prompt": softmax, "n": 2}, 400, "'n' must be 1"),
            ([1, 2], 400, "must be a JSON object"),
        ]
        for body, status, words in cases:
            got, answer = await _post(completions, body)
            assert got == status and words in answer["error"]["message"], (body, got, answer)
        got, answer = await _post(completions, None, raw=b"{not json")
        assert got == 400 and "not valid JSON" in answer["error"]["message"]
        got, answer = await _post(f"{server.base_url}/chat/completions", {"model": MODEL, "messages": []})
        assert got == 400 and answer["error"]["param"] == "messages"
        got, answer = await _post(f"{server.base_url}/chat/completions",
                                  {"model": MODEL, "messages": [{"role": "user", "content": 5}]})
        assert got == 400 and "messages[0].content" in answer["error"]["message"]
        wrong = OpenAICompatEngine(server.base_url, "no-such-model", tokenizer=tiny_model_path)
        with pytest.raises(EngineError, match="does not serve model 'no-such-model'.*specgen-trace"):
            await wrong.start()
        # Still serving.
        _, ids, _ = await _collect(engine.reason("after-errors", engine.chat_prompt_ids(_chat(HAND_WRITTEN)),
                                                 GenerationParams(max_tokens=10)))
        assert len(ids) == 10

    loop.run(run(), timeout_s=60)


def test_the_command_says_what_is_missing(tmp_path: Path, capsys) -> None:
    assert main(["trace", "serve", str(bundled_trace(HAND_WRITTEN)), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer DIR is needed" in err and "piece vocabulary" in err and len(err.splitlines()) == 1
    assert main(["trace", "serve", str(tmp_path / "none.trace.json")]) == 2
    assert "no such trace file or folder" in capsys.readouterr().err
    assert main(["trace", "serve", str(tmp_path)]) == 2
    assert "without any *.trace.json" in capsys.readouterr().err


# -- matching rules and the modelled pace, in this process --------------------------------------------


def _samples(tmp_path: Path) -> list[Path]:
    """Two samples of the softmax problem, two turns each, their turn-2 prompt recorded."""
    paths = []
    for sample in ("a", "b"):
        builder = TraceBuilder(token_rate=200.0, problem="softmax")
        for turn in (1, 2):
            words = " ".join(f"sample {sample} turn {turn} step {i} of the plan." for i in range(60))
            messages = [{"role": "user", "content": f"Recorded follow-up prompt of sample {sample}."}] \
                if turn == 2 else None
            builder.add_iteration(f"Thinking for sample {sample}, turn {turn}. {words}",
                                  forks={"step 30 of": "print('fork')\n```\n"},
                                  final_text=f"answer {sample}{turn}", messages=messages)
        paths.append(builder.save(tmp_path / f"softmax.{sample}.trace.json"))
    return paths


def test_requests_pick_sample_and_turn_by_seed_feedback_and_recorded_prompt(loop, tmp_path: Path,
                                                                            tiny_model_path: str) -> None:
    served = load_served_traces(_samples(tmp_path))
    server = TraceServer(served, tokenizer=tiny_model_path)
    source = bundled_problem("softmax").read_text()
    task = prompts.user_prompt(source, [], None)

    def plan(text: str, body: dict[str, Any] | None = None, **fork: Any):
        parsed = Parsed(text=text, prompt_tokens=100, fork=bool(fork), **fork)
        return loop.run(server.plan(parsed, body or {}))

    # Samples: by seed, else in turn.
    assert plan(task, {"seed": 3}).served.path.name == "softmax.b.trace.json"
    assert [plan(task).served.path.name[8] for _ in range(3)] == ["a", "b", "a"]
    # Turns: what specgen's feedback names, capped at the last; a recorded prompt wins.
    feedback = task + "\n- iteration 1, your final answer (c001): correct, 1.10x the reference\n"
    assert plan(feedback).turn == 1 and plan(task).turn == 0
    assert plan(task + "\n- iteration 9, written mid-reasoning (c009): wrong output\n").turn == 1
    assert plan(task + "\nRecorded follow-up prompt of sample b.", {"seed": 1}).turn == 1
    # A named problem needs no source in the prompt; an unknown one is refused.
    assert plan("no program here", {"problem": "softmax"}).kind == "reason"
    with pytest.raises(RequestError, match="no served trace matches"):
        plan("no program here")
    # A fork is placed in the sample and turn whose recorded reasoning it continues.
    turn = served[1].iterations[1]
    chars = len(turn.reasoning.text) * 3 // 4
    fork = plan(task, reasoning_so_far="<|im_start|>assistant\n<think>\n" + turn.reasoning.text[:chars] + "\n",
                suffix_text="</think>\n\nanswer now")
    assert (fork.kind, fork.served.path.name, fork.turn) == ("fork", "softmax.b.trace.json", 1)
    assert fork.position == _position(turn, chars) and fork.position > turn.forks[0].position
    assert fork.timeline.text == turn.forks[0].completion.text
    # Too little reasoning to place: the start, before any recording, so nothing.
    early = plan(task, reasoning_so_far="<think>\nThink", suffix_text="</think>")
    assert early.position == 0 and early.timeline.ids == []


def test_the_modelled_pace_slows_requests_that_decode_together(loop, tmp_path: Path,
                                                               tiny_model_path: str) -> None:
    served = load_served_traces([bundled_trace(HAND_WRITTEN)])
    # 400 tokens/s alone, half that for each of two (knee 1, beta 1), no time to first token.
    timing = TimingModel(r1=400.0, knee=1.0, beta=1.0, ttft_floor_s=0.0, prefill_tps=1e12)
    server = TraceServer(served, tokenizer=tiny_model_path, pace="modelled", timing=timing)

    async def run() -> None:
        url = await server.start()
        engine = OpenAICompatEngine(url, MODEL, tokenizer=tiny_model_path)
        await engine.start()
        prompt = engine.chat_prompt_ids(_chat(HAND_WRITTEN))
        try:
            async def one(name: str) -> float:
                began = time.monotonic()
                _, ids, _ = await _collect(engine.reason(name, prompt, GenerationParams(max_tokens=400)))
                assert len(ids) == 400
                return time.monotonic() - began

            alone = await one("alone")
            together = await asyncio.gather(one("together-0"), one("together-1"))
        finally:
            await engine.close()
            await server.close()
        assert 0.9 <= alone <= 1.6, alone
        assert all(seconds >= 1.5 * alone for seconds in together), (alone, together)

    loop.run(run(), timeout_s=60)


# -- the whole live path -----------------------------------------------------------------------------


def test_optimize_runs_end_to_end_against_the_served_trace(server: Served, tiny_model_path: str,
                                                           tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["optimize", str(bundled_problem(HAND_WRITTEN)), "--llm", "openai",
                 "--base-url", server.base_url, "--model", MODEL, "--tokenizer", tiny_model_path,
                 "--evaluation", "inprocess", "--devices", "cpu", "--max-iterations", "1",
                 "--trials", "2", "--timing-trials", "3", "--quiet", "--out", str(out)])
    assert code == 0, capsys.readouterr().err + server.log_tail()
    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    metrics = result.metrics
    # The reasoning came from the trace, forks were sent mid-reasoning and answered from its
    # recordings, and their programs were judged.
    assert metrics.reasoning_tokens > 5000 and metrics.forks >= 2 and metrics.fork_tokens > 0
    assert any(c.origin == "fork" and c.validation is not None for c in result.candidates), \
        [(c.origin, c.status) for c in result.candidates]
    assert "fork fused_elementwise" in server.log_tail()


def test_a_suite_runs_every_mode_on_the_served_reasoning(server: Served, tiny_model_path: str,
                                                         tmp_path: Path, capsys) -> None:
    """The run a user makes with their own model, on recorded reasoning: two problems, two modes
    side by side on a local cluster, every live turn recorded as a trace the bench replays."""
    from specgen.optimize.bench_problems import problems_from_traces

    folder = tmp_path / "problems"
    folder.mkdir()
    for name in (HAND_WRITTEN, GENERATED):
        (folder / f"{name}.py").write_text(bundled_problem(name).read_text())
    out = tmp_path / "suite"
    code = main(["optimize", str(folder), "--llm", "openai", "--base-url", server.base_url,
                 "--model", MODEL, "--tokenizer", tiny_model_path, "--modes", "specgen,sequential",
                 "--concurrency", "2", "--devices", "cpu", "--max-iterations", "1", "--trials", "2",
                 "--timing-trials", "3", "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err + server.log_tail()
    assert "| fast_0 | fast_1 | fast_1.5 | fast_2 |" in captured.out
    results = json.loads((out / "results.json").read_text())
    assert results["complete"]
    for name in (HAND_WRITTEN, GENERATED):
        for mode in ("specgen", "sequential"):
            cell = results["per_problem"][name][mode]
            assert cell["end_to_end_s"] > 0 and cell["tokens"] > 1000, (name, mode, cell)
    # The sequential jobs read their reasoning to its end: recorded whole, they replay in a bench.
    traces = sorted((out / "traces" / "sequential").glob("*.trace.json"))
    assert [t.name for t in traces] == sorted(f"{n}.trace.json" for n in (HAND_WRITTEN, GENERATED))
    assert all(e.trace.iterations[0].reasoning.num_tokens > 1000 for e in problems_from_traces(traces))
