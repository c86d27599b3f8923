"""Celery wiring shared by the API (which enqueues) and the worker (which consumes).

Queues are explicit: `gpu` runs quantization jobs (one message at a time per worker process; CPU
workers consume it too, since every stage but the engine runs on ONNX Runtime's CPU EP), `engine`
runs TensorRT engine builds handed off by a job whose worker has no GPU with TensorRT (consumed only
by GPU workers, one per GPU), `default` runs model validation, the reaper and webhook delivery. Job
state lives in SQL, never in a result backend.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from urllib.parse import urlparse

import redis
from celery import Celery
from kombu import Queue

from jobs.config import Settings

RUN_JOB = "worker.run_job"
VALIDATE_MODEL = "worker.validate_model"
VALIDATE_DATASET = "worker.validate_dataset"
REAP_ORPHANS = "worker.reap_orphans"
SWEEP_STORAGE = "worker.sweep_storage"
POLL_WEBHOOKS = "worker.poll_webhooks"
DELIVER_WEBHOOK = "worker.deliver_webhook"
BUILD_ENGINE = "worker.build_engine"

GPU_QUEUE = "gpu"
DEFAULT_QUEUE = "default"
ENGINE_QUEUE = "engine"


def resolve_broker_url(settings: Settings) -> str:
    """BROKER_URL when set; else a local Redis that answers; else the embedded filesystem broker."""
    if settings.broker_url:
        return settings.broker_url
    parsed = urlparse(settings.local_redis_url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=0.5):
            return settings.local_redis_url
    except OSError:
        return "filesystem://"


def make_celery(settings: Settings, broker_url: str | None = None) -> Celery:
    url = broker_url or resolve_broker_url(settings)
    app = Celery("quantservice", broker=url, set_as_current=False)
    transport_options: dict[str, object] = {"visibility_timeout": settings.visibility_timeout}
    if url.startswith("filesystem"):
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # the exchange tables of remote control (worker pings, shutdown broadcasts): kombu's default is
            # ./control, a folder in whatever directory the process was started from
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    app.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_queues=(Queue(DEFAULT_QUEUE), Queue(GPU_QUEUE), Queue(ENGINE_QUEUE)),
        task_default_queue=DEFAULT_QUEUE,
        task_create_missing_queues=False,
        task_routes={
            RUN_JOB: {"queue": GPU_QUEUE},
            VALIDATE_MODEL: {"queue": DEFAULT_QUEUE},
            VALIDATE_DATASET: {"queue": DEFAULT_QUEUE},
            POLL_WEBHOOKS: {"queue": DEFAULT_QUEUE},
            SWEEP_STORAGE: {"queue": DEFAULT_QUEUE},
            DELIVER_WEBHOOK: {"queue": DEFAULT_QUEUE},
            BUILD_ENGINE: {"queue": ENGINE_QUEUE},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_soft_time_limit=settings.job_soft_time_limit,
        task_time_limit=settings.job_time_limit,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_serializer="json",
        accept_content=["json"],
        beat_schedule={
            "reap-orphans": {"task": REAP_ORPHANS, "schedule": settings.reaper_interval},
            "sweep-storage": {"task": SWEEP_STORAGE, "schedule": settings.storage_sweep_interval},
            # Sends deliveries whose next_attempt_at has come. A poll not started within a few
            # intervals is dropped (`expires`): the next one does the same work.
            "poll-webhooks": {
                "task": POLL_WEBHOOKS,
                "schedule": settings.webhook_poll_interval,
                "options": {"expires": max(4 * settings.webhook_poll_interval, 2.0)},
            },
        },
    )
    return app


def enqueue_job(app: Celery, job_id: uuid.UUID) -> None:
    """Call only after the job row is committed: the worker re-fetches it by id."""
    app.send_task(RUN_JOB, args=[str(job_id)], queue=GPU_QUEUE)


def enqueue_engine_build(app: Celery, job_id: uuid.UUID, request: uuid.UUID, directory: str, expires: float) -> None:
    """Hand a job's engine build to the `engine` queue (after `jobs.workers.request_engine` committed).
    `directory` holds the hand-off files, relative to the storage root. A worker receiving the message
    after `expires` seconds discards it unrun: its job stopped waiting by then."""
    app.send_task(BUILD_ENGINE, args=[str(job_id), str(request), directory], queue=ENGINE_QUEUE, expires=expires)


def pending_job_ids(app: Celery) -> set[uuid.UUID] | None:
    """Ids of the jobs that have a run message in the broker: waiting in the `gpu` queue (at any
    priority) or delivered to a worker and not yet acknowledged (a job running under acks_late, or
    prefetched). None when the broker is not Redis and cannot be inspected. See `_pending_ids`."""
    return _pending_ids(app, GPU_QUEUE, {RUN_JOB})


def pending_validation_ids(app: Celery) -> set[uuid.UUID] | None:
    """Ids of the models and datasets whose validation message is in the broker: waiting in the
    `default` queue or delivered and not yet acknowledged (a check running under acks_late). None
    when the broker cannot be inspected. See `_pending_ids`."""
    return _pending_ids(app, DEFAULT_QUEUE, {VALIDATE_MODEL, VALIDATE_DATASET})


def _pending_ids(app: Celery, queue: str, tasks: set[str]) -> set[uuid.UUID] | None:
    """The first argument (an id) of every message for one of `tasks` waiting in `queue` or unacked.

    Reads kombu's Redis layout: one list per queue and priority (`queue`, then `queue` + separator + 3, 6, 9)
    and the `unacked` hash of delivered messages. The list is read before the hash, so a message moving from
    one to the other meanwhile is still seen; one in a worker's hands between the two writes is not,
    and may be sent twice, which the callers' compare-and-set on the row makes harmless.
    """
    url = str(app.conf.broker_url)
    if not url.startswith(("redis://", "rediss://")):
        return None
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        messages = []
        for priority in (0, 3, 6, 9):
            key = queue if priority == 0 else f"{queue}\x06\x16{priority}"  # kombu's priority separator
            messages += [json.loads(raw) for raw in client.lrange(key, 0, -1)]
        messages += [json.loads(raw)[0] for raw in client.hvals("unacked")]
    finally:
        client.close()
    ids = set()
    for message in messages:
        if message.get("headers", {}).get("task") not in tasks:
            continue
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]  # Celery protocol 2: [args, kwargs, embed]
        ids.add(uuid.UUID(args[0]))
    return ids


def enqueue_validation(app: Celery, model_id: uuid.UUID) -> None:
    app.send_task(VALIDATE_MODEL, args=[str(model_id)], queue=DEFAULT_QUEUE)


def enqueue_dataset_validation(app: Celery, dataset_id: uuid.UUID) -> None:
    app.send_task(VALIDATE_DATASET, args=[str(dataset_id)], queue=DEFAULT_QUEUE)


def enqueue_webhook_poll(app: Celery) -> None:
    """Look for due deliveries now rather than at the next beat (call after committing them)."""
    app.send_task(POLL_WEBHOOKS, queue=DEFAULT_QUEUE, expires=60)


def enqueue_delivery(app: Celery, delivery_id: uuid.UUID, claim: uuid.UUID) -> None:
    app.send_task(DELIVER_WEBHOOK, args=[str(delivery_id), str(claim)], queue=DEFAULT_QUEUE)
