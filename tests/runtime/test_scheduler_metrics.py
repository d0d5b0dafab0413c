"""The scheduler's Prometheus metrics: the collector over a SchedulerStats snapshot, and a real
scheduler process serving them over HTTP with the same numbers `specgen status` shows."""
from __future__ import annotations

import time
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specgen.messages import KvPoolStats, KvPoolView, PoolStat, SchedulerStats, WorkerStat
from specgen.runtime.local import LocalCluster
from specgen.runtime.scheduler_metrics import SchedulerMetrics

from tests.runtime.conftest import quick_eval_settings


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_figure_comes_from_the_snapshot() -> None:
    stats = SchedulerStats(
        scheduler_id="s", uptime_s=12.0, pool_mode="elastic", priority_rule=["deadline"],
        validate=PoolStat(workers=2, queued=5, running=2, utilization=0.75),
        profile=PoolStat(workers=1, queued=0, running=1, utilization=0.5),
        workers=[WorkerStat(name="a", pool="validate", busy_stage="validate"),
                 WorkerStat(name="b", pool="validate"),
                 WorkerStat(name="c", pool="profile", busy_stage="profile")],
        jobs_by_state={"running": 3, "succeeded": 2}, requests_done=40, results_refused=1,
        busy_while_waiting=0.9,
        kv_pools=[KvPoolView(pool="kv0", stats=KvPoolStats(capacity_bytes=1 << 30, used_bytes=1 << 20,
                                                            hits=7, misses=3, hit_rate=0.7, evictions=2))])
    metrics = SchedulerMetrics()
    assert generate_latest(metrics.registry).count(b"specgen_pool_") == 0   # nothing before a snapshot
    metrics.update(stats, now=0.0)
    for seconds in (0.3, 4.0, 4.5):
        metrics.observe_feedback(seconds)
    got = samples(generate_latest(metrics.registry).decode())
    assert got[("specgen_pool_queue_depth", (("pool", "validate"),))] == 5
    assert got[("specgen_pool_workers", (("pool", "profile"),))] == 1
    assert got[("specgen_pool_busy_fraction", (("pool", "validate"),))] == 0.75
    assert got[("specgen_workers_busy", (("pool", "validate"),))] == 1
    assert got[("specgen_jobs", (("state", "succeeded"),))] == 2
    assert got[("specgen_requests_total", (("outcome", "done"),))] == 40
    assert got[("specgen_requests_total", (("outcome", "refused"),))] == 1
    assert got[("specgen_busy_while_waiting_fraction", ())] == 0.9
    assert got[("specgen_kv_pool_used_bytes", (("kv_pool", "kv0"),))] == 1 << 20
    assert got[("specgen_kv_pool_hits_total", (("kv_pool", "kv0"),))] == 7
    assert got[("specgen_feedback_latency_seconds_count", ())] == 3
    assert got[("specgen_feedback_latency_seconds_bucket", (("le", "5.0"),))] == 3
    assert got[("specgen_feedback_latency_seconds_bucket", (("le", "2.0"),))] == 1
    assert not metrics.due(0.5) and metrics.due(1.0)


def test_a_running_scheduler_serves_what_status_shows(softmax_problem: str, softmax_candidate: str) -> None:
    with LocalCluster(workers=1, settings=quick_eval_settings(), metrics_port=0) as cluster:
        verdict = cluster.client.evaluate(softmax_problem, softmax_candidate, "full")
        assert verdict.correct
        url = cluster.metrics_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        stats = cluster.client.stats()
        got: dict = {}
        for _ in range(50):   # the snapshot is refreshed about once a second
            got = samples(urllib.request.urlopen(url, timeout=5).read().decode())
            if got.get(("specgen_requests_total", (("outcome", "done"),))) == stats.requests_done:
                break
            time.sleep(0.1)
        assert got[("specgen_requests_total", (("outcome", "done"),))] == stats.requests_done >= 1
        workers = sum(got[("specgen_pool_workers", (("pool", p),))] for p in ("validate", "profile"))
        assert workers == len(stats.workers) == 1
        # feedback latency is a job's figure (extraction -> profiling verdict); none outside jobs
        assert stats.feedback_latency_p50_s is None
        assert got[("specgen_feedback_latency_seconds_count", ())] == 0
        assert got[("specgen_nodes", ())] == 1
