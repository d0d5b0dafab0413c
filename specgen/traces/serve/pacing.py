"""When an answer's tokens are due, at the recorded or the modelled pace, and how a request's limits
cut the answer into the pieces that are sent."""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import AsyncIterator, Literal

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.traces.modelled import STEP_S
from specgen.traces.serve.timeline import Timeline
from specgen.traces.serve.wire import Limits, Piece, Plan, stop_prefix

Pace = Literal["recorded", "modelled"]
PACES = ("recorded", "modelled")


class Pacer:
    """Paces the answers of one server: `pace` "recorded" or "modelled", `speed` the time scale
    (2.0 twice as fast, `float("inf")` without waiting), `timing` the timing model of the modelled
    pace; `decoding` counts the requests in their decode phase (modelled pace)."""

    def __init__(self, pace: Pace, speed: float, timing: TimingModel | None = None) -> None:
        if pace not in PACES:
            raise UsageError(f"pace must be one of {', '.join(PACES)}, got {pace!r}")
        if not speed > 0:
            raise UsageError(f"--speed must be > 0, got {speed}")
        self.pace: Pace = pace
        self.speed = float(speed)
        self.timing = timing or TimingModel()
        self.decoding = 0                  # requests in their decode phase (modelled pace)

    async def _recorded(self, timeline: Timeline) -> AsyncIterator[tuple[int, int]]:
        start = time.monotonic()
        count, index = len(timeline.ids), 0
        while index < count:
            wait = start + timeline.times[index] / self.speed - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            end = index + 1
            # Every token already due goes in one event, as an engine step batches them; the
            # reasoning and the answer never share one (chat sends them as different fields).
            limit = timeline.answer_from if index < timeline.answer_from else count
            while end < limit and start + timeline.times[end] / self.speed <= now:
                end += 1
            yield index, end
            index = end

    async def _modelled(self, timeline: Timeline, ttft_s: float) -> AsyncIterator[tuple[int, int]]:
        if ttft_s > 0 and math.isfinite(self.speed):
            await asyncio.sleep(ttft_s / self.speed)
        count, index, progress = len(timeline.ids), 0, 0.0
        self.decoding += 1
        try:
            last = time.monotonic()
            while index < count:
                await asyncio.sleep(STEP_S if math.isfinite(self.speed) else 0)
                now = time.monotonic()
                if math.isfinite(self.speed):
                    progress += self.timing.decode_tps(self.decoding) * (now - last) * self.speed
                else:
                    progress = count
                last = now
                due = min(count, int(progress))
                while index < due:
                    limit = timeline.answer_from if index < timeline.answer_from else count
                    end = min(due, limit)
                    yield index, end
                    index = end
        finally:
            self.decoding -= 1

    async def pieces(self, plan: Plan, limits: Limits) -> AsyncIterator[Piece]:
        """The plan's answer as it comes due, cut by the request's limits as an engine cuts it.

        Text that may be the start of a stop string is held back until the next tokens say
        whether it is one, so that no part of a stop string ever reaches the client."""
        timeline = plan.timeline
        count = len(timeline.ids)
        schedule = (self._recorded(timeline) if self.pace == "recorded"
                    else self._modelled(timeline, plan.ttft_s))
        sent_tokens = sent_chars = 0
        async with contextlib.aclosing(schedule):
            async for start, end in schedule:
                end, end_char, finish = self._cut(timeline, start, end, limits)
                if finish is None and end >= count:
                    finish = "stop"
                release, release_char = end, end_char
                if finish is None and limits.stop:
                    held = stop_prefix(timeline.text[sent_chars:end_char], limits.stop)
                    if held:
                        while release > sent_tokens and timeline.ends[release - 1] > end_char - held:
                            release -= 1
                        release_char = timeline.char_end(release)
                if sent_tokens < timeline.answer_from < release:
                    # Held reasoning goes out on its own: chat sends it as another field.
                    boundary = timeline.char_end(timeline.answer_from)
                    yield Piece(timeline.ids[sent_tokens:timeline.answer_from],
                                timeline.text[sent_chars:boundary], False, None)
                    sent_tokens, sent_chars = timeline.answer_from, boundary
                if release > sent_tokens or finish is not None:
                    yield Piece(timeline.ids[sent_tokens:release], timeline.text[sent_chars:release_char],
                                sent_tokens >= timeline.answer_from, finish)
                    sent_tokens, sent_chars = release, release_char
                if finish is not None:
                    return
        yield Piece([], "", True, "stop")

    @staticmethod
    def _cut(timeline: Timeline, start: int, end: int, limits: Limits) -> tuple[int, int, str | None]:
        """Where tokens `start:end` stop being sent (a token index and a character offset), and
        why the answer ends there, if it does: `max_tokens`, a stop token, a stop string."""
        finish = None
        if limits.max_tokens is not None and end >= limits.max_tokens:
            end, finish = limits.max_tokens, "length"
        for index in range(start, end):
            if timeline.ids[index] in limits.stop_token_ids:
                end, finish = index + 1, "stop"
                break
        end_char = timeline.char_end(end)
        if limits.stop:
            begin = timeline.char_end(start)
            hits = [timeline.text.find(stop, max(0, begin - len(stop) + 1), end_char) for stop in limits.stop]
            hits = [hit for hit in hits if hit >= 0]
            if hits:
                # The stop string is not sent (as OpenAI servers do), nor a token it begins in.
                end_char, finish = min(hits), "stop"
                kept = start
                while kept < end and timeline.ends[kept] <= end_char:
                    kept += 1
                end = kept
        return end, end_char, finish
