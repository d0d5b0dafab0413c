"""The scheduler's Prometheus metrics (`specgen serve --metrics-port PORT`).

Every figure comes from the same `SchedulerStats` that `specgen status` prints, so the two never
disagree: the scheduler's loop hands a fresh snapshot to `SchedulerMetrics.update` about once a
second (the loop is single-threaded; the HTTP server's thread only ever reads the latest
snapshot, an atomic reference swap). The one exception is the feedback-latency histogram, which
needs every observation rather than a snapshot's percentiles: the scheduler core calls `observe`
as each profiling verdict lands.

Each scheduler gets its own registry (several run in one test process), served on its own port.
"""
from __future__ import annotations

import threading
from typing import Iterable, get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specgen.messages import Pool, SchedulerStats

POOLS: tuple[Pool, ...] = get_args(Pool)
# Seconds from a candidate's extraction to its profiling verdict: compiles and profiles run from
# about a second (CPU, cached builds) to minutes (nvcc builds queued behind others).
FEEDBACK_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, float("inf"))


class _StatsCollector(Collector):
    """Turns the latest SchedulerStats snapshot into metric families at each scrape."""

    def __init__(self) -> None:
        self.stats: SchedulerStats | None = None

    def collect(self) -> Iterable[Metric]:
        stats = self.stats
        if stats is None:
            return
        yield _gauge("specgen_uptime_seconds", "Seconds since the scheduler started.", stats.uptime_s)
        per_pool = {
            "specgen_pool_queue_depth": ("Requests waiting in the pool's queue.", "queued"),
            "specgen_pool_running": ("Requests of the pool running now.", "running"),
            "specgen_pool_workers": ("Workers assigned to the pool (its role) now.", "workers"),
            "specgen_pool_busy_fraction": ("Busy share of the pool's worker-time since start.",
                                           "utilization"),
            "specgen_pool_arrival_rate": ("Requests per second arriving at the pool.", "arrival_rate"),
            "specgen_pool_service_seconds": ("Smoothed service time of one request.", "service_s"),
            "specgen_pool_offered_load": ("Workers the pool needs: arrival rate x service time "
                                          "plus backlog.", "offered_load"),
        }
        for name, (doc, attr) in per_pool.items():
            family = GaugeMetricFamily(name, doc, labels=["pool"])
            for pool in POOLS:
                family.add_metric([pool], float(getattr(getattr(stats, pool), attr)))
            yield family
        busy = GaugeMetricFamily("specgen_workers_busy", "Workers running a request now.",
                                 labels=["pool"])
        for pool in POOLS:
            busy.add_metric([pool], float(sum(1 for w in stats.workers
                                              if w.pool == pool and w.busy_stage)))
        yield busy
        if stats.busy_while_waiting is not None:
            yield _gauge("specgen_busy_while_waiting_fraction",
                         "Busy worker share over the time requests waited.", stats.busy_while_waiting)
        yield _gauge("specgen_nodes", "Nodes registered.", len(stats.nodes))
        states = GaugeMetricFamily("specgen_jobs", "Jobs the scheduler holds, by state "
                                   "(running, or how a finished job ended).", labels=["state"])
        for state, count in sorted(stats.jobs_by_state.items()):
            states.add_metric([state], float(count))
        yield states
        requests = CounterMetricFamily("specgen_requests", "Stage requests by outcome.",
                                       labels=["outcome"])
        for outcome, value in (("done", stats.requests_done), ("requeued", stats.requests_requeued),
                               ("dropped", stats.requests_dropped),
                               ("duplicate", stats.duplicates_ignored),
                               ("refused", stats.results_refused)):
            requests.add_metric([outcome], float(value))
        yield requests
        yield CounterMetricFamily("specgen_registrations_refused",
                                  "Registrations without a valid credential.",
                                  value=float(stats.hellos_refused))
        yield CounterMetricFamily("specgen_pool_reassignments", "Workers moved between pools.",
                                  value=float(stats.reassignments))
        yield from _kv_families(stats)


def _kv_families(stats: SchedulerStats) -> Iterable[Metric]:
    gauges = {"specgen_kv_pool_capacity_bytes": ("KV pool memory held.", "capacity_bytes"),
              "specgen_kv_pool_used_bytes": ("KV pool memory holding blocks.", "used_bytes"),
              "specgen_kv_pool_hit_rate": ("Looked-up blocks found, of all looked up.", "hit_rate")}
    counters = {"specgen_kv_pool_hits": ("Looked-up blocks found.", "hits"),
                "specgen_kv_pool_misses": ("Looked-up blocks not found.", "misses"),
                "specgen_kv_pool_loads": ("Blocks loaded back.", "loads"),
                "specgen_kv_pool_stores": ("Blocks stored.", "stores"),
                "specgen_kv_pool_evictions": ("Blocks dropped to make room or to shrink.",
                                              "evictions")}
    for kind, table in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
        for name, (doc, attr) in table.items():
            family = kind(name, doc, labels=["kv_pool"])
            for view in stats.kv_pools:
                family.add_metric([view.pool], float(getattr(view.stats, attr)))
            yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class SchedulerMetrics:
    """One scheduler's metrics registry, optionally served over HTTP."""

    refresh_s = 1.0           # how often the scheduler's loop hands over a new snapshot

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = _StatsCollector()
        self.registry.register(self._collector)
        self.feedback = Histogram("specgen_feedback_latency_seconds",
                                  "Candidate extracted -> its profiling verdict.",
                                  buckets=FEEDBACK_BUCKETS, registry=self.registry)
        self.updated_at = float("-inf")
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def due(self, now: float) -> bool:
        return now - self.updated_at >= self.refresh_s

    def update(self, stats: SchedulerStats, now: float) -> None:
        self._collector.stats = stats          # one reference swap: a scrape sees one snapshot
        self.updated_at = now

    def observe_feedback(self, seconds: float) -> None:
        self.feedback.observe(seconds)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on addr:port (0: any free port); returns the port."""
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_port
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
