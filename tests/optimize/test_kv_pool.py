"""The main job with the KV pool: `specgen optimize --llm vllm --kv-pool host` on vLLM's CPU engine
(the tiny model) configures specgen's offloading spec, registers the pool with the local
scheduler, and reports what the pool did in result.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.traces.bundled import PROBLEMS_DIR

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_main_job_keeps_its_kv_blocks_in_the_pool(tmp_path: Path, tiny_model_path: str,
                                                      monkeypatch, capsys) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = tmp_path / "run"
    code = main(["optimize", str(PROBLEMS_DIR / "softmax.py"), "--llm", "vllm", "--model", tiny_model_path,
                 "--kv-pool", "host", "--kv-pool-gib", "0.25", "--max-iterations", "1",
                 "--time-budget", "120", "--reasoning-max-tokens", "300", "--fork-max-tokens", "32",
                 "--devices", "cpu", "--out", str(out)])
    assert code == 0
    said = capsys.readouterr().err
    assert "KV pool: 0.25 GiB in host memory" in said and "registered with the scheduler" in said
    result = json.loads((out / "result.json").read_text())
    kv = result["kv_pool"]
    assert kv is not None, "the pool never reported to the scheduler"
    assert kv["capacity_bytes"] <= 1 << 28 and kv["devices"] == [-1]
    assert kv["stores"] >= 1          # the prompt's and the reasoning's full blocks
    assert "KV pool:" in said and "blocks stored" in said


def test_a_pool_needs_a_vllm_engine(capsys) -> None:
    assert main(["optimize", "--kv-pool", "host", "--quiet"]) == 2
    assert "--kv-pool host needs --llm vllm" in capsys.readouterr().err


def test_a_scheduled_job_keeps_its_kv_blocks_in_the_pool(tmp_path: Path, tiny_model_path: str,
                                                         monkeypatch, capsys) -> None:
    """The same job sent to a running scheduler: its reasoner configures the engine's pool where
    `--kv-pool` says (host memory: the cluster has no GPU here) and registers it on the scheduler's
    KV control channel; the result the command writes carries the pool's figures."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    from specgen.runtime.local import LocalCluster
    from specgen.runtime.settings import RuntimeSettings

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")   # inherited by the cluster's reasoner
    out = tmp_path / "run"
    # A plain client names only the models the scheduler allows (RuntimeSettings.engine_sources).
    allowed = RuntimeSettings(engine_sources={"models": {"tiny": str(Path(tiny_model_path).resolve())}})
    with LocalCluster(devices=["cpu"], kv_control=True, settings=allowed) as cluster:
        code = main(["optimize", str(PROBLEMS_DIR / "softmax.py"), "--llm", "vllm", "--model", tiny_model_path,
                     "--kv-pool-gib", "0.25", "--max-iterations", "1", "--time-budget", "120",
                     "--reasoning-max-tokens", "300", "--fork-max-tokens", "32",
                     "--scheduler", cluster.address, "--out", str(out)])
        pools = cluster.client.stats().kv_pools
    assert code == 0, capsys.readouterr().err
    assert len(pools) == 1 and pools[0].stats.devices == [-1]
    kv = json.loads((out / "result.json").read_text())["kv_pool"]
    assert kv is not None and kv["capacity_bytes"] <= 1 << 28 and kv["stores"] >= 1
