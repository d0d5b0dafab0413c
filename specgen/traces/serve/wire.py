"""The OpenAI wire format of a request and its answer: what a request is read into (its text, its
limits, a fork's reasoning so far), the errors that refuse it, and the events and responses that
carry the answer back."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specgen.errors import SpecgenError
from specgen.traces.serve.timeline import ServedTokenizer, Timeline

if TYPE_CHECKING:
    from specgen.traces.serve.library import ServedTrace


class RequestError(SpecgenError):
    """A request the server refuses: an HTTP status and an OpenAI-format error naming the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


@dataclass
class Limits:
    max_tokens: int | None
    stop: list[str]
    stop_token_ids: set[int]


@dataclass
class Parsed:
    """A request, read: the text its problem and turn are found in, and for a fork what it forks."""

    text: str
    prompt_tokens: int
    fork: bool
    reasoning_so_far: str = ""            # fork: the text that ends with the reasoning so far
    suffix_text: str = ""                 # fork: what follows it (the think-end tag, the instruction)


@dataclass
class Plan:
    kind: str                             # "reason" | "fork"
    served: ServedTrace
    turn: int
    timeline: Timeline
    ttft_s: float                         # modelled pace only
    cached_tokens: int
    position: int | None = None           # fork: the trace's reasoning tokens before it
    answered_by: str = ""                 # fork: "recording", a writer's name, or "nothing"


@dataclass
class Piece:
    ids: list[int]
    text: str
    answer: bool
    finish_reason: str | None


async def read_body(request: Any) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except ValueError as exc:
        raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict[str, Any], served_model: str) -> None:
    model = body.get("model", served_model)
    if model != served_model:
        raise RequestError(404, f"the model {model!r} does not exist; this server serves "
                                f"{served_model!r}", param="model", kind="not_found_error")
    if body.get("n") not in (None, 1):
        raise RequestError(400, "'n' must be 1: a trace holds one answer per request", param="n")
    if body.get("echo"):
        raise RequestError(400, "'echo' is not supported", param="echo")


def parse_completion(body: dict[str, Any], tokens: ServedTokenizer, think_ends: set[str]) -> Parsed:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        text, prompt_tokens = prompt, len(tokens.encode(prompt))
    elif isinstance(prompt, list) and prompt:
        for index, token_id in enumerate(prompt):
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise RequestError(400, f"prompt[{index}] = {token_id!r} is not a token id",
                                   param="prompt")
            if token_id >= tokens.vocab_size:
                raise RequestError(400, f"prompt[{index}] = {token_id} is out of vocabulary (the "
                                        f"served tokenizer {tokens.path} has "
                                        f"{tokens.vocab_size} tokens)", param="prompt")
        text, prompt_tokens = tokens.decode(prompt), len(prompt)
    else:
        raise RequestError(400, "'prompt' must be a non-empty string or list of token ids (one "
                                "prompt per request)", param="prompt")
    cut = max((text.rfind(tag), tag) for tag in think_ends)
    if cut[0] < 0:
        return Parsed(text, prompt_tokens, fork=False)
    return Parsed(text, prompt_tokens, fork=True, reasoning_so_far=text[:cut[0]],
                  suffix_text=text[cut[0]:])


def parse_chat(body: dict[str, Any], tokens: ServedTokenizer, think_ends: set[str]) -> Parsed:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", param="messages")
    read: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{index}] must be an object with a string 'role'",
                               param=f"messages[{index}]")
        read.append({"role": message["role"],
                     "content": _content_text(message.get("content"), f"messages[{index}].content")})
    last = messages[-1]
    if last["role"] != "assistant":
        text = "\n".join(m["content"] for m in read)
        return Parsed(text, tokens.prompt_tokens(read), fork=False)
    # The assistant's turn, begun: a fork from the reasoning it holds.
    context = read[:-1]
    content = read[-1]["content"]
    reasoning = last.get("reasoning_content", last.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise RequestError(400, f"messages[{len(messages) - 1}].reasoning_content must be a string",
                           param=f"messages[{len(messages) - 1}].reasoning_content")
    if reasoning is None:
        cut = max((content.rfind(tag), tag) for tag in think_ends)[0]
        reasoning, suffix = (content[:cut], content[cut:]) if cut >= 0 else (content, "")
    else:
        suffix = content
    text = "\n".join(m["content"] for m in context)
    prompt_tokens = (tokens.prompt_tokens(context) + len(tokens.encode(reasoning))
                     + len(tokens.encode(suffix)))
    return Parsed(text, prompt_tokens, fork=True, reasoning_so_far=reasoning, suffix_text=suffix)


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"{where}[{index}] must be a text part "
                                        "({'type': 'text', 'text': ...})", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"{where} must be a string or a list of text parts", param=where)


def stop_prefix(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` begin one of `stops` without completing it."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def read_limits(body: dict[str, Any], chat: bool) -> Limits:
    keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = next((body[k] for k in keys if body.get(k) is not None), None)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}",
                           param="max_tokens")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "'stop' must be a string or a list of non-empty strings", param="stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in stop_ids):
        raise RequestError(400, "'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    return Limits(max_tokens, list(stop), set(stop_ids))


@dataclass
class Reply:
    """One request's answer in the OpenAI wire format, as events or as one response."""

    chat: bool
    model: str
    want_ids: bool
    think_end: str
    prompt_tokens: int
    cached_tokens: int
    include_usage: bool
    request_id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    completion_tokens: int = 0
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    reasoning: str = ""
    content: str = ""
    _answer_started: bool = False

    def _answer_text(self, text: str) -> str:
        # Chat answers carry the answer without the tag that closed the reasoning, as vLLM's
        # reasoning parsers send it.
        if not self._answer_started:
            self._answer_started = True
            if text.startswith(self.think_end):
                return text[len(self.think_end):]
        return text

    def chunk(self, delta: dict[str, Any] | str, finish: str | None, ids: list[int]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        if self.want_ids:
            choice["token_ids"] = ids
        return {"id": self.request_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}

    def events(self, piece: Piece) -> list[dict[str, Any]]:
        self.completion_tokens += len(piece.ids)
        self.token_ids.extend(piece.ids)
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
        if not piece.ids and not piece.text and piece.finish_reason is None:
            return []
        if not self.chat:
            self.content += piece.text
            return [self.chunk(piece.text, piece.finish_reason, piece.ids)]
        if piece.answer:
            text = self._answer_text(piece.text)
            self.content += text
            delta: dict[str, Any] = {"content": text}
        else:
            self.reasoning += piece.text
            delta = {"reasoning_content": piece.text}
        return [self.chunk(delta, piece.finish_reason, piece.ids)]

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.request_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": self.usage()}

    def whole(self) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": self.content}
            if self.reasoning:
                message["reasoning_content"] = self.reasoning
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": self.content, "logprobs": None,
                      "finish_reason": self.finish_reason, "stop_reason": None}
        if self.want_ids:
            choice["token_ids"] = self.token_ids
        return {"id": self.request_id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage()}
