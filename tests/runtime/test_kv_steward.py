"""Remote KV pools and the scheduler: the steward's decisions (plain logic, the test's clock), the
scheduler core sending them with the work they make room for, and a live cluster steering a real
RemoteKvPool in host memory over the control channel while a real candidate is evaluated."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from specgen.cli import main as cli_main
from specgen.errors import UsageError
from specgen.messages import (
    AssignWork, CandidateSubmission, CandidateUpdate, EvaluateRequest, Hello, KvPoolResize, KvPoolStats,
    Verdict, WorkDone,
)
from specgen.runtime.journal import Journal
from specgen.runtime.kv_steward import KvPoolSteward, WorkerPlacement, device_index
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings

from tests.runtime.conftest import WRONG, quick_eval_settings, wait_for

POOL = b"engine-0"
GIB = 1 << 30


def gpu_pool(capacity: int = 10 * GIB, host: str = "h1", devices: tuple[int, ...] = (0,)) -> KvPoolStats:
    return KvPoolStats(pool_id=POOL.decode(), capacity_bytes=capacity, host=host, devices=list(devices))


def gpu_worker(busy: bool, name: str = "h1/gpu0", host: str = "h1", device: str = "cuda:0") -> WorkerPlacement:
    return WorkerPlacement(name=name, host=host, device=device_index(device), busy=busy)


def targets(requests: list[tuple[bytes, KvPoolResize]]) -> list[tuple[bytes, int | None]]:
    return [(identity, r.target_bytes) for identity, r in requests]


def steward(reserve: int = 3 * GIB, regrow: float = 1.0, timeout: float = 30.0) -> KvPoolSteward:
    return KvPoolSteward(reserve_bytes=reserve, regrow_idle_s=regrow, pool_timeout_s=timeout)


# -- the steward's decisions ---------------------------------------------------------------------

def test_work_on_a_paired_worker_shrinks_its_pool_once_and_idleness_grows_it_back() -> None:
    s = steward()
    s.on_stats(POOL, gpu_pool(), now=0.0)
    assert s.steer([gpu_worker(busy=False)], now=0.0) == []
    assert targets(s.steer([gpu_worker(busy=True)], now=1.0)) == [(POOL, 7 * GIB)]
    # The pool reports its new size: the size to restore stays the one from before the busy period.
    s.on_stats(POOL, gpu_pool(capacity=7 * GIB), now=1.5)
    for t in (2.0, 3.0, 4.0):
        assert s.steer([gpu_worker(busy=True)], now=t) == [], "one shrink per busy period"
    [view] = s.views(now=4.0)
    assert (view.restore_bytes, view.target_bytes, view.busy_devices) == (10 * GIB, 7 * GIB, 1)
    assert view.paired_workers == ["h1/gpu0"]
    # Idle: the pool grows back once the device stayed idle for regrow_idle_s, and only once.
    assert s.steer([gpu_worker(busy=False)], now=5.0) == []
    assert s.steer([gpu_worker(busy=False)], now=5.9) == []
    assert targets(s.steer([gpu_worker(busy=False)], now=6.0)) == [(POOL, 10 * GIB)]
    s.on_stats(POOL, gpu_pool(), now=6.2)
    assert s.steer([gpu_worker(busy=False)], now=9.0) == []
    [view] = s.views(now=9.0)
    assert (view.shrinks_requested, view.grows_requested, view.restore_bytes) == (1, 1, None)


def test_a_worker_that_takes_its_next_request_soon_keeps_the_room_no_flapping() -> None:
    s = steward(regrow=1.0)
    s.on_stats(POOL, gpu_pool(), now=0.0)
    sent = s.steer([gpu_worker(busy=True)], now=0.0)
    for t in (0.5, 0.6, 1.0, 1.2, 1.9, 2.0):    # short gaps between requests
        busy = t not in (0.5, 1.0, 1.9)
        sent += s.steer([gpu_worker(busy=busy)], now=t)
    assert targets(sent) == [(POOL, 7 * GIB)]
    sent = s.steer([gpu_worker(busy=False)], now=3.0) + s.steer([gpu_worker(busy=False)], now=4.0)
    assert targets(sent) == [(POOL, 10 * GIB)]
    # The next busy period starts from the size the pool reports then.
    s.on_stats(POOL, gpu_pool(capacity=9 * GIB), now=4.5)
    assert targets(s.steer([gpu_worker(busy=True)], now=5.0)) == [(POOL, 6 * GIB)]


def test_workers_elsewhere_are_not_paired_and_change_nothing() -> None:
    s = steward()
    s.on_stats(POOL, gpu_pool(), now=0.0)
    strangers = [
        gpu_worker(busy=True, name="h2/gpu0", host="h2"),               # same device, other host
        gpu_worker(busy=True, name="h1/gpu1", device="cuda:1"),         # same host, other GPU
        gpu_worker(busy=True, name="h1/cpu0", device="cpu"),            # host memory is not GPU 0
        gpu_worker(busy=True, name="h1/odd", device="npu:0"),           # a device pools cannot be on
    ]
    assert s.steer(strangers, now=1.0) == []
    [view] = s.views(now=1.0)
    assert view.paired_workers == [] and view.busy_devices == 0


def test_a_host_memory_pool_pairs_with_that_hosts_cpu_workers() -> None:
    s = steward(reserve=100)
    s.on_stats(POOL, KvPoolStats(capacity_bytes=400, host="h1", devices=[-1]), now=0.0)
    cpu = [gpu_worker(busy=True, name="h1/cpu0", device="cpu"), gpu_worker(busy=False, name="h1/cpu1", device="cpu")]
    assert targets(s.steer(cpu, now=0.0)) == [(POOL, 300)], "host memory is one device: one reserve"
    assert s.views(now=0.0)[0].paired_workers == ["h1/cpu0", "h1/cpu1"]


def test_the_pool_grows_back_only_when_nothing_runs_on_its_device() -> None:
    s = steward(regrow=0.5)
    s.on_stats(POOL, gpu_pool(), now=0.0)
    a, b = "h1/gpu0-a", "h1/gpu0-b"     # two workers sharing GPU 0
    sent = s.steer([gpu_worker(True, a), gpu_worker(False, b)], now=0.0)
    sent += s.steer([gpu_worker(True, a), gpu_worker(True, b)], now=0.1)
    sent += s.steer([gpu_worker(False, a), gpu_worker(True, b)], now=1.0)
    sent += s.steer([gpu_worker(False, a), gpu_worker(True, b)], now=2.0)
    assert targets(sent) == [(POOL, 7 * GIB)]
    s.steer([gpu_worker(False, a), gpu_worker(False, b)], now=3.0)
    assert targets(s.steer([gpu_worker(False, a), gpu_worker(False, b)], now=3.5)) == [(POOL, 10 * GIB)]


def test_a_pool_on_two_gpus_reserves_per_busy_gpu() -> None:
    s = steward(regrow=0.5)
    s.on_stats(POOL, gpu_pool(devices=(0, 1)), now=0.0)
    g0, g1 = "h1/gpu0", "h1/gpu1"
    assert targets(s.steer([gpu_worker(True, g0), gpu_worker(False, g1, device="cuda:1")], 0.0)) == [(POOL, 7 * GIB)]
    assert targets(s.steer([gpu_worker(True, g0), gpu_worker(True, g1, device="cuda:1")], 1.0)) == [(POOL, 4 * GIB)]
    s.steer([gpu_worker(False, g0), gpu_worker(True, g1, device="cuda:1")], 2.0)
    assert targets(s.steer([gpu_worker(False, g0), gpu_worker(True, g1, device="cuda:1")], 2.5)) == [(POOL, 7 * GIB)]
    s.steer([gpu_worker(False, g0), gpu_worker(False, g1, device="cuda:1")], 3.0)
    assert targets(s.steer([gpu_worker(False, g0), gpu_worker(False, g1, device="cuda:1")], 3.5)) == [(POOL, 10 * GIB)]


def test_the_target_never_goes_below_zero_and_an_empty_pool_is_left_alone() -> None:
    s = steward(reserve=3 * GIB)
    s.on_stats(POOL, gpu_pool(capacity=GIB), now=0.0)
    s.on_stats(b"empty", gpu_pool(capacity=0), now=0.0)
    assert targets(s.steer([gpu_worker(busy=True)], now=0.0)) == [(POOL, 0)]
    s.steer([gpu_worker(busy=False)], now=1.0)
    assert targets(s.steer([gpu_worker(busy=False)], now=2.0)) == [(POOL, GIB)]


def test_no_reserve_means_stats_only() -> None:
    s = steward(reserve=0)
    s.on_stats(POOL, gpu_pool(), now=0.0)
    assert s.steer([gpu_worker(busy=True)], now=0.0) == []
    assert s.views(now=0.0)[0].busy_devices == 1


def test_a_silent_pool_is_forgotten_and_starts_afresh_when_it_comes_back() -> None:
    s = steward(timeout=5.0)
    s.on_stats(POOL, gpu_pool(), now=0.0)
    s.steer([gpu_worker(busy=True)], now=0.0)
    assert s.expire(now=4.9) == [] and len(s.views(now=4.9)) == 1
    assert s.expire(now=5.1) == [POOL] and s.views(now=5.1) == []
    s.on_stats(POOL, gpu_pool(capacity=7 * GIB), now=6.0)
    assert targets(s.steer([gpu_worker(busy=True)], now=6.0)) == [(POOL, 4 * GIB)]


def test_an_undelivered_request_is_sent_again_when_the_pool_reports() -> None:
    s = steward()
    s.on_stats(POOL, gpu_pool(), now=0.0)
    assert targets(s.steer([gpu_worker(busy=True)], now=0.0)) == [(POOL, 7 * GIB)]
    s.send_failed(POOL)
    assert s.steer([gpu_worker(busy=True)], now=1.0) == []
    s.on_stats(POOL, gpu_pool(), now=2.0)
    assert targets(s.steer([gpu_worker(busy=True)], now=2.0)) == [(POOL, 7 * GIB)]
    assert s.steer([gpu_worker(busy=True)], now=3.0) == []


# -- the scheduler core ---------------------------------------------------------------------------

def test_the_core_asks_for_room_in_the_pass_that_assigns_the_work_and_reports_pools() -> None:
    now = 100.0
    core = SchedulerCore(RuntimeSettings(kv_reserve_bytes=GIB, kv_regrow_idle_s=1.0), Journal(":memory:"),
                         wall=lambda: 5000.0, now=now)
    worker, client = b"worker/h1/gpu0/x", b"client/c/1"
    core.handle(worker, Hello(role="worker", name="h1/gpu0", node="h1", device="cuda:0", host="h1"), now)
    core.handle(client, Hello(role="client", name="c"), now)
    core.on_kv_stats(POOL, gpu_pool(capacity=4 * GIB), now)
    core.schedule(now)
    assert core.kv_outbox == []
    core.outbox.clear()
    sub = CandidateSubmission(job_id="", candidate_id="c1", problem_name="p", problem_source="x",
                              candidate_source="y")
    core.handle(client, EvaluateRequest(call_id=1, submission=sub, stage="validate"), now)
    core.schedule(now)
    [assign] = [m for p, m in core.outbox if isinstance(m, AssignWork)]
    assert targets(core.kv_outbox) == [(POOL, 3 * GIB)]
    core.kv_outbox.clear()
    upd = CandidateUpdate(job_id="", candidate_id="c1", stage="validate", verdict=Verdict(stage="validate"))
    core.handle(worker, WorkDone(call_id=2, request_id=assign.request_id, update=upd), now + 2.0)
    core.schedule(now + 2.0)
    assert core.kv_outbox == []
    core.tick(now + 3.0)
    core.schedule(now + 3.0)
    assert targets(core.kv_outbox) == [(POOL, 4 * GIB)]
    stats = core.stats(now + 3.0)
    [view] = stats.kv_pools
    assert view.pool == POOL.decode() and view.paired_workers == ["h1/gpu0"]
    assert (view.shrinks_requested, view.grows_requested) == (1, 1)
    assert stats.workers[0].host == "h1"
    core.tick(now + 3.0 + core.settings.kv_pool_timeout_s + 1)
    assert core.stats(now + 40.0).kv_pools == []


def test_a_non_loopback_control_address_is_refused_naming_the_setting(tmp_path) -> None:
    assert RuntimeSettings(kv_control_bind="tcp://127.0.0.1:5600").check()
    with pytest.raises(UsageError, match="kv_control_bind"):
        RuntimeSettings().with_overrides(["kv_control_bind=tcp://0.0.0.0:5600"])
    done = subprocess.run(
        [sys.executable, "-m", "specgen.runtime.scheduler", "--bind", f"ipc://{tmp_path}/s.sock",
         "--state-dir", str(tmp_path / "state"), "--set", "kv_control_bind=tcp://0.0.0.0:5600"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "kv_control_bind" in done.stderr and "loopback" in done.stderr


# -- live: a cluster steering a real pool ---------------------------------------------------------

class PoolOwner:
    """A process-local RemoteKvPool served on the control channel by its own thread (the only thread
    that touches the pool once it runs), recording when each resize was applied. In host memory, or
    (pool_device >= 0) on that GPU, with the engine's cache on cuda:0."""

    def __init__(self, endpoint: str, pool_device: int = -1) -> None:
        import torch

        from specgen.kv.layout import KvLayout
        from specgen.kv.pool import RemoteKvPool
        from specgen.kv.pool_control import PoolControlAgent

        cache_device = "cpu" if pool_device < 0 else "cuda:0"
        tensors = [torch.randn(16, 1, 16, 64, device=cache_device) for _ in range(2)]
        layout = KvLayout.from_tensors(tensors, 16)
        self.tensors = tensors
        self.segment = 4 * layout.slot_bytes
        self.pool = RemoteKvPool(layout, devices=[pool_device], segment_bytes=self.segment,
                                 max_bytes=4 * self.segment, pool_id="engine-live")
        assert self.pool.grow() == 4 * self.segment
        hashes = [f"block{i}".encode() for i in range(6)]
        self.pool.store(hashes, range(6)).wait()
        assert self.pool.lookup(hashes[:3] + [b"never-stored"]) == 3    # hit rate 3/4
        self.agent = PoolControlAgent(self.pool, endpoint, stats_interval_s=0.1)
        self.applied: list[tuple[float, int | None, int]] = []          # (when, target, capacity after)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-pool-owner", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.wait(0.01):
            for request in self.agent.step():
                self.applied.append((time.monotonic(), request.target_bytes, self.pool.capacity_bytes))

    def stop_serving(self) -> None:
        """After this the pool belongs to the caller's thread."""
        self._stop.set()
        self._thread.join(5)

    def close(self) -> None:
        self.stop_serving()
        self.agent.close()
        self.pool.close()


def only_pool(cluster):
    """The scheduler's view of the cluster's one KV pool, or None before it reported."""
    pools = cluster.client.stats().kv_pools
    return pools[0] if pools else None


def test_live_pool_shrinks_while_its_worker_evaluates_and_grows_back(
        softmax_problem: str, softmax_candidate: str, capsys: pytest.CaptureFixture) -> None:
    from specgen.runtime.local import LocalCluster

    settings = quick_eval_settings(kv_reserve_bytes=1, kv_regrow_idle_s=1.0)
    with LocalCluster(workers=1, settings=settings, kv_control=True) as cluster:
        assert cluster.kv_control_endpoint and cluster.kv_control_endpoint.startswith("ipc://")
        owner = PoolOwner(cluster.kv_control_endpoint)
        try:
            segment = owner.segment

            def view():
                return only_pool(cluster)

            first = wait_for(view, 30, "the pool's stats to reach the scheduler")
            assert first.pool == "engine-live" and first.paired_workers == ["local0/cpu0"]
            assert first.stats.host == socket.gethostname() and first.stats.devices == [-1]
            assert first.stats.capacity_bytes == 4 * segment and first.stats.used_blocks == 6
            assert first.stats.hit_rate == pytest.approx(0.75)

            # Two evaluations back to back on the paired worker: one shrink (a reserve of 1 byte takes
            # one whole segment), one grow-back after both; the short gap between them keeps the room.
            started = time.monotonic()
            good = cluster.client.evaluate(softmax_problem, softmax_candidate, stage="validate")
            bad = cluster.client.evaluate(softmax_problem, WRONG, stage="validate")
            returned = time.monotonic()
            assert good.correct and not bad.correct
            wait_for(lambda: len(owner.applied) >= 2, 30, "the pool to grow back")
            (shrunk_at, shrink_to, after_shrink), (grown_at, grow_to, after_grow) = owner.applied[:2]
            assert (shrink_to, after_shrink) == (4 * segment - 1, 3 * segment)
            assert (grow_to, after_grow) == (4 * segment, 4 * segment)
            assert started < shrunk_at < returned < grown_at, "shrunk while evaluating, grown back after"
            assert grown_at - returned >= 0.5 * settings.kv_regrow_idle_s, "the idle delay was respected"
            time.sleep(0.5)
            assert len(owner.applied) == 2, "no flapping"
            done = wait_for(lambda: (v := view()) and v.stats.grows == 5 and v, 10, "stats after the grow-back")
            assert (done.shrinks_requested, done.grows_requested, done.restore_bytes) == (1, 1, None)
            assert (done.stats.shrinks, done.stats.capacity_bytes) == (1, 4 * segment)
            assert cli_main(["status", "--scheduler", cluster.address]) == 0
            out = capsys.readouterr().out
            assert "kv engine-live" in out and "hit rate 75%" in out and "paired local0/cpu0" in out
        finally:
            owner.close()


@pytest.mark.gpu
def test_live_gpu_pool_shrinks_while_the_gpu_worker_beside_it_evaluates(
        softmax_problem: str, softmax_candidate: str) -> None:
    """The same on a GPU: the pool's segments in that GPU's memory (the second GPU where there are
    two, filled from a cache on the first), a real GPU worker evaluating on the same GPU."""
    import torch

    from specgen.runtime.local import LocalCluster

    gpu = 1 if torch.cuda.device_count() > 1 else 0
    settings = quick_eval_settings(kv_reserve_bytes=1, kv_regrow_idle_s=1.0)
    with LocalCluster(devices=[f"cuda:{gpu}"], settings=settings, kv_control=True) as cluster:
        owner = PoolOwner(cluster.kv_control_endpoint, pool_device=gpu)
        try:
            segment = owner.segment
            first = wait_for(lambda: only_pool(cluster), 30, "the GPU pool's stats to reach the scheduler")
            assert first.paired_workers == [f"local0/gpu{gpu}"] and first.stats.devices == [gpu]
            assert first.stats.capacity_bytes == 4 * segment and first.stats.used_blocks == 6
            started = time.monotonic()
            verdict = cluster.client.evaluate(softmax_problem, softmax_candidate, stage="validate")
            returned = time.monotonic()
            assert verdict.correct and verdict.device.startswith("cuda"), verdict
            wait_for(lambda: len(owner.applied) >= 2, 30, "the GPU pool to grow back")
            (shrunk_at, _, after_shrink), (grown_at, _, after_grow) = owner.applied[:2]
            assert (after_shrink, after_grow) == (3 * segment, 4 * segment)
            assert started < shrunk_at < returned < grown_at
            # The blocks kept through the shrink come back from the GPU pool intact.
            owner.stop_serving()
            hashes = [f"block{i}".encode() for i in range(6)]
            kept = owner.pool.lookup(hashes)
            assert kept == 6, "the shrink dropped an empty segment, moving or evicting nothing"
            owner.pool.load(hashes, range(8, 14)).wait()
            for layer in owner.tensors:
                assert torch.equal(layer[8:14], layer[0:6])
        finally:
            owner.close()


@pytest.mark.vllm
def test_a_vllm_engines_pool_is_steered_through_its_control_endpoint(
        softmax_problem: str, softmax_candidate: str) -> None:
    """vLLM's scheduler-side half of SpecgenOffloadingSpec, configured as an engine would be with the
    cluster's endpoint and stepped as the engine's scheduling loop steps it (on_schedule_end)."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    from specgen.kv.vllm_offload import PoolSettings, SpecgenOffloadingManager
    from specgen.runtime.local import LocalCluster

    block_bytes, slots = 8192, 4
    segment = block_bytes * slots
    settings = quick_eval_settings(kv_reserve_bytes=1, kv_regrow_idle_s=0.5)
    with LocalCluster(workers=1, settings=settings, kv_control=True) as cluster:
        manager = SpecgenOffloadingManager(PoolSettings.from_extra_config({
            "pool_device": "cpu", "pool_bytes": 4 * segment, "segment_bytes": segment,
            "control_endpoint": cluster.kv_control_endpoint, "stats_interval_s": 0.1,
        }), block_bytes, slots, "vllm-engine-0")
        sizes = [manager.stats().capacity_bytes]
        stop = threading.Event()

        def engine_steps() -> None:
            while not stop.wait(0.01):
                manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
                size = manager.stats().capacity_bytes
                if size != sizes[-1]:
                    sizes.append(size)

        stepper = threading.Thread(target=engine_steps, name="engine-steps", daemon=True)
        stepper.start()
        try:
            def view():
                return next((v for v in cluster.client.stats().kv_pools if v.pool == "vllm-engine-0"), None)

            first = wait_for(view, 30, "the engine pool's stats to reach the scheduler")
            assert first.paired_workers == ["local0/cpu0"] and first.stats.devices == [-1]
            assert first.stats.capacity_bytes == 4 * segment
            assert cluster.client.evaluate(softmax_problem, softmax_candidate, stage="validate").correct
            wait_for(lambda: len(sizes) >= 3, 30, "the engine's pool to shrink and grow back")
            assert sizes == [4 * segment, 3 * segment, 4 * segment]
            done = wait_for(lambda: (v := view()) and v.grows_requested == 1 and v, 10, "the grow-back in stats")
            assert done.shrinks_requested == 1 and done.restore_bytes is None
        finally:
            stop.set()
            stepper.join(5)
            manager.shutdown()


def test_assigned_profiling_work_gets_the_pools_memory_back_and_idleness_lends_it_again(tmp_path) -> None:
    """The give-back a profiling assignment triggers, end to end in one process: the steward's shrink
    applied by the pool's agent has freed the memory when apply returns; once the device idles, the
    grow-back takes it again, never beyond the pool's configured size."""
    import torch

    from specgen.kv.layout import KvLayout
    from specgen.kv.pool import RemoteKvPool
    from specgen.kv.pool_control import PoolControlAgent

    tensors = [torch.zeros(8, 4096, dtype=torch.int8) for _ in range(2)]
    layout = KvLayout.from_tensors(tensors, 8)
    segment = 4 * layout.slot_bytes
    pool = RemoteKvPool(layout, devices=[-1], segment_bytes=segment, max_bytes=4 * segment, pool_id="p")
    pool.grow()
    pool.store(list(range(1, 9)), range(8)).wait()
    agent = PoolControlAgent(pool, f"ipc://{tmp_path}/unbound.sock")   # apply() needs no peer
    try:
        s = steward(reserve=2 * segment, regrow=0.0)
        s.on_stats(POOL, pool.stats(), now=0.0)
        cpu_worker = WorkerPlacement(name="h/cpu0", host=pool.stats().host, device=-1, busy=True)
        [(_, shrink)] = s.steer([cpu_worker], now=1.0)
        assert agent.apply(shrink) == 2 * segment and pool.capacity_bytes == 2 * segment
        s.on_stats(POOL, pool.stats(), now=1.1)
        idle = WorkerPlacement(name="h/cpu0", host=pool.stats().host, device=-1, busy=False)
        [(_, grow)] = s.steer([idle], now=2.0)
        assert agent.apply(grow) == 4 * segment
        # Asked for more than it is configured to hold, it stays at its size (max_bytes; on a GPU
        # also headroom_bytes free).
        assert agent.apply(KvPoolResize(target_bytes=100 * segment)) == 4 * segment
    finally:
        agent.close()
        pool.close()
