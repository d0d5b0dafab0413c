"""What a client's job may name for its engine on the scheduler's host (the setting
`engine_sources`): refused before anything is opened or fetched, the same words whatever the
host holds, allowed names used as before, and what the job reports keeps the host's paths and
fetched bytes to itself. The cluster's admin (the operator) is not held to it."""
from __future__ import annotations

import http.server
import json
import os
import sys
import threading
from pathlib import Path
from typing import Iterator

import msgspec
import pytest

from specgen.errors import UsageError
from specgen.messages import CreateJob, ErrorReply, Hello, JobCreated, JobSpec, Welcome
from specgen.runtime.auth import admin_credential
from specgen.runtime.client import Client
from specgen.runtime.engine_sources import EngineSources, Redactor, refusal, resolve
from specgen.runtime.journal import Journal
from specgen.runtime.local import LocalCluster
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import RemoteError
from specgen.traces.bundled import bundled_trace

from tests.runtime.conftest import PROBLEMS

PROBLEM = "class Model:\n    pass\n"
SECRET_BYTES = "answer-bytes-only-the-host-may-see"


# -- a server that records every request it gets -------------------------------------------------

class RecordingServer:
    """An HTTP server on loopback that records each request; `/v1/models` answers 500 with
    SECRET_BYTES, which a client must never read back."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.requests.append(self.path)
                body = SECRET_BYTES.encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    recording = RecordingServer()
    try:
        yield recording
    finally:
        recording.close()


def _refused(client: Client, engine: dict) -> str:
    with pytest.raises(RemoteError) as info:
        client.submit(PROBLEM, options={"engine": engine})
    assert info.value.code == "bad_request"
    return info.value.message


# -- the check, on its own ------------------------------------------------------------------------

def test_only_allowed_names_or_exact_values_pass_and_the_refusal_names_the_field_not_the_value() -> None:
    sources = EngineSources(models={"smol": "/srv/models/smol"}, base_urls={"local": "http://10.0.0.5:8000/v1"})
    assert refusal(None, sources) is None and refusal({"llm": "replay", "speed": 3.0}, sources) is None
    assert refusal({"llm": "vllm", "model": "smol"}, sources) is None
    assert refusal({"llm": "vllm", "model": "/srv/models/smol"}, sources) is None
    assert refusal({"llm": "openai", "base_url": "local", "model": "smol", "tokenizer": None}, sources) is None
    for engine in ({"llm": "vllm", "model": "/srv/models/other"}, {"llm": "vllm", "model": "smol2"},
                   {"llm": "vllm", "model": ["/srv/models/smol"]}):
        said = refusal(engine, sources)
        assert said is not None and "['model']" in said and "engine_sources.models: smol" in said
        assert "/srv" not in said and "smol2" not in said
    said = refusal({"llm": "openai", "base_url": "http://169.254.169.254/", "model": "smol"}, sources)
    assert said is not None and "engine_sources.base_urls: local" in said and "169.254" not in said
    said = refusal({"llm": "replay", "tokenizer": "/etc"}, sources)
    assert said is not None and "engine_sources.tokenizers: none" in said
    # A field the check does not know may name something on the host: refused until listed.
    assert "'weights'" in (refusal({"llm": "vllm", "weights": "/srv/w"}, sources) or "")
    assert refusal("vllm", sources) == "options['engine'] must be a mapping"


def test_the_packages_own_traces_need_no_entry_and_nothing_beside_them_passes() -> None:
    trace = bundled_trace("fused_elementwise")
    assert trace is not None
    sources = EngineSources()
    assert refusal({"trace": str(trace.resolve())}, sources) is None
    for elsewhere in (str(trace.parent / ".." / ".." / "problems" / "softmax.trace.json"),
                      "/etc/passwd", "softmax.trace.json", str(trace.parent / "notes.txt")):
        assert refusal({"trace": elsewhere}, sources) is not None, elsewhere


def test_the_reasoner_uses_the_allowed_value_and_reports_it_by_its_name(tmp_path: Path) -> None:
    model = tmp_path / "models" / "smol"
    model.mkdir(parents=True)
    sources = EngineSources(models={"smol": str(model)}, base_urls={"local": "http://10.0.0.5:8000/v1/"},
                            tokenizers={"tok": str(model)})
    options = {"engine": {"llm": "openai", "base_url": "local", "model": "smol", "tokenizer": str(model)}}
    redact = resolve(options, sources)
    assert options["engine"] == {"llm": "openai", "base_url": "http://10.0.0.5:8000/v1/",
                                 "model": str(model), "tokenizer": str(model)}
    error = (f"openai: cannot reach the server at http://10.0.0.5:8000/v1 (refused); cannot load "
             f"tokenizer '{model}/tokenizer.json' ({os.path.realpath(model)}/config.json)")
    shown = redact({"error": error, "items": [error], "n": 3})
    assert str(tmp_path) not in json.dumps(shown) and "10.0.0.5" not in json.dumps(shown)
    assert "<base_url local>" in shown["error"] and "<tokenizer tok>/tokenizer.json" in shown["error"]
    assert shown["n"] == 3 and shown["items"] == [shown["error"]]
    # A served model's name says nothing of the host: left as it is.
    assert Redactor({"SmolLM2-135M": "<model m>"})("serves SmolLM2-135M") == "serves SmolLM2-135M"


def test_the_setting_is_typed_and_its_names_are_plain_words() -> None:
    settings = RuntimeSettings().with_overrides(['engine_sources={"models": {"smol": "/srv/smol"}}'])
    assert settings.engine_sources.models == {"smol": "/srv/smol"}
    assert RuntimeSettings(engine_sources={"base_urls": {"a": "http://h/v1"}}).engine_sources.base_urls
    with pytest.raises(UsageError, match="engine_sources"):
        RuntimeSettings(engine_sources={"modles": {}})
    with pytest.raises(UsageError, match="plain word"):
        RuntimeSettings(engine_sources={"models": {"/srv/smol": "/srv/smol"}}).check()


# -- in the scheduler: refused before the host is touched -----------------------------------------

def test_the_scheduler_refuses_before_it_opens_or_fetches_anything(tmp_path: Path, monkeypatch) -> None:
    """The check runs in the scheduler's core: every file opening, stat and connection of this
    process is watched while it does, and none concerns what the client named."""
    secret = os.urandom(32)
    core = SchedulerCore(RuntimeSettings(), Journal(":memory:"), join_secret=secret, now=0.0)
    plain, admin = b"client/plain/1", b"client/admin/1"
    core.handle(plain, Hello(role="client", name="plain"), 0.0)
    core.handle(admin, Hello(role="client", name="op", credential=admin_credential(secret, "op")), 0.0)
    assert [type(m) for _, m in core.outbox] == [Welcome, Welcome]
    core.outbox.clear()

    existing = tmp_path / "model"
    existing.mkdir()
    touched: list[str] = []
    watching = True

    def audit(event: str, args: tuple) -> None:
        if watching and event in ("open", "os.listdir", "os.scandir", "socket.connect", "socket.getaddrinfo"):
            touched.append(f"{event} {args[:2]!r}")

    sys.addaudithook(audit)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: (touched.append(f"stat {path!r}"),
                                                         real_stat(path, *a, **k))[1])
    said = []
    try:
        for n, engine in enumerate([{"llm": "vllm", "model": str(existing)},
                                    {"llm": "vllm", "model": str(tmp_path / "missing")},
                                    {"llm": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
                                     "tokenizer": str(existing)}]):
            core.handle(plain, CreateJob(call_id=n, spec=JobSpec(problem_source=PROBLEM, job_id=f"J{n}",
                                                                 options={"engine": engine})), 0.0)
            [(_, reply)] = core.outbox
            core.outbox.clear()
            assert isinstance(reply, ErrorReply) and reply.code == "bad_request"
            said.append(reply.message)
    finally:
        watching = False
    assert [t for t in touched if str(tmp_path) in t or "127.0.0.1" in t] == []
    # The same words for a directory that exists and one that does not.
    assert said[0] == said[1] and str(tmp_path) not in said[0] and "engine_sources.models" in said[0]
    assert "engine_sources.base_urls" in said[2]
    assert core.actions == [] and core.counters["jobs_refused"] == 3
    # The operator's own client is trusted: the same job is taken.
    core.handle(admin, CreateJob(call_id=9, spec=JobSpec(problem_source=PROBLEM, job_id="A",
                                                         options={"engine": {"llm": "vllm", "model": str(existing)}})), 0.0)
    assert any(isinstance(m, JobCreated) for _, m in core.outbox) and core.actions == [("start_reasoner", "A")]


def test_a_dead_reasoners_log_stays_on_the_host() -> None:
    core = SchedulerCore(RuntimeSettings(reasoner_max_restarts=1), Journal(":memory:"), now=0.0)
    client = b"client/c/1"
    core.handle(client, Hello(role="client", name="c"), 0.0)
    core.handle(client, CreateJob(call_id=1, spec=JobSpec(problem_source=PROBLEM, job_id="D")), 0.0)
    tail = 'Traceback (most recent call last):\n  File "/home/op/site-packages/specgen/x.py", line 3'
    core.reasoner_exited("D", -9, tail, 0.0)
    core.reasoner_exited("D", -9, tail, 0.0)
    events = [m.event for _, m in core.outbox if hasattr(m, "event")]
    result = core.views.job_status("D").result
    shown = json.dumps([msgspec.to_builtins(e) for e in events]) + (result.error or "")
    assert "/home/op" not in shown and "Traceback" not in shown
    assert "reasoner_max_restarts" in result.error and "log on the scheduler's host" in result.error


# -- through a real cluster -----------------------------------------------------------------------

def test_a_plain_client_gets_the_same_refusal_whether_a_path_exists_or_not(tmp_path: Path) -> None:
    existing = tmp_path / "weights"
    existing.mkdir()
    (tmp_path / "trace.json").write_text("{}")
    with LocalCluster(workers=1, evaluator="replay") as cluster:
        client = Client(cluster.address)
        try:
            for field, llm, there, missing in [
                    ("model", "vllm", str(existing), str(tmp_path / "nothing")),
                    ("tokenizer", "replay", str(existing), str(tmp_path / "nothing")),
                    ("trace", "replay", str(tmp_path / "trace.json"), str(tmp_path / "none.json"))]:
                said = [_refused(client, {"llm": llm, field: path}) for path in (there, missing)]
                assert said[0] == said[1], field
                assert f"['{field}']" in said[0] and str(tmp_path) not in said[0]
            assert client.stats().jobs_by_state == {}
        finally:
            client.close()


def test_a_base_url_not_allowed_is_never_fetched(server: RecordingServer) -> None:
    settings = RuntimeSettings(engine_sources={"base_urls": {"other": "http://127.0.0.1:9/v1"},
                                               "models": {"m": "served"}})
    with LocalCluster(workers=1, evaluator="replay", settings=settings) as cluster:
        client = Client(cluster.address)
        try:
            for base_url in (server.url, server.url + "/", "local"):
                said = _refused(client, {"llm": "openai", "base_url": base_url, "model": "m"})
                assert "engine_sources.base_urls: other" in said and "127.0.0.1" not in said
        finally:
            client.close()
        assert server.requests == []
        # The operator is trusted: the admin's job with that URL reaches the server, which shows
        # the refusals above did not fail for want of a server.
        job = cluster.client.submit(PROBLEMS / "softmax.py", max_iterations=1, options={
            "engine": {"llm": "openai", "base_url": server.url, "model": "m", "tokenizer": "/nonexistent"}})
        result = job.result(timeout=120)
    assert result.status == "failed" and server.requests == ["/v1/models"]


def test_an_allowed_base_url_works_by_name_and_the_error_keeps_the_host_to_itself(
        server: RecordingServer, tmp_path: Path) -> None:
    settings = RuntimeSettings(engine_sources={"base_urls": {"local": server.url},
                                               "models": {"m": "served-model"},
                                               "tokenizers": {"tok": str(tmp_path)}})
    with LocalCluster(workers=1, evaluator="replay", settings=settings) as cluster:
        client = Client(cluster.address)
        try:
            job = client.submit(PROBLEMS / "softmax.py", max_iterations=1, options={
                "engine": {"llm": "openai", "base_url": "local", "model": "m", "tokenizer": "tok"}})
            result = job.result(timeout=120)
            events = list(job.events(timeout=30))
        finally:
            client.close()
    assert server.requests == ["/v1/models"]          # the allowed server, named by its name
    assert result.status == "failed" and "<base_url local>/models answered 500" in result.error
    shown = (result.error or "") + json.dumps(result.summary) + json.dumps([msgspec.to_builtins(e) for e in events])
    assert SECRET_BYTES not in shown and server.url not in shown and str(tmp_path) not in shown
