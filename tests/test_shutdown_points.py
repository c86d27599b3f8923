"""Where a SIGTERM to a running job's process takes effect: at the job's next cancellation point, never
inside whatever the process happened to be running (worker/job_signals.py says why).

In-process, on a real PostgreSQL: SIGTERMs at random moments of a burst of short transactions, the
database work a job does at every progress event and cancel check. No error may surface in that work,
and the next cancellation point must stop the job. With a handler that raised where the signal landed,
about one interrupt in 150 came out as an ordinary database error and one in 40 was swallowed in a
connection's ``__del__`` (the measurement in worker/job_signals.py), so 200 interrupts fail such a handler
with near certainty.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import text

from jobs.db import in_transaction, session_scope
from tests.conftest import make_database
from worker.app import app
from worker.job_signals import SOFT_TIME_LIMIT_SIGNAL, ShutdownRequested, job_signals, stop_if_requested

INTERRUPTS = 200


@pytest.fixture(scope="module")
def counter_database() -> Iterator[str]:
    with make_database("postgresql") as url:
        with session_scope(url) as session:
            session.execute(text("CREATE TABLE counter (id int PRIMARY KEY, value int NOT NULL)"))
            session.execute(text("INSERT INTO counter VALUES (1, 0)"))
        yield url


def _bump(session) -> int:
    session.execute(text("UPDATE counter SET value = value + 1 WHERE id = 1"))
    return session.execute(text("SELECT value FROM counter WHERE id = 1")).scalar_one()


def test_a_sigterm_stops_the_job_at_its_next_cancellation_point(counter_database: str) -> None:
    rng = random.Random(0)
    for _ in range(INTERRUPTS):
        # The job's id names no row: the block below never lets ShutdownRequested out, so nothing is released.
        with job_signals(app, uuid.uuid4(), "test:0"):
            sender = threading.Timer(rng.uniform(0.0, 0.004), os.kill, (os.getpid(), signal.SIGTERM))
            sender.start()
            values = [in_transaction(counter_database, _bump, budget=5) for _ in range(5)]  # must not raise
            sender.join()
            assert values == list(range(values[0], values[0] + 5))  # every write committed, once
            with pytest.raises(ShutdownRequested):
                stop_if_requested()


def test_a_job_that_ends_before_its_next_cancellation_point_just_ends() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with job_signals(app, uuid.uuid4(), "test:0"):
        os.kill(os.getpid(), signal.SIGTERM)  # handled on this thread before the block ends
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handler is back
    with job_signals(app, uuid.uuid4(), "test:0"):
        stop_if_requested()  # the next job this process runs starts afresh


def test_the_soft_time_limit_fails_the_job_unless_it_is_being_released() -> None:
    with job_signals(app, uuid.uuid4(), "test:0"):
        os.kill(os.getpid(), SOFT_TIME_LIMIT_SIGNAL)  # what the pool's parent sends at the soft limit
        with pytest.raises(SoftTimeLimitExceeded):
            stop_if_requested()
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(ShutdownRequested):  # both arrived: the job goes back to the queue
            stop_if_requested()
