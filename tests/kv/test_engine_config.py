"""Where `--kv-pool` puts the main job's KV pool, and the connector settings it makes."""
from __future__ import annotations

import pytest

from specgen.errors import UsageError
from specgen.kv.engine_config import plan_kv_pool


def test_auto_takes_a_profiling_gpu_and_never_the_inference_gpu() -> None:
    plan = plan_kv_pool("auto", ["cuda:1", "cuda:2"], inference_device="cuda:0", pool_gib=2)
    assert plan.device == "cuda:1" and plan.pool_bytes == 2 << 30
    assert plan_kv_pool("auto", ["cuda:0"], inference_device="cuda:0").device == "cpu"
    assert plan_kv_pool("auto", ["cpu", "cpu"]).device == "cpu"


def test_explicit_choices() -> None:
    assert not plan_kv_pool("off", ["cuda:1"]).on
    assert plan_kv_pool("host", ["cuda:1"]).device == "cpu"
    with pytest.raises(UsageError, match="besides the inference GPU"):
        plan_kv_pool("gpus", ["cuda:0", "cpu"])
    with pytest.raises(UsageError, match="--kv-pool must be one of"):
        plan_kv_pool("disk", ["cpu"])
    with pytest.raises(UsageError, match="--kv-pool-gib"):
        plan_kv_pool("host", ["cpu"], pool_gib=0)


def test_extra_config_is_what_the_spec_reads() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    from specgen.kv.vllm_offload import PoolSettings

    plan = plan_kv_pool("host", ["cpu"], pool_gib=0.5)
    settings = PoolSettings.from_extra_config(plan.extra_config("tcp://127.0.0.1:9"))
    assert settings.pool_bytes == 1 << 29 and settings.control_endpoint == "tcp://127.0.0.1:9"
    assert settings.segment_bytes <= settings.pool_bytes
