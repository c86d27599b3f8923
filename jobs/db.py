"""Engines and sessions, one engine per database URL per process; transactions retried across outages.

PostgreSQL connections are checked before use (`pool_pre_ping`), so a pool that outlived a server
restart hands out a fresh connection instead of a dead one. `in_transaction` repeats a unit of work
when the database is unreachable for a while (restart, failover), with exponential backoff.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")
log = logging.getLogger(__name__)


@functools.cache
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # API and worker are separate processes writing the same file: WAL lets readers go on
        # while a writer commits, and busy_timeout makes a writer wait instead of failing.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    # connect_timeout: a server that does not answer fails the attempt in seconds, so retries go on.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, connect_args={"connect_timeout": 5})


@functools.cache
def get_sessionmaker(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _transient(exc: DBAPIError) -> bool:
    """A lost or refused connection (the pool marks it invalidated) or a busy SQLite file: worth retrying.
    Constraint violations and bad SQL are not."""
    if exc.connection_invalidated:
        return True
    return type(exc.orig).__name__ in {"OperationalError", "InterfaceError"}


def in_transaction(
    url: str, work: Callable[[Session], T], *, budget: float, first_delay: float = 0.2, max_delay: float = 5.0
) -> T:
    """``work(session)`` in its own transaction (committed on return), repeated while the database is
    unreachable: waits ``first_delay``, then doubles the wait up to ``max_delay``, until ``budget``
    seconds have passed since the first try; then the last error propagates.

    Precondition: ``work`` may run more than once. A failed try was rolled back as a whole, except when
    the connection died during COMMIT itself, where the server may have committed: so ``work`` should be
    idempotent or harmless to repeat (a worker's numbered job event, stored once; a compare-and-set update).
    """
    deadline = time.monotonic() + budget
    delay = first_delay
    while True:
        try:
            with session_scope(url) as session:
                return work(session)
        except DBAPIError as exc:
            if not _transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("database unreachable (%s); retrying in %.1f s", type(exc.orig).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
