"""Session fixtures for engine tests: the tiny model is built once and cached across runs, and one
vLLM engine serves every test that needs it (engine start-up costs 20-60 s on the 2-core CI machine).

Async code runs on one event loop for the whole session (`loop.run(coro)`), because an `AsyncLLM`
is bound to the loop it first streams on.

`vllm_serve` starts a real `vllm serve` on 127.0.0.1 through the launcher for the tests that talk
to one over HTTP (tests/engines/test_openai_http.py, tests/bench/test_openai_endpoint.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Iterator, TypeVar

import pytest

from specgen.engines.tiny_model import build_tiny_model, default_tiny_model_dir

# Nothing may be downloaded in tests; vLLM's CPU engine gets a small KV cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

T = TypeVar("T")


class LoopRunner:
    """Runs coroutines on one long-lived event loop, each under a timeout."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T], timeout_s: float = 120.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout_s))

    def close(self) -> None:
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopRunner]:
    runner = LoopRunner()
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Path of the tiny random-weight Qwen2 (built on first use; `SPECGEN_CACHE_DIR` moves the cache)."""
    return build_tiny_model(default_tiny_model_dir())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def engines_cache_dir() -> Path:
    return default_tiny_model_dir().parent


@pytest.fixture(scope="session")
def tiny_vllm_engine(loop: LoopRunner, tiny_model_path: str) -> Iterator[Any]:
    """A started `VLLMEngine` on the tiny model, shared by every test of the session."""
    from specgen.engines.vllm_engine import VLLMEngine

    # Eager mode: skips torch.compile, which costs more start-up time than these short tests save.
    engine = VLLMEngine(
        tiny_model_path, max_model_len=8192, kv_cache_gib=1, dtype="float32", engine_args={"enforce_eager": True}
    )
    loop.run(engine.start(), timeout_s=600)
    yield engine
    loop.run(engine.close(), timeout_s=120)


SERVER_START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    def __init__(self, process: subprocess.Popen, port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            return response.read().decode()

    def metric(self, name: str) -> float:
        """The sum of every sample of the server's metric `name` (all its label sets), e.g.
        "vllm:generation_tokens_total": a counter's difference over a stretch of work says what
        the server did in it."""
        samples = [line.rsplit(" ", 1)[1] for line in self.metrics_text().splitlines()
                   if line.split("{", 1)[0].split(" ", 1)[0] == name]
        assert samples, f"the server exports no {name}"
        return sum(float(value) for value in samples)

    def running_requests(self) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in self.metrics_text().splitlines()
            if line.startswith("vllm:num_requests_running")
        )

    def engine_steps(self) -> float:
        """How many steps the server's engine has run (its `vllm:iteration_tokens_total` count): a
        counter, so a difference over a stretch of work says what the engine did in it."""
        lines = [line for line in self.metrics_text().splitlines()
                 if line.startswith("vllm:iteration_tokens_total_count")]
        assert lines, "the server exports no vllm:iteration_tokens_total (engine steps)"
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@contextlib.contextmanager
def vllm_serve(model_path: str, served_name: str, log_dir: Path, *options: str,
               env: dict[str, str] | None = None) -> Iterator[VllmServer]:
    """`vllm serve MODEL --served-model-name NAME OPTIONS...` on a free port of 127.0.0.1 (through
    `specgen.engines.serve_vllm`, with `env` added to its environment), yielded once its model
    list answers; killed on exit. A server that exits or is not up within SERVER_START_TIMEOUT_S
    fails the test with its log."""
    port = free_port()
    log_path = log_dir / "server.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", **(env or {}))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "specgen.engines.serve_vllm", model_path,
             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name, *options],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    server = VllmServer(process, port, log_path)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.base_url}/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve not up after {SERVER_START_TIMEOUT_S} s:\n{server.log_tail()}")
                time.sleep(1)
        yield server
    finally:
        server.kill()
