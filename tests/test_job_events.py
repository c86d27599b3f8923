"""Job events written twice by a retried transaction are stored once, on SQLite and PostgreSQL.

`jobs.db.in_transaction` repeats a unit of work when the connection fails, including when it fails
during COMMIT, after which the server may have committed the first try. A worker numbers its events
per attempt, so the repeat finds its event stored and adds nothing: no second progress event, no
second observation of the stage that ended.
"""

from __future__ import annotations

import uuid

from sqlalchemy import func, select

from jobs import queries, timings
from jobs.db import session_scope
from jobs.models import JobEvent
from samples.rows import placeholder_job


def _job(url: str) -> uuid.UUID:
    with session_scope(url) as session:
        project = queries.create_project(session=session, name=f"events-{uuid.uuid4().hex[:8]}")
        (job_id,) = placeholder_job(session=session, project_id=project.id, recipe={})
        return job_id


def _events(url: str, job_id: uuid.UUID) -> list[tuple[str, str | None, int | None, int | None]]:
    with session_scope(url) as session:
        rows = session.execute(
            select(JobEvent.kind, JobEvent.stage, JobEvent.attempt, JobEvent.sequence)
            .where(JobEvent.job_id == job_id)
            .order_by(JobEvent.id)
        ).all()
    return [tuple(row) for row in rows]


def _progress(url: str, job_id: uuid.UUID, stage: str, sequence: int, kind: str = "progress") -> None:
    with session_scope(url) as session:
        queries.set_progress(
            session=session,
            job_id=job_id,
            worker_id="host:1",
            stage=stage,
            progress=0.5,
            kind=kind,
            attempt=1,
            sequence=sequence,
        )


def test_a_repeated_progress_event_is_stored_once(database: str) -> None:
    job_id = _job(database)
    _progress(database, job_id, "calibrate", 0, kind="stage")
    _progress(database, job_id, "calibrate", 1)
    _progress(database, job_id, "calibrate", 1)  # the retry of a unit whose COMMIT landed
    assert _events(database, job_id) == [
        ("status", None, None, None),  # `queued`, written by the API: unnumbered
        ("stage", "calibrate", 1, 0),
        ("progress", "calibrate", 1, 1),
    ]


def test_a_repeated_stage_boundary_observes_the_ended_stage_once(database: str) -> None:
    job_id = _job(database)
    _progress(database, job_id, "calibrate", 0, kind="stage")
    _progress(database, job_id, "export", 1, kind="stage")  # calibrate ends: one observation
    _progress(database, job_id, "export", 1, kind="stage")  # retried: neither a second event nor observation
    with session_scope(database) as session:
        histograms = timings.histograms(session=session)
    assert histograms["calibrate"][-1][1] == 1  # the +Inf bucket's cumulative count
    assert "export" not in histograms  # the retry did not take its own fresh event for an ended stage
    assert [event[1] for event in _events(database, job_id)] == [None, "calibrate", "export"]


def test_log_events_are_idempotent_too_and_unnumbered_events_always_append(database: str) -> None:
    job_id = _job(database)
    with session_scope(database) as session:
        for _ in range(2):
            queries.add_event(session=session, job_id=job_id, kind="log", message="warn", attempt=2, sequence=7)
            queries.add_event(session=session, job_id=job_id, kind="log", message="reaper")  # no number
    with session_scope(database) as session:
        count = session.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id))
    assert count == 1 + 1 + 2  # queued, the numbered log once, the unnumbered one twice
