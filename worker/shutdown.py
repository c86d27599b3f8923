"""Graceful shutdown of a worker: a job is finished or handed back to the queue, never left running.

Two ways SIGTERM arrives, and what each does:

- To the worker's main process only (Docker, Kubernetes, `kill PID`): Celery's warm shutdown. The
  worker takes no new message and waits for the running job to end, then exits. Give it a stop
  grace period that fits your jobs; if the orchestrator loses patience and sends SIGKILL, the job
  is recovered like any crash (redelivery / the reaper's heartbeat timeout).
- To the pool process running the job (`kill -TERM -PGID`, systemd's control-group stop, an
  operator targeting the child): the job is *released*. While a job runs, its process's SIGTERM
  handler only records the request; the job stops at its next cancellation point (every batch of
  every stage, every stage boundary: `Progress.should_cancel` calls `stop_if_requested`), by raising
  `ShutdownRequested` (a BaseException, so the runner's error handling does not turn it into a
  failure). `release_on_shutdown` then puts the row back to `queued` without counting the attempt (a
  canceling job ends `canceled` instead), removes its partial artifacts, commits, and queues a new
  message. The task returns, so its message is acknowledged (no duplicate delivery). The pool process
  stays in the pool: when the main process is shutting down too, the worker exits; otherwise it takes
  the next message, possibly this job. A job that ends before reaching a cancellation point just ends.

The handler does not raise: an exception raised from a signal handler surfaces at whatever bytecode
the process was running, and in the database driver that is unsafe. Measured with a timer signal
raising at random moments in 3000 short PostgreSQL transactions: 20 surfaced as ordinary errors (a
psycopg ProgrammingError from a connection left mid-query, SQLAlchemy's InvalidRequestError, an
AssertionError), which the runner records as the job's failure, and 79 were swallowed in a
connection's `__del__`, leaving the job running (tests/test_shutdown_points.py keeps this property).

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
    """Raised inside a running job, at a cancellation point, once its pool process was asked to stop."""


_requested = threading.Event()


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    _requested.set()


def stop_if_requested() -> None:
    """A running job's cancellation point: raise ``ShutdownRequested`` once SIGTERM has arrived."""
    if _requested.is_set():
        raise ShutdownRequested("SIGTERM while running a job")


@contextmanager
def release_on_shutdown(app: Celery, job_id: uuid.UUID, owner: str) -> Iterator[None]:
    """Run a job so that a SIGTERM to this process hands it back to the queue (see the module doc).

    Precondition: called on the process's main thread (Celery's prefork pool); elsewhere signals
    cannot be handled and the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except ShutdownRequested:
        _release(app, job_id, owner)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _requested.clear()


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
