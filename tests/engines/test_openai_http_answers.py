"""The HTTP engine's errors about what a server answered: the status and where the answer was
logged, never the answer's bytes (an error travels to whoever asked for the job). A server's
OpenAI-format error message is still quoted: it says what to fix."""
from __future__ import annotations

import asyncio
import http.server
import logging
import threading
from typing import Iterator

import pytest

from specgen.engines.base import EngineError
from specgen.engines.openai_http import OpenAICompatEngine

SECRET = "bytes-of-whatever-answers-at-that-url"


@pytest.fixture
def answering() -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    """A loopback server whose answer per path the test sets: {path: (status, body)}."""
    answers: dict[str, tuple[int, str]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, body = answers.get(self.path, (404, SECRET))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("answer", [(500, SECRET), (200, f"<html>{SECRET}</html>"),
                                    (200, '{"data": "' + SECRET + '"}')])
def test_an_unexpected_answer_is_logged_not_quoted(answering, answer, caplog) -> None:
    base, answers = answering
    answers["/v1/models"] = answer
    engine = OpenAICompatEngine(base, "m", tokenizer="/nonexistent")
    with caplog.at_level(logging.WARNING, logger="specgen.engines.openai_http"):
        with pytest.raises(EngineError) as info:
            asyncio.run(engine.start())
    said = str(info.value)
    assert SECRET not in said and f"GET {base}/v1/models" in said and "logged on the host" in said
    assert (f"answered {answer[0]}" in said) == (answer[0] != 200)
    assert SECRET in caplog.text          # the operator still has it


def test_a_servers_openai_error_message_is_quoted_and_anything_else_is_not(caplog) -> None:
    quoted = OpenAICompatEngine._error_text("u", '{"error": {"message": "maximum context length is 8192"}}')
    assert quoted == ": maximum context length is 8192"
    with caplog.at_level(logging.WARNING, logger="specgen.engines.openai_http"):
        other = OpenAICompatEngine._error_text("u", f"<html>{SECRET}</html>")
    assert SECRET not in other and "logged on the host" in other and SECRET in caplog.text
