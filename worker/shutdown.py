"""Graceful shutdown of a worker: a job is finished or handed back to the queue, never left running.

Two ways SIGTERM arrives, and what each does:

- To the worker's main process only (Docker, Kubernetes, `kill PID`): Celery's warm shutdown. The
  worker takes no new message and waits for the running job to end, then exits. Give it a stop
  grace period that fits your jobs; if the orchestrator loses patience and sends SIGKILL, the job
  is recovered like any crash (redelivery / the reaper's heartbeat timeout).
- To the pool process running the job (`kill -TERM -PGID`, systemd's control-group stop, an
  operator targeting the child): the job is *released* at once. While a job runs, its process's
  SIGTERM handler raises `ShutdownRequested` inside the job (a BaseException, so the runner's error
  handling does not turn it into a failure); `release_on_shutdown` then puts the row back to
  `queued` without counting the attempt (a canceling job ends `canceled` instead), removes its
  partial artifacts, commits, and queues a new message. The task returns, so its message is
  acknowledged (no duplicate delivery). The pool process stays in the pool: when the main process
  is shutting down too, the worker exits; otherwise it takes the next message, possibly this job.

The handler is installed when the job starts and the previous one (billiard's, which exits the
process) restored when it ends: billiard resets the pool's signal handlers after Celery's process
initialization, so a handler installed at process start would not survive.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from celery import Celery

from jobs import queries, storage
from jobs.config import settings
from jobs.db import session_scope
from jobs.queue import enqueue_job

log = logging.getLogger(__name__)


class ShutdownRequested(BaseException):
    """Raised inside a running job when its pool process is asked to stop."""


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise ShutdownRequested(f"signal {signum} while running a job")


@contextmanager
def release_on_shutdown(app: Celery, job_id: uuid.UUID, owner: str) -> Iterator[None]:
    """Run a job so that a SIGTERM to this process hands it back to the queue (see the module doc).

    Precondition: called on the process's main thread (Celery's prefork pool); elsewhere signals
    cannot be handled and the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except ShutdownRequested:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one release; a second SIGTERM must not interrupt it
        _release(app, job_id, owner)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _release(app: Celery, job_id: uuid.UUID, owner: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        job = queries.get_job_unscoped(session=session, job_id=job_id)
        released = queries.release_job(
            session=session, job_id=job_id, worker_id=owner, reason=f"worker {owner} shut down; job requeued"
        )
        if job is not None and job.claimed_by in (owner, None):  # ours: its partial artifacts are ours too
            storage.remove_tree(settings.artifact_root, storage.job_dir(job.project_id, job_id))
    if released:
        log.warning("worker shutting down: job %s released to the queue", job_id)
        enqueue_job(app, job_id)
