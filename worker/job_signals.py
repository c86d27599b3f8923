"""Signals to the process running a job, taken at the job's next cancellation point: SIGTERM (shutdown)
hands the job back to the queue, SIGUSR1 (Celery's soft time limit) fails it. Never left running.

Two ways SIGTERM arrives, and what each does:

- To the worker's main process only (Docker, Kubernetes, `kill PID`): Celery's warm shutdown. The
  worker takes no new message and waits for the running job to end, then exits. Give it a stop
  grace period that fits your jobs; if the orchestrator loses patience and sends SIGKILL, the job
  is recovered like any crash (redelivery / the reaper's heartbeat timeout).
- To the pool process running the job (`kill -TERM -PGID`, systemd's control-group stop, an
  operator targeting the child): the job is *released*. While a job runs, its process's handler
  only records the signal; the job stops at its next cancellation point (every batch of every
  stage, every stage boundary: `Progress.should_cancel` calls `stop_if_requested`), by raising
  `ShutdownRequested` (a BaseException, so the runner's error handling does not turn it into a
  failure). `job_signals` then puts the row back to `queued` without counting the attempt (a
  canceling job ends `canceled` instead), removes its partial artifacts, commits, and queues a new
  message. The task returns, so its message is acknowledged (no duplicate delivery). The pool process
  stays in the pool: when the main process is shutting down too, the worker exits; otherwise it takes
  the next message, possibly this job. A job that ends before reaching a cancellation point just ends.

The soft time limit (`QUANT_JOB_SOFT_TIME_LIMIT`) is SIGUSR1 from the pool's parent. It too is only
recorded, and the next cancellation point raises Celery's `SoftTimeLimitExceeded`, which the runner
turns into a failed job naming the limit and the stage. A job that reaches no cancellation point
before the hard limit (`QUANT_JOB_TIME_LIMIT`) is killed and recovered like any crash.

Neither handler raises: an exception raised from a signal handler (what Celery's own handlers do)
surfaces at whatever bytecode the process was running, and in the database driver that is unsafe.
Measured with a timer signal raising at random moments in 3000 short PostgreSQL transactions: 20
surfaced as ordinary errors (a psycopg ProgrammingError from a connection left mid-query,
SQLAlchemy's InvalidRequestError, an AssertionError), which the runner records as the job's failure
with the wrong cause, and 79 were swallowed in a connection's `__del__`, leaving the job running
(tests/test_shutdown_points.py keeps this property).

The handlers are installed when the job starts and the previous ones (billiard's: SIGTERM exits the
process, SIGUSR1 raises) restored when it ends: billiard resets the pool's signal handlers after
Celery's process initialization, so handlers installed at process start would not survive.
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
from celery.exceptions import SoftTimeLimitExceeded

from jobs import queries, storage
from jobs.config import settings
from jobs.db import session_scope
from jobs.queue import enqueue_job

log = logging.getLogger(__name__)


SOFT_TIME_LIMIT_SIGNAL = signal.SIGUSR1  # billiard's SIG_SOFT_TIMEOUT
HANDLED = (signal.SIGTERM, SOFT_TIME_LIMIT_SIGNAL)


class ShutdownRequested(BaseException):
    """Raised inside a running job, at a cancellation point, once its pool process was asked to stop."""


_received: set[int] = set()  # the HANDLED signals that arrived while the current job ran


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _received.add(signum)


def stop_if_requested() -> None:
    """A running job's cancellation point: raise ``ShutdownRequested`` once SIGTERM has arrived (it wins:
    the job goes back to the queue), ``SoftTimeLimitExceeded`` once the soft time limit has passed."""
    if signal.SIGTERM in _received:
        raise ShutdownRequested("SIGTERM while running a job")
    if SOFT_TIME_LIMIT_SIGNAL in _received:
        raise SoftTimeLimitExceeded()


@contextmanager
def job_signals(app: Celery, job_id: uuid.UUID, owner: str) -> Iterator[None]:
    """Run a job with this module's handlers: a SIGTERM to this process hands it back to the queue, the
    soft time limit fails it, both at its next cancellation point (see the module doc).

    Precondition: called on the process's main thread (Celery's prefork pool); elsewhere signals
    cannot be handled and the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {signum: signal.signal(signum, _on_signal) for signum in HANDLED}
    try:
        yield
    except ShutdownRequested:
        _release(app, job_id, owner)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _received.clear()


def _release(app: Celery, job_id: uuid.UUID, owner: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        job = queries.get_job_unscoped(session=session, job_id=job_id)
        released = queries.release_job(
            session=session, job_id=job_id, worker_id=owner, reason=f"worker {owner} shut down; job requeued"
        )
        if job is not None and job.claimed_by in (owner, None):  # ours: its partial artifacts are ours too
            storage.open_store(settings).delete_prefix(storage.job_dir(job.project_id, job_id) + "/")
    if released:
        log.warning("worker shutting down: job %s released to the queue", job_id)
        enqueue_job(app, job_id)
