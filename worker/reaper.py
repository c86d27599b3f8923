"""Find jobs that lost their worker or their queue message, and put them back in the queue (or end them).

Two ways a job gets stuck, both repaired here, on Celery beat and at every worker start:

- **lost worker**: a running job's worker refreshes `heartbeat_at` every `heartbeat_interval`; a job
  whose heartbeat is older than `heartbeat_timeout` has lost its worker (killed, machine gone). It is
  requeued (and resumes from its checkpoint), or failed once it has used `max_attempts`, or canceled
  when a cancel was pending.
- **lost message**: Redis without persistence forgets its queues when it restarts, so a job can sit
  `queued` with no message to run it. A queued job unchanged for `lost_message_timeout` whose id is in
  no broker queue (`jobs.queue.pending_job_ids`) gets its message sent again. A duplicate (the race
  described there, or a broker that cannot be inspected) is harmless: the claim on the job row lets
  exactly one delivery run it.
"""

from __future__ import annotations

import logging
import shutil
import uuid

from celery import Celery

from jobs import queries
from jobs.config import settings
from jobs.db import session_scope
from jobs.models import JobStatus
from jobs.queue import enqueue_job, pending_job_ids

log = logging.getLogger(__name__)


def reap(app: Celery) -> None:
    requeue_orphans(app)
    resend_lost_messages(app)


def requeue_orphans(app: Celery) -> None:
    ended: list[uuid.UUID] = []
    to_enqueue: list[uuid.UUID] = []
    with session_scope(settings.resolved_database_url) as session:
        orphans = queries.orphaned_jobs(session=session, heartbeat_timeout=settings.heartbeat_timeout)
        for job in orphans:
            if job.status == JobStatus.canceling:
                if queries.finish_job(
                    session=session,
                    job_id=job.id,
                    worker_id=None,
                    status=JobStatus.canceled,
                    error="canceled (its worker stopped)",
                ):
                    ended.append(job.id)
            elif job.attempts >= settings.max_attempts:
                if queries.finish_job(
                    session=session,
                    job_id=job.id,
                    worker_id=None,
                    status=JobStatus.failed,
                    error=f"worker lost during stage '{job.stage}' on {job.attempts} attempts; giving up",
                ):
                    ended.append(job.id)
            elif queries.requeue_job(
                session=session,
                job_id=job.id,
                reason=f"worker {job.claimed_by} stopped responding during stage '{job.stage}'; requeued",
            ):
                to_enqueue.append(job.id)
    for job_id in ended:  # the dead worker's checkpoint will never be resumed
        shutil.rmtree(settings.artifact_root / ".work" / str(job_id), ignore_errors=True)
    for job_id in to_enqueue:  # after commit: the worker must see the row queued
        log.warning("requeueing orphaned job %s", job_id)
        enqueue_job(app, job_id)


def resend_lost_messages(app: Celery) -> None:
    with session_scope(settings.resolved_database_url) as session:
        stale = queries.stale_queued_jobs(session=session, older_than=settings.lost_message_timeout)
    if not stale:
        return
    pending = pending_job_ids(app)  # read after the rows: a message sent meanwhile is counted as live
    lost = [job_id for job_id in stale if pending is None or job_id not in pending]
    resent = []
    with session_scope(settings.resolved_database_url) as session:
        for job_id in lost:
            reason = (
                "its queue message was lost (broker restarted); sent again"
                if pending is not None
                else f"queued for over {settings.lost_message_timeout:g} s; message sent again"
            )
            if queries.note_resent(session=session, job_id=job_id, reason=reason):
                resent.append(job_id)
    for job_id in resent:
        log.warning("job %s had no queue message; sending it again", job_id)
        enqueue_job(app, job_id)
