"""Task entry points. Each takes an id, re-fetches its row, and delegates."""

from __future__ import annotations

import uuid

from jobs.queue import REAP_ORPHANS, RUN_JOB, VALIDATE_MODEL
from worker.app import app
from worker.reaper import reap
from worker.runner import run_job
from worker.validation import validate_model


@app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: str) -> None:
    run_job(uuid.UUID(job_id))


@app.task(name=VALIDATE_MODEL, acks_late=True, reject_on_worker_lost=True, time_limit=600, soft_time_limit=540)
def validate_model_task(model_id: str) -> None:
    validate_model(uuid.UUID(model_id))


@app.task(name=REAP_ORPHANS, ignore_result=True, soft_time_limit=100, time_limit=120)
def reap_orphans_task() -> None:
    reap(app)
