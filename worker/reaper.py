"""Find jobs whose worker died and put them back in the queue, or fail them with a reason.

A running job's worker refreshes `heartbeat_at` every `heartbeat_interval`; a job whose heartbeat
is older than `heartbeat_timeout` has lost its worker (killed, machine gone). The reaper runs on
Celery beat and at every worker start.
"""

from __future__ import annotations

import logging

from celery import Celery

from jobs import queries
from jobs.config import settings
from jobs.db import session_scope
from jobs.models import JobStatus
from jobs.queue import enqueue_job

log = logging.getLogger(__name__)


def reap(app: Celery) -> None:
    with session_scope(settings.resolved_database_url) as session:
        orphans = queries.orphaned_jobs(session=session, heartbeat_timeout=settings.heartbeat_timeout)
        to_enqueue = []
        for job in orphans:
            if job.status == JobStatus.canceling:
                queries.finish_job(
                    session=session,
                    job_id=job.id,
                    worker_id=None,
                    status=JobStatus.canceled,
                    error="canceled (its worker stopped)",
                )
            elif job.attempts >= settings.max_attempts:
                queries.finish_job(
                    session=session,
                    job_id=job.id,
                    worker_id=None,
                    status=JobStatus.failed,
                    error=f"worker lost during stage '{job.stage}' on {job.attempts} attempts; giving up",
                )
            elif queries.requeue_job(
                session=session,
                job_id=job.id,
                reason=f"worker {job.claimed_by} stopped responding during stage '{job.stage}'; requeued",
            ):
                to_enqueue.append(job.id)
    for job_id in to_enqueue:  # after commit: the worker must see the row queued
        log.warning("requeueing orphaned job %s", job_id)
        enqueue_job(app, job_id)
