"""specgen's OffloadingSpec for vLLM: manager and worker driven directly with vLLM's own spec types,
the control channel over real ZeroMQ, and one end-to-end run on vLLM's CPU engine with the tiny model:
the reasoning's blocks (decode blocks included) land in the pool, a fork after a local prefix-cache
reset loads them, and its output equals a full recompute's while it computes fewer tokens."""
from __future__ import annotations

import os
import time

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")

from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    make_offload_key,
)

from specgen.kv.pool_control import KvPoolController, PoolControlClient  # noqa: E402
from specgen.kv.pool_errors import KvPoolError  # noqa: E402
from specgen.kv.vllm_offload import (  # noqa: E402
    SUPPORTED_VLLM_VERSIONS,
    PoolSettings,
    SpecgenOffloadingManager,
    SpecgenOffloadingWorker,
    vllm_version,
)
from specgen.messages import KvPoolStats  # noqa: E402

PAGE = 4096          # bytes per block per layer in the direct tests
SLOTS = 4            # slots per segment


def _settings(pool_segments: int, **extra) -> PoolSettings:
    return PoolSettings.from_extra_config({"pool_device": "cpu", "pool_bytes": pool_segments * SLOTS * 2 * PAGE,
                                           "segment_bytes": SLOTS * 2 * PAGE, **extra})


def _caches(num_blocks: int = 32) -> tuple[list[torch.Tensor], CanonicalKVCaches]:
    """Two layers' caches as vLLM's connector hands them over: (num_blocks, page) byte views."""
    layers = [torch.randint(-128, 127, (num_blocks, PAGE), dtype=torch.int8) for _ in range(2)]
    caches = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, PAGE) for t in layers],
                               group_data_refs=[[CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE)]])
    return layers, caches


def _keys(*names: str) -> list[bytes]:
    return [make_offload_key(name.encode().ljust(32, b"\0"), 0) for name in names]


def _gpu_spec(blocks: list[int]) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0])


def _run_store(manager, worker, keys, blocks, job_id: int) -> None:
    ctx = ReqContext(req_id="r")
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    assert worker.submit_store(job_id, _gpu_spec([blocks[keys.index(k)] for k in out.keys_to_store]), out.store_spec)
    worker.wait({job_id})
    assert [r.job_id for r in worker.get_finished()] == [job_id]
    manager.complete_store(out.keys_to_store, ctx)


def test_supported_versions_include_the_installed_one() -> None:
    assert vllm_version() in SUPPORTED_VLLM_VERSIONS


def test_manager_and_worker_store_and_load_blocks() -> None:
    layers, caches = _caches()
    manager = SpecgenOffloadingManager(_settings(2), 2 * PAGE, SLOTS, "pool-a")
    worker = SpecgenOffloadingWorker(caches, manager.settings, SLOTS)
    keys = _keys("a", "b", "c")
    originals = [torch.cat([layer[b] for layer in layers]) for b in (3, 7, 9)]
    ctx = ReqContext(req_id="r")
    assert manager.lookup(keys[0], ctx) == LookupResult.MISS
    _run_store(manager, worker, keys, [3, 7, 9], job_id=1)
    assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 3
    for layer in layers:
        layer.zero_()
    spec = manager.prepare_load(keys, ctx)
    assert manager.stats().pinned_blocks == 3
    worker.submit_load(2, spec, _gpu_spec([20, 21, 22]))
    worker.wait({2})
    assert [r.job_id for r in worker.get_finished()] == [2]
    manager.complete_load(keys, ctx)
    for original, block in zip(originals, (20, 21, 22)):
        assert torch.equal(torch.cat([layer[block] for layer in layers]), original)
    stats = manager.stats()
    assert (stats.stores, stats.loads, stats.pinned_blocks, stats.segments) == (3, 3, 0, 2)
    worker.shutdown()


def test_store_evicts_lru_blocks_and_reports_their_vllm_keys() -> None:
    layers, caches = _caches()
    manager = SpecgenOffloadingManager(_settings(1), 2 * PAGE, SLOTS, "pool-b")
    worker = SpecgenOffloadingWorker(caches, manager.settings, SLOTS)
    first = _keys("1", "2", "3", "4")
    _run_store(manager, worker, first, [0, 1, 2, 3], job_id=1)
    manager.touch(first[:1], ReqContext(req_id="r"))
    out = manager.prepare_store(_keys("5"), ReqContext(req_id="r"))
    assert out.evicted_keys == [first[1]]
    assert manager.prepare_store(_keys("5"), ReqContext(req_id="r")).keys_to_store == []   # already held
    worker.shutdown()


def test_shrink_and_grow_reach_the_worker_through_the_segment_list() -> None:
    layers, caches = _caches()
    manager = SpecgenOffloadingManager(_settings(3), 2 * PAGE, SLOTS, "pool-c")
    worker = SpecgenOffloadingWorker(caches, manager.settings, SLOTS)
    keys = _keys(*"abcdef")
    _run_store(manager, worker, keys, list(range(6)), job_id=1)
    assert len(worker._memory) == 3
    manager._resize_to(1 * SLOTS * 2 * PAGE)
    stats = manager.stats()
    assert stats.segments == 1 and stats.shrinks == 2 and stats.used_blocks <= SLOTS
    _run_store(manager, worker, _keys("g"), [10], job_id=2)     # the next transfer frees the memory
    assert len(worker._memory) == 1
    manager._resize_to(3 * SLOTS * 2 * PAGE)
    _run_store(manager, worker, _keys("h"), [11], job_id=3)
    assert len(worker._memory) == 3 and manager.stats().grows == 5
    worker.shutdown()


def test_blocks_in_flight_hold_back_a_shrinking_segment() -> None:
    layers, caches = _caches()
    manager = SpecgenOffloadingManager(_settings(1), 2 * PAGE, SLOTS, "pool-d")
    worker = SpecgenOffloadingWorker(caches, manager.settings, SLOTS)
    keys = _keys("x")
    _run_store(manager, worker, keys, [5], job_id=1)
    ctx = ReqContext(req_id="r")
    spec = manager.prepare_load(keys, ctx)            # a load in flight pins the block
    manager._resize_to(0)
    assert manager.stats().segments == 1 and manager.has_pending_work()
    worker.submit_load(2, spec, _gpu_spec([6]))       # the segment is still listed: still mapped
    worker.wait({2})
    manager.complete_load(keys, ctx)
    manager.on_schedule_end(None)
    assert manager.stats().segments == 0 and not manager.has_pending_work()
    worker.shutdown()


def test_settings_are_checked() -> None:
    with pytest.raises(KvPoolError, match="needs pool_bytes"):
        PoolSettings.from_extra_config({})
    with pytest.raises(KvPoolError, match="expected 'cpu' or 'cuda:N'"):
        PoolSettings.from_extra_config({"pool_bytes": 1, "pool_device": "tpu"})
    assert PoolSettings.from_extra_config({"pool_bytes": 1, "pool_device": "cuda:1"}).pool_device == 1


def test_control_channel_carries_stats_and_resize_requests() -> None:
    controller = KvPoolController("tcp://127.0.0.1:*")
    client = PoolControlClient(controller.endpoint, "pool-e")
    try:
        client.send_stats(KvPoolStats(pool_id="pool-e", capacity_bytes=7))
        stats = controller.wait_for("pool-e", lambda s: s.capacity_bytes == 7, timeout_s=5)
        assert stats.pool_id == "pool-e"
        controller.resize("pool-e", 123, request_id="profiler-3")
        for _ in range(100):
            got = client.poll_resize()
            if got:
                break
            time.sleep(0.01)
        assert [(r.target_bytes, r.request_id) for r in got] == [(123, "profiler-3")]
        with pytest.raises(KvPoolError, match="not connected"):
            controller.resize("no-such-pool", 1)
    finally:
        client.close()
        controller.close()


@pytest.mark.vllm
def test_fork_reuses_reasoning_blocks_from_the_pool_on_vllms_cpu_engine() -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from specgen.engines.tiny_model import build_tiny_model, default_tiny_model_dir

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    path = build_tiny_model(default_tiny_model_dir())
    controller = KvPoolController("tcp://127.0.0.1:*")
    segment = 4 * 65536                      # 4 blocks of the tiny model (128 tokens, fp32)
    config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both", engine_id="specgen-kv-test",
        kv_connector_extra_config={
            "spec_name": "SpecgenOffloadingSpec", "spec_module_path": "specgen.kv.vllm_offload",
            "pool_device": "cpu", "pool_bytes": 4 * segment, "segment_bytes": segment,
            "control_endpoint": controller.endpoint, "stats_interval_s": 0.0,
        })
    llm = LLM(model=path, enable_prefix_caching=True, dtype="float32", max_model_len=4096, seed=0,
              kv_transfer_config=config, max_num_seqs=4)
    try:
        tokenizer = llm.get_tokenizer()
        prompt = tokenizer.encode("Let me think about how to make this kernel faster. " * 30)[:300]
        reasoning = list(llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                                      SamplingParams(max_tokens=300, temperature=0, ignore_eos=True))[0]
                         .outputs[0].token_ids)
        suffix = tokenizer.encode("</think> Now write the code:")
        fork = TokensPrompt(prompt_token_ids=prompt + reasoning + suffix)
        greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=1)

        llm.reset_prefix_cache()             # the engine's own cache forgets; the pool does not
        from_pool = llm.generate([fork], greedy)[0]
        llm.reset_prefix_cache(reset_connector=True)
        recomputed = llm.generate([fork], greedy)[0]

        # 610 prompt tokens = 4 full blocks of 128: two of prompt, two holding reasoning (decode) tokens.
        assert from_pool.num_cached_tokens == 512 > len(prompt)
        assert recomputed.num_cached_tokens == 0
        assert from_pool.outputs[0].token_ids == recomputed.outputs[0].token_ids
        for a, b in zip(from_pool.outputs[0].logprobs, recomputed.outputs[0].logprobs):
            (token,) = a.keys()
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-3)

        stats = controller.wait_for("specgen-kv-test", lambda s: s.loads >= 4, timeout_s=30)
        assert stats.stores >= 4 and stats.hits >= 4 and 0 < stats.hit_rate <= 1
        assert stats.capacity_bytes == 4 * segment

        # A profiler needs the memory: shrink to one segment, then grow back.
        controller.resize("specgen-kv-test", segment, request_id="profiler")
        llm.generate([TokensPrompt(prompt_token_ids=prompt[:20])], SamplingParams(max_tokens=2))
        small = controller.wait_for("specgen-kv-test", lambda s: s.segments == 1, timeout_s=30)
        assert small.capacity_bytes == segment and small.used_blocks <= 4
        controller.resize("specgen-kv-test", 4 * segment)
        llm.generate([TokensPrompt(prompt_token_ids=prompt[:20])], SamplingParams(max_tokens=2))
        controller.wait_for("specgen-kv-test", lambda s: s.segments == 4, timeout_s=30)
    finally:
        controller.close()
        del llm
