"""The HTTP server: a request is read, matched to a trace (`library`), planned (a turn's reasoning
and answer, or a fork's answer), paced (`pacing`) and sent in the OpenAI wire format (`wire`)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from typing import Any, Callable, Sequence

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.traces.importing.problems import normalized
from specgen.traces.modelled import CACHE_BLOCK, ForkWriter
from specgen.traces.serve.library import Library, ServedTrace, reasoning_prefix, served_tokenizer_path
from specgen.traces.serve.pacing import Pace, Pacer
from specgen.traces.serve.timeline import EMPTY, ServedTokenizer, text_timeline
from specgen.traces.serve.wire import (Limits, Parsed, Plan, Reply, RequestError, check_model, parse_chat,
                                       parse_completion, read_body, read_limits)

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "specgen-trace"


class TraceServer:
    """Serves traces over HTTP; see the docstring of `specgen.traces.serve`.

    Args:
        traces: the traces, as `load_served_traces` makes them.
        tokenizer: the tokenizer directory clients use (None: the traces' own, when they name one).
        model: the model name served.
        pace: "recorded" or "modelled".
        speed: time scale; 2.0 serves twice as fast, `float("inf")` without waiting.
        timing: the timing model (modelled pace; time to first token of written fork answers).
        writer: writes fork answers where the trace has no recording (or always, with
            `recorded_forks=False`); None answers such forks with nothing.
        recorded_forks: answer forks from the trace's recordings where it has any.
    """

    def __init__(self, traces: Sequence[ServedTrace], *, tokenizer: str | None = None,
                 model: str = DEFAULT_MODEL_NAME, pace: Pace = "recorded", speed: float = 1.0,
                 timing: TimingModel | None = None, writer: ForkWriter | None = None,
                 recorded_forks: bool = True) -> None:
        self.pacer = Pacer(pace, speed, timing)
        self.timing = self.pacer.timing
        if not traces:
            raise UsageError("no traces to serve")
        self.traces = list(traces)
        path, same = served_tokenizer_path(self.traces, tokenizer)
        self.tokens = ServedTokenizer(path)
        self._same_ids = {id(self.traces[i]) for i in same}
        self.think_ends = {served.trace.metadata.think_end for served in self.traces}
        self.model = model
        self.writer = writer
        self.recorded_forks = recorded_forks
        self.library = Library(self.traces)
        self.stats: dict[str, int] = {"running": 0, "peak_running": 0, "requests": 0,
                                      "reason": 0, "fork": 0, "finished": 0, "aborted": 0,
                                      "refused": 0, "failed": 0}
        self._runner: Any = None
        self.port: int | None = None

    @property
    def decoding(self) -> int:
        """Requests in their decode phase (modelled pace)."""
        return self.pacer.decoding

    # -- what a fork is answered with --------------------------------------------------------------

    def fork_answers(self, served: ServedTrace) -> str:
        if self.recorded_forks and served.recorded_forks:
            return "recorded"
        return self.writer.name if self.writer is not None else "nothing"

    def describe(self) -> list[str]:
        """A line per trace: what it serves and from where its problem is matched."""
        lines = []
        for served in self.traces:
            turns = len(served.iterations)
            match = (f"matched by its source ({served.source_from})" if served.sources
                     else "no problem source found: reached only by a request's 'problem' field")
            lines.append(f"{served.path}: problem {served.problem}, {turns} turn(s), forks answered "
                         f"by {self.fork_answers(served)}; {match}")
        return lines

    # -- planning ----------------------------------------------------------------------------------

    async def plan(self, parsed: Parsed, body: dict[str, Any]) -> Plan:
        candidates = self.library.match_problem(parsed.text, body.get("problem"))
        flat = normalized(parsed.text)
        if not parsed.fork:
            served = self.library.pick_sample(candidates, body.get("seed"))
            turn = self.library.turn_for(served, parsed.text, flat)
            timeline = served.turn_timeline(turn, self.tokens, id(served) in self._same_ids)
            return Plan("reason", served, turn, timeline, self.timing.ttft_s(parsed.prompt_tokens), 0)
        found: tuple[ServedTrace, int, int] | None = None
        for served in candidates:
            preferred = self.library.turn_for(served, parsed.text, flat)
            for turn in [preferred] + [t for t in range(len(served.iterations)) if t != preferred]:
                chars = reasoning_prefix(parsed.reasoning_so_far, served.iterations[turn].reasoning.text)
                if chars is not None and (found is None or chars > found[2]):
                    found = (served, turn, chars)
        if found is None:
            # Too little reasoning so far to place: the start of the likeliest turn.
            served = candidates[0]
            found = (served, self.library.turn_for(served, parsed.text, flat), 0)
        served, turn, chars = found
        iteration = served.iterations[turn]
        position = served.position_at(turn, chars)
        suffix_tokens = len(self.tokens.encode(parsed.suffix_text))
        shared = max(0, parsed.prompt_tokens - suffix_tokens)
        cached = (shared // CACHE_BLOCK) * CACHE_BLOCK
        ttft = self.timing.ttft_s(parsed.prompt_tokens, cached_tokens=cached)
        same_ids = id(served) in self._same_ids
        answered_by = self.fork_answers(served)
        if answered_by == "recorded":
            recording = iteration.fork_at(position)
            if recording is None:
                timeline, answered_by = EMPTY, "nothing (before the first recording)"
            else:
                timeline = served.fork_timeline(turn, iteration.forks.index(recording), self.tokens,
                                                same_ids)
                answered_by = f"the recording at {recording.position}"
        elif self.writer is not None:
            try:
                text = await self.writer.write(iteration, position, iteration.reasoning.text[:chars],
                                               parsed.suffix_text)
            except Exception as exc:  # noqa: BLE001 - a writer's failure is this request's, not the server's
                raise RequestError(500, f"fork writer {self.writer.name!r} failed: {exc}",
                                   kind="server_error") from exc
            rate = served.mean_rate(turn) or served.trace.metadata.token_rate or self.timing.r1
            timeline = text_timeline(text, self.tokens, ttft, rate) if text else EMPTY
        else:
            timeline = EMPTY
        return Plan("fork", served, turn, timeline, ttft, cached, position, answered_by)

    # -- HTTP --------------------------------------------------------------------------------------

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "specgen",
             "root": self.model, "parent": None}]})

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="")

    async def _stats(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(dict(self.stats, decoding=self.decoding))

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def _chat_completions(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Any, *, chat: bool) -> Any:
        from aiohttp import web

        try:
            body = await read_body(request)
            check_model(body, self.model)
            parsed = (parse_chat(body, self.tokens, self.think_ends) if chat
                      else parse_completion(body, self.tokens, self.think_ends))
            limits = read_limits(body, chat)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(400, "'stream' must be true or false", param="stream")
            options = body.get("stream_options") or {}
            if not isinstance(options, dict):
                raise RequestError(400, "'stream_options' must be an object", param="stream_options")
            plan = await self.plan(parsed, body)
        except RequestError as exc:
            self.stats["refused"] += 1
            log.info("refused (%d): %s", exc.status, exc.message)
            return web.json_response(exc.body(), status=exc.status)
        want_ids = bool(body.get("return_token_ids") or body.get("return_tokens"))
        self.stats["requests"] += 1
        self.stats[plan.kind] += 1
        self.stats["running"] += 1
        self.stats["peak_running"] = max(self.stats["peak_running"], self.stats["running"])
        reply = Reply(chat=chat, model=self.model, want_ids=want_ids, think_end=self.think_end(plan),
                       prompt_tokens=parsed.prompt_tokens, cached_tokens=plan.cached_tokens,
                       include_usage=bool(options.get("include_usage")))
        outcome = "aborted"
        try:
            if stream:
                result = await self._stream(request, plan, limits, reply)
            else:
                result = await self._collect(plan, limits, reply)
            outcome = reply.finish_reason or "aborted"
            return result
        except Exception:
            outcome = "failed"
            raise
        finally:
            self.stats["running"] -= 1
            if outcome == "aborted":
                self.stats["aborted"] += 1
            elif outcome == "failed":
                self.stats["failed"] += 1
            else:
                self.stats["finished"] += 1
            where = "" if plan.position is None else f" at {plan.position} tokens ({plan.answered_by})"
            log.info("%s %s (%s) turn %d%s: %d tokens, %s", plan.kind, plan.served.problem,
                     plan.served.path.name, plan.turn + 1, where, reply.completion_tokens, outcome)

    def think_end(self, plan: Plan) -> str:
        return plan.served.trace.metadata.think_end

    async def _stream(self, request: Any, plan: Plan, limits: Limits, reply: Reply) -> Any:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(data: dict[str, Any] | str) -> None:
            payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            await response.write(f"data: {payload}\n\n".encode("utf-8"))

        try:
            if reply.chat:
                await send(reply.chunk({"role": "assistant", "content": ""}, None, []))
            stream = self.pacer.pieces(plan, limits)
            async with contextlib.aclosing(stream):
                async for piece in stream:
                    for event in reply.events(piece):
                        await send(event)
            if reply.include_usage:
                await send(reply.usage_chunk())
            await send("[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            reply.finish_reason = None          # the client is gone: an abort
        return response

    async def _collect(self, plan: Plan, limits: Limits, reply: Reply) -> Any:
        from aiohttp import web

        stream = self.pacer.pieces(plan, limits)
        async with contextlib.aclosing(stream):
            async for piece in stream:
                reply.events(piece)
        return web.json_response(reply.whole())

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on `host:port` (0: a free port, then in `self.port`); returns the API root."""
        from aiohttp import web

        # Cancelling the handler of a request whose client went away is how an abort stops its
        # stream while it waits for its next token.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self.port = self._runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def serve_until_stopped(self, host: str, port: int,
                                  on_ready: Callable[[str], None] = lambda url: None) -> None:
        """Serve until SIGINT or SIGTERM."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        url = await self.start(host, port)
        try:
            on_ready(url)
            await stop.wait()
        finally:
            await self.close()
