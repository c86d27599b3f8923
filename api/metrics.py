"""`GET /metrics`: Prometheus text exposition of the service's state.

    quant_jobs{status}                      jobs by status, all projects (DB, at scrape time)
    quant_stage_duration_seconds{stage}     histogram of completed stage runs (DB, fed by the workers)
    quant_queue_depth{queue}                messages waiting in each Celery queue (Redis LLEN)
    quant_webhook_deliveries{status}        webhook deliveries by outcome: pending|succeeded|failed (DB)
    quant_upload_bytes_total                upload bytes written to disk by the API processes
    quant_database_up, quant_broker_up      1 when the scrape could read them

Where each number comes from, and why:
- Job, stage and webhook figures are read from the database, the source of truth every worker on
  every host writes to, so any API process answers the same numbers and nothing resets when a
  worker restarts. Stage durations are cumulative bucket rows (`jobs.timings`), so a scrape reads a
  fixed ~100 rows however many jobs ran, rather than scanning `job_events`. Prometheus multiprocess
  mode was rejected for them: it needs every worker to share one directory on one host, which GPU
  workers on other nodes do not.
- Queue depth asks the broker (`queue_declare(passive)`: LLEN of the queue's Redis lists). With the
  embedded filesystem broker the series is absent, not zero.
- Upload bytes are counted where they happen, in the API process. With several uvicorn workers,
  set `PROMETHEUS_MULTIPROC_DIR` to an empty directory (the launcher does): every process writes its
  counter there and whichever process serves the scrape sums them. Without it the counter is
  per process.
- DB-derived values are cached `metrics_cache_seconds` (5 s) per process, so scrapers cannot turn
  into database load. A failed read reports `quant_database_up 0` / `quant_broker_up 0` instead of
  failing the scrape.

Open by default (it shows counts, never a project's data); with `QUANT_METRICS_TOKEN` set it wants
`Authorization: Bearer <token>`. It is outside `/api/v1` and the OpenAPI document.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated

from celery import Celery
from fastapi import APIRouter, Header, Request, Response
from kombu.exceptions import ChannelError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from api.deps import SettingsDep
from api.problems import Problem
from jobs import stats, timings
from jobs.config import Settings
from jobs.db import session_scope
from jobs.queue import DEFAULT_QUEUE, GPU_QUEUE

log = logging.getLogger(__name__)
router = APIRouter()

UPLOAD_BYTES = Counter(
    "quant_upload_bytes", "Bytes of model and dataset uploads written to disk by the API.", registry=None
)


@dataclass
class _Snapshot:
    taken: float = -math.inf
    jobs: dict[str, int] | None = None
    deliveries: dict[str, int] = field(default_factory=dict)
    stages: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)
    queues: dict[str, int] | None = None


class ServiceCollector(Collector):
    """Reads the database and the broker when scraped (at most once per `metrics_cache_seconds`)."""

    def __init__(self, settings: Settings, celery: Celery) -> None:
        self.settings = settings
        self.celery = celery
        self.lock = threading.Lock()
        self.snapshot = _Snapshot()

    def _read(self) -> _Snapshot:
        snapshot = _Snapshot(taken=time.monotonic())
        try:
            with session_scope(self.settings.resolved_database_url) as session:
                snapshot.jobs = stats.jobs_by_status(session=session)
                snapshot.deliveries = stats.deliveries_by_status(session=session)
                snapshot.stages = timings.histograms(session=session)
        except Exception:
            log.warning("metrics: database unreadable", exc_info=True)
            snapshot.jobs = None
        if not self.celery.conf.broker_url.startswith("filesystem"):
            try:
                snapshot.queues = self._queue_depths()
            except Exception:
                log.warning("metrics: broker unreadable", exc_info=True)
                snapshot.queues = None
        return snapshot

    def _queue_depths(self) -> dict[str, int]:
        depths = {}
        with self.celery.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
            channel = connection.default_channel
            for queue in (GPU_QUEUE, DEFAULT_QUEUE):
                try:
                    depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
                except ChannelError:  # Redis deletes an empty list, so an empty queue "does not exist"
                    depths[queue] = 0
        return depths

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            if time.monotonic() - self.snapshot.taken >= self.settings.metrics_cache_seconds:
                self.snapshot = self._read()
            snapshot = self.snapshot
        database_up = {(): snapshot.jobs is not None}
        yield _gauge("quant_database_up", "1 when the last read of the database succeeded.", database_up)
        if snapshot.jobs is not None:
            jobs = {(status,): count for status, count in snapshot.jobs.items()}
            yield _gauge("quant_jobs", "Jobs by status, all projects.", jobs, "status")
            yield _gauge(
                "quant_webhook_deliveries",
                "Webhook deliveries by outcome (pending, succeeded, failed), all projects.",
                {(s,): n for s, n in snapshot.deliveries.items()},
                "status",
            )
            histogram = HistogramMetricFamily(
                "quant_stage_duration_seconds", "Duration of completed job stages.", labels=["stage"], unit="seconds"
            )
            for stage, rows in sorted(snapshot.stages.items()):
                buckets = [("+Inf" if math.isinf(le) else repr(le), count) for le, count, _sum in rows]
                histogram.add_metric([stage], buckets, sum_value=rows[-1][2])
            yield histogram
        if not self.celery.conf.broker_url.startswith("filesystem"):
            broker_up = {(): snapshot.queues is not None}
            yield _gauge("quant_broker_up", "1 when the last read of the broker succeeded.", broker_up)
            if snapshot.queues is not None:
                yield _gauge(
                    "quant_queue_depth",
                    "Messages waiting in a Celery queue (not yet taken by a worker).",
                    {(q,): n for q, n in snapshot.queues.items()},
                    "queue",
                )


def _gauge(name: str, documentation: str, values: dict[tuple[str, ...], float], *labels: str) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, documentation, labels=list(labels))
    for label_values, value in values.items():
        gauge.add_metric(list(label_values), float(value))
    return gauge


def make_registry(settings: Settings, celery: Celery) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # the counters of every API process on this host, summed
    else:
        registry.register(UPLOAD_BYTES)
    registry.register(ServiceCollector(settings, celery))
    return registry


@router.get("/metrics", include_in_schema=False)
async def metrics(
    request: Request, settings: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> Response:
    if settings.metrics_token:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), settings.metrics_token.encode()):
            raise Problem(
                401, "metrics need Authorization: Bearer <QUANT_METRICS_TOKEN>", headers={"WWW-Authenticate": "Bearer"}
            )
    body = await run_in_threadpool(generate_latest, request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
