"""Task entry points. Each takes an id, re-fetches its row, and delegates."""

from __future__ import annotations

import uuid

from jobs.queue import (
    BUILD_ENGINE,
    DELIVER_WEBHOOK,
    POLL_WEBHOOKS,
    REAP_ORPHANS,
    RUN_JOB,
    SWEEP_STORAGE,
    VALIDATE_DATASET,
    VALIDATE_MODEL,
)
from worker.app import app
from worker.engine_task import build_for_job
from worker.job_signals import job_signals
from worker.reaper import reap
from worker.runner import run_job, worker_id
from worker.sweep import sweep
from worker.validation import validate_dataset, validate_model
from worker.webhooks import deliver, poll


@app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: str) -> None:
    with job_signals(app, uuid.UUID(job_id), worker_id()):
        run_job(uuid.UUID(job_id))


@app.task(name=BUILD_ENGINE, bind=True, acks_late=True, reject_on_worker_lost=True)
def build_engine_task(self, job_id: str, request: str, directory: str) -> None:
    build_for_job(uuid.UUID(job_id), uuid.UUID(request), directory, node=self.request.hostname)


@app.task(name=VALIDATE_MODEL, acks_late=True, reject_on_worker_lost=True, time_limit=600, soft_time_limit=540)
def validate_model_task(model_id: str) -> None:
    validate_model(uuid.UUID(model_id))


@app.task(name=VALIDATE_DATASET, acks_late=True, reject_on_worker_lost=True, time_limit=3600, soft_time_limit=3540)
def validate_dataset_task(dataset_id: str) -> None:
    validate_dataset(uuid.UUID(dataset_id))


@app.task(name=REAP_ORPHANS, ignore_result=True, soft_time_limit=100, time_limit=120)
def reap_orphans_task() -> None:
    reap(app)


@app.task(name=SWEEP_STORAGE, ignore_result=True, soft_time_limit=3000, time_limit=3300)
def sweep_storage_task() -> None:
    sweep()


@app.task(name=POLL_WEBHOOKS, ignore_result=True, soft_time_limit=50, time_limit=60)
def poll_webhooks_task() -> None:
    poll(app)


@app.task(name=DELIVER_WEBHOOK, acks_late=True, ignore_result=True, soft_time_limit=60, time_limit=75)
def deliver_webhook_task(delivery_id: str, claim: str) -> None:
    deliver(uuid.UUID(delivery_id), uuid.UUID(claim))
