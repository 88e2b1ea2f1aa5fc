"""Prometheus metrics: HTTP traffic from middleware; jobs and queue depth read at scrape time.

Job counts and durations come from the store when /metrics is scraped, so every API replica
reports the same truth and nothing is lost when a process restarts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.queueing import JobQueue
from core.store import Store
from core.tables import Job, JobStatus


class StoreCollector(Collector):
    """Jobs by kind and status, finished-job durations, and the queue depth."""

    def __init__(self, store: Store, queue: JobQueue) -> None:
        self.store = store
        self.queue = queue

    def collect(self) -> Iterable[Metric]:
        jobs = GaugeMetricFamily(
            "prunecast_jobs", "Jobs in the store by kind and status", labels=["kind", "status"]
        )
        durations = SummaryMetricFamily(
            "prunecast_job_duration_seconds", "Run time of finished jobs", labels=["kind", "status"]
        )
        with self.store.session() as session:
            for kind, status, count in session.execute(
                select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)
            ):
                jobs.add_metric([kind, JobStatus(status).value], count)
            finished = session.execute(
                select(Job.kind, Job.status, Job.started_at, Job.finished_at).where(
                    Job.status.in_([JobStatus.succeeded, JobStatus.failed]),
                    Job.started_at.is_not(None),
                    Job.finished_at.is_not(None),
                )
            ).all()
        totals: dict[tuple[str, JobStatus], tuple[int, float]] = {}
        for kind, status, started, ended in finished:
            if started is None or ended is None:
                continue
            count, total = totals.get((kind, status), (0, 0.0))
            totals[(kind, status)] = (count + 1, total + (ended - started).total_seconds())
        for (kind, status), (count, total) in sorted(totals.items()):
            durations.add_metric([kind, status.value], count_value=count, sum_value=total)
        yield jobs
        yield durations
        depth = GaugeMetricFamily("prunecast_queue_depth", "Jobs waiting in the transport queue")
        try:
            depth.add_metric([], self.queue.depth())
        except Exception:
            depth.add_metric([], float("nan"))
        yield depth


class HttpMetrics:
    """Counts requests and times them, labelled by route template (not raw path)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "prunecast_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            "prunecast_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.metrics.requests.labels(method, template, str(status)).inc()
            self.metrics.latency.labels(method, template).observe(time.perf_counter() - start)
