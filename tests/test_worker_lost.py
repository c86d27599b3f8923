"""A job whose worker process dies on every attempt, on SQLite and PostgreSQL: after the last attempt it
fails, and its error says in which stage the attempts were lost (tests/test_recovery.py kills real workers
once; this is the give-up path, at the level of the claims)."""

from __future__ import annotations

from jobs import queries
from jobs.db import session_scope
from jobs.models import JobStatus
from samples.rows import placeholder_job

OWNER = "gpu@test:301"


def _claim(url: str, job_id, *, dead_owner: bool = False):
    with session_scope(url) as session:
        return queries.claim_job(
            session=session, job_id=job_id, worker_id=OWNER, heartbeat_timeout=60, max_attempts=3, dead_owner=dead_owner
        )


def test_a_job_whose_worker_dies_every_time_fails_naming_the_stage(database: str) -> None:
    # (a native library crashing on the model, as ONNX Runtime's QLinearMul did on an empty tensor)
    with session_scope(database) as session:
        project = queries.create_project(session=session, name="worker-lost")
        (job_id,) = placeholder_job(session=session, project_id=project.id, recipe={})
    assert _claim(database, job_id).attempts == 1
    for attempt in (2, 3):  # each redelivery finds the owner's process dead and takes the job over
        assert _claim(database, job_id, dead_owner=True).attempts == attempt
    with session_scope(database) as session:  # the last attempt reaches evaluate, and dies there
        queries.set_progress(session=session, job_id=job_id, worker_id=OWNER, stage="evaluate", progress=0.5)
    assert _claim(database, job_id, dead_owner=True) is None
    with session_scope(database) as session:
        job = queries.get_job_unscoped(session=session, job_id=job_id)
        assert job.status == JobStatus.failed
        assert job.error == "worker lost 3 times (the last attempt during stage 'evaluate'); giving up"


def test_taking_over_a_lost_attempt_says_where_it_was_lost(database: str) -> None:
    # kill -9 of the worker: the redelivered message's claim takes the running job over, and the
    # events say why attempt 1 ended, before attempt 2 starts
    with session_scope(database) as session:
        project = queries.create_project(session=session, name="worker-lost-event")
        (job_id,) = placeholder_job(session=session, project_id=project.id, recipe={})
    _claim(database, job_id)
    with session_scope(database) as session:
        queries.set_progress(session=session, job_id=job_id, worker_id=OWNER, stage="calibrate", progress=0.3)
    assert _claim(database, job_id, dead_owner=True).attempts == 2
    with session_scope(database) as session:
        events = [(e.kind, e.message) for e in queries.events_after(session=session, job_id=job_id, after_id=0)]
    lost = events.index(("log", "worker lost during calibrate; attempt 2"))
    assert events[lost + 1] == ("status", f"running (attempt 2) on {OWNER}")
    assert [m for _, m in events].count("worker lost during calibrate; attempt 2") == 1
