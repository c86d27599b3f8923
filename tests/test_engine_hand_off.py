"""A job's engine hand-off never outlives its attempt, on SQLite and PostgreSQL.

The runner ends the hand-off itself when it stops waiting (engine worker reported, timeout, cancel:
tests/test_engine_routing.py). These are the other ways an attempt ends while the build is queued on
or running at a GPU worker: the job's worker shuts down (release), its soft time limit passes or it
crashes some other way (failed), the reaper requeues it, a new attempt takes over from a dead one. Each
must retire the request, so the GPU worker neither takes the stale build nor reports on it, and its
build stops at its next check; and the job must not show an engine stage still queued or running.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session

from jobs import queries, workers
from jobs.db import session_scope
from jobs.models import JobStatus
from samples.rows import placeholder_job

OWNER = "gpu@test:101"


def _running_job(url: str) -> uuid.UUID:
    with session_scope(url) as session:
        project = queries.create_project(session=session, name=f"hand-off-{uuid.uuid4().hex[:8]}")
        (job_id,) = placeholder_job(session=session, project_id=project.id, recipe={})
        claimed = queries.claim_job(
            session=session, job_id=job_id, worker_id=OWNER, heartbeat_timeout=60, max_attempts=3
        )
        assert claimed is not None
    return job_id


def _hand_off(url: str, job_id: uuid.UUID, *, taken: bool) -> uuid.UUID:
    """Open a hand-off; `taken`: a GPU worker has claimed it and is building."""
    with session_scope(url) as session:
        request = workers.request_engine(session=session, job_id=job_id, owner=OWNER)
        assert request is not None
        if taken:
            assert workers.claim_engine(
                session=session, job_id=job_id, request=request, worker="engine@gpu", gpu="G", tensorrt_version="10"
            )
    return request


def _release(session: Session, job_id: uuid.UUID) -> None:  # SIGTERM to the job's worker
    assert queries.release_job(session=session, job_id=job_id, worker_id=OWNER, reason="worker shut down")


def _fail(session: Session, job_id: uuid.UUID) -> None:  # the soft time limit, or any error of the run
    assert queries.finish_job(
        session=session, job_id=job_id, worker_id=OWNER, status=JobStatus.failed, error="time limit"
    )


def _requeue(session: Session, job_id: uuid.UUID) -> None:  # the reaper, after the heartbeat stopped
    assert queries.requeue_job(session=session, job_id=job_id, reason="worker lost")


def _take_over(session: Session, job_id: uuid.UUID) -> None:  # a redelivered message, the old runner dead
    taken = queries.claim_job(
        session=session, job_id=job_id, worker_id="gpu@test:202", heartbeat_timeout=60, max_attempts=3, dead_owner=True
    )
    assert taken is not None


ENDINGS: dict[str, tuple[Callable[[Session, uuid.UUID], None], str]] = {
    "release": (_release, "the job was queued again before its engine build ended"),
    "soft time limit": (_fail, "the job ended failed before its engine build ended"),
    "reaper": (_requeue, "the job was queued again before its engine build ended"),
    "takeover": (_take_over, "a new attempt took the job over before its engine build ended"),
}


@pytest.mark.parametrize("taken", [False, True], ids=["queued", "building"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_attempt_that_ends_retires_its_hand_off(database: str, ending: str, taken: bool) -> None:
    job_id = _running_job(database)
    request = _hand_off(database, job_id, taken=taken)
    end, reason = ENDINGS[ending]
    with session_scope(database) as session:
        end(session, job_id)
    with session_scope(database) as session:
        state = workers.engine_state(session=session, job_id=job_id)
        assert state is not None
        assert (state.status, state.reason, state.request) == ("skipped", reason, None)
        # The GPU worker's side: the stale build can be neither taken nor reported, and the build's
        # periodic check (worker.engine_task, `state.request != request`) now says stop.
        assert not workers.claim_engine(
            session=session, job_id=job_id, request=request, worker="engine@gpu", gpu=None, tensorrt_version=None
        )
        assert not workers.finish_engine(
            session=session,
            job_id=job_id,
            request=request,
            status="built",
            reason=None,
            gpu=None,
            tensorrt_version=None,
        )


def test_an_engine_stage_that_ended_keeps_its_outcome(database: str) -> None:
    """The runner recorded how the stage ended before the job ended: that stays, word for word."""
    job_id = _running_job(database)
    request = _hand_off(database, job_id, taken=True)
    with session_scope(database) as session:
        assert workers.finish_engine(
            session=session,
            job_id=job_id,
            request=request,
            status="failed",
            reason="out of GPU memory",
            gpu=None,
            tensorrt_version=None,
        )
        _fail(session, job_id)
    with session_scope(database) as session:
        state = workers.engine_state(session=session, job_id=job_id)
    assert state is not None and (state.status, state.reason, state.request) == ("failed", "out of GPU memory", None)


def test_a_cancel_request_leaves_the_hand_off_to_the_runner(database: str) -> None:
    """running → canceling: the runner's wait sees the request and ends the stage with its own words;
    meanwhile the GPU worker may not take the build (claim_engine refuses a canceled job)."""
    job_id = _running_job(database)
    request = _hand_off(database, job_id, taken=False)
    with session_scope(database) as session:
        job = queries.get_job_unscoped(session=session, job_id=job_id)
        assert queries.request_cancel(session=session, job=job).status == JobStatus.canceling
    with session_scope(database) as session:
        state = workers.engine_state(session=session, job_id=job_id)
        assert state is not None and (state.status, state.request) == ("queued", request)
        assert not workers.claim_engine(
            session=session, job_id=job_id, request=request, worker="engine@gpu", gpu=None, tensorrt_version=None
        )
