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
- **lost validation**: an uploaded model or image dataset stays `pending` until its validation task
  records a verdict. One still pending `validation_resend_seconds` after its last validation message,
  with that message in no broker queue, gets it sent again; once `validation_max_attempts` messages
  went unanswered it is marked invalid with the reason (`jobs.revalidation`). A duplicate check is
  harmless: the verdict is written only onto a pending row. A message held unacknowledged by a worker
  that was killed counts as live: Redis hands it out again after its visibility timeout.
"""

from __future__ import annotations

import logging
import shutil
import uuid

from celery import Celery

from jobs import queries, revalidation
from jobs.config import settings
from jobs.db import session_scope
from jobs.models import Dataset, JobStatus, Model
from jobs.queue import (
    enqueue_dataset_validation,
    enqueue_job,
    enqueue_validation,
    pending_job_ids,
    pending_validation_ids,
)

log = logging.getLogger(__name__)


def reap(app: Celery) -> None:
    requeue_orphans(app)
    resend_lost_messages(app)
    resend_lost_validations(app)


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
                reason=f"{queries.lost_message(job.stage, job.attempts + 1)} queued "
                f"(worker {job.claimed_by} stopped responding)",
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


# What the reaper re-sends for each kind of upload, and the word its log uses.
VALIDATIONS = ((Model, enqueue_validation, "model"), (Dataset, enqueue_dataset_validation, "dataset"))


def resend_lost_validations(app: Celery) -> None:
    url = settings.resolved_database_url
    with session_scope(url) as session:
        overdue = {
            entity: revalidation.overdue_validations(
                session=session, entity=entity, older_than=settings.validation_resend_seconds
            )
            for entity, _send, _word in VALIDATIONS
        }
    if not any(overdue.values()):
        return
    live = pending_validation_ids(app)  # read after the rows: a message sent meanwhile is counted as live
    to_send = []
    with session_scope(url) as session:
        for entity, send, word in VALIDATIONS:
            for row_id, attempts in overdue[entity]:
                if live is not None and row_id in live:
                    continue  # waiting behind other checks, or running: not lost
                if attempts >= settings.validation_max_attempts:
                    if revalidation.give_up_validation(
                        session=session, entity=entity, row_id=row_id, attempts=attempts
                    ):
                        log.warning(
                            "%s %s: validation did not complete after %d attempts; invalid", word, row_id, attempts
                        )
                elif revalidation.note_validation_resent(
                    session=session, entity=entity, row_id=row_id, attempts=attempts
                ):
                    to_send.append((send, word, row_id))
    for send, word, row_id in to_send:  # after commit, as at upload
        log.warning("%s %s is still pending with no validation message; sending it again", word, row_id)
        send(app, row_id)
