"""A store's metrics in the Prometheus text format, through ``prometheus-client``.

:class:`StoreCollector` reads the store at each scrape: the counters every process on the
directory adds to (``JobStore.counters()``: they outlive every process, so a scrape after a
restart of the web process or of the workers starts where the last one ended), the jobs in each
state per queue (``statistics()``), paused queues, the oldest pending job, live workers. The
web app serves it at ``/metrics``; ``fsjobstore worker --metrics-port N`` serves the same from a
worker. Every endpoint shows the whole directory: scrape one of them, not each.
"""

from __future__ import annotations

from collections.abc import Iterator

try:
    from prometheus_client import CollectorRegistry, generate_latest
except ImportError as exc:  # the core does not need it: it comes with the extra
    raise ImportError(f"fsjobstore.web needs the web extra: pip install 'fsjobstore[web]' ({exc.name} is missing)",
                      name=exc.name) from exc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import JobStore, QueueCounters, StoreCounters

_COUNTERS = (
    ("created", "fsjobstore_jobs_created", "Jobs created (create, periodic ticks)."),
    ("fulfilled", "fsjobstore_jobs_completed", "Jobs fulfilled (by a worker, or by id)."),
    ("failed", "fsjobstore_jobs_failed", "Jobs failed for good (their last attempt failed or timed out)."),
    ("retried", "fsjobstore_jobs_retried", "Attempts that failed or timed out and run again."),
    ("cancelled", "fsjobstore_jobs_cancelled", "Jobs cancelled (waiting, or stopped while running)."),
    ("timed_out", "fsjobstore_attempts_timed_out", "Attempts that ran past their time limit."),
    ("lost", "fsjobstore_attempts_lost", "Attempts whose lease was taken over: nothing committed."),
    ("given_back", "fsjobstore_jobs_given_back", "Jobs released when a worker stopped (no attempt counted)."),
)


class StoreCollector(Collector):
    """Collects one store's metrics at each scrape (register it in a ``CollectorRegistry``)."""

    def __init__(self, store: JobStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        store = self._store
        stats = store.statistics()
        counters = store.counters()
        workers = store.workers()
        jobs = GaugeMetricFamily("fsjobstore_jobs", "Jobs in each state, per queue.", labels=["queue", "state"])
        for queue, row in sorted(stats.by_queue.items()):
            for state, n in row.items():
                jobs.add_metric([queue, state], n)
        yield jobs
        paused = GaugeMetricFamily("fsjobstore_queue_paused", "1 while a queue is paused.", labels=["queue"])
        for queue in sorted(set(stats.by_queue) | stats.paused):
            paused.add_metric([queue], 1.0 if queue in stats.paused else 0.0)
        yield paused
        oldest = GaugeMetricFamily("fsjobstore_oldest_pending_age_seconds",
                                   "Age of the oldest pending job, per queue (queues with pending jobs).",
                                   labels=["queue"])
        for queue, age in sorted(stats.oldest_pending_by_queue.items()):
            oldest.add_metric([queue], age)
        yield oldest
        yield GaugeMetricFamily("fsjobstore_notifications_waiting", "Final jobs with targets still to hear.",
                                value=stats.notifications)
        yield GaugeMetricFamily("fsjobstore_quarantined_files", "Files moved aside as unreadable.",
                                value=stats.quarantined)
        yield GaugeMetricFamily("fsjobstore_workers", "Live workers on the directory.", value=len(workers))
        yield GaugeMetricFamily("fsjobstore_worker_slots_busy", "Jobs the live workers are running.",
                                value=sum(len(w.current) for w in workers))
        yield from _counter_families(counters)


def _counter_families(counters: StoreCounters) -> Iterator[Metric]:
    queues = sorted(counters.queues.items())
    for field, name, doc in _COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["queue"])
        for queue, c in queues:
            family.add_metric([queue], getattr(c, field))
        yield family
    hist = HistogramMetricFamily("fsjobstore_job_duration_seconds", "How long attempts ran, per queue.",
                                 labels=["queue"])
    for queue, c in queues:
        running = 0
        buckets = []
        for bound, n in zip((*QueueCounters.bounds, float("inf")), c.durations, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        hist.add_metric([queue], buckets, c.duration_sum)
    yield hist


def registry_for(store: JobStore) -> CollectorRegistry:
    """A registry holding only this store's collector (not the process's default metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text format of every metric in ``registry``."""
    return generate_latest(registry)
