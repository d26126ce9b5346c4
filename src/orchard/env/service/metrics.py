"""Prometheus metrics of one service instance (its own registry, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """Counters and gauges the service updates; render() gives the text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sandboxes_created = Counter("orchard_sandboxes_created", "Sandboxes created", ["status"], registry=r)
        self.sandboxes_deleted = Counter("orchard_sandboxes_deleted", "Sandboxes deleted", ["reason"], registry=r)
        self.sandboxes_live = Gauge("orchard_sandboxes_live", "Sandboxes with a record", registry=r)
        self.create_seconds = Histogram("orchard_sandbox_create_seconds", "Create to ready", registry=r,
                                        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.jobs = Counter("orchard_jobs", "Jobs finished", ["status"], registry=r)
        self.jobs_running = Gauge("orchard_jobs_running", "Jobs running now", registry=r)
        self.jobs_queued = Gauge("orchard_jobs_queued", "Jobs waiting for a slot", registry=r)
        self.exec_seconds = Histogram("orchard_exec_seconds", "Exec duration", registry=r,
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300))
        self.loop_lag = Histogram("orchard_event_loop_lag_seconds", "How late a 50 ms timer fires", registry=r,
                                  buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
        self.rejected = Counter("orchard_rejected", "Requests refused with 503", ["reason"], registry=r)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
