"""Every read and write of the service's tables, keyword-only, used by both API and worker.

Routes and tasks write no SQL. Functions flush but do not commit unless their docstring says so:
the caller owns the transaction (an API request, a task step), so a job's terminal state and the
event announcing it land together or not at all.

Job state changes are compare-and-set UPDATEs, so two processes racing on one job (a redelivered
duplicate, the reaper, a cancel request) cannot both win, and a terminal state never changes again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from jobs import workers
from jobs.cursors import paginate
from jobs.models import (
    TERMINAL_STATUSES,
    Artifact,
    Job,
    JobEvent,
    JobStatus,
    Project,
    utcnow,
)
from jobs.outbox import record_job_end
from jobs.signing import generate_secret
from jobs.timings import record_stage_end

# Projects (their API keys: jobs.keys) ---------------------------------------------------------


def create_project(*, session: Session, name: str) -> Project:
    project = Project(name=name)
    session.add(project)
    session.flush()
    return project


def get_project_by_name(*, session: Session, name: str) -> Project | None:
    return session.scalar(select(Project).where(Project.name == name))


# Jobs -----------------------------------------------------------------------------------------


def create_job(
    *,
    session: Session,
    project_id: uuid.UUID,
    model_id: uuid.UUID,
    dataset_id: uuid.UUID,
    recipe: dict[str, Any],
    webhook_url: str | None = None,
) -> Job:
    """A queued job; with `webhook_url`, also the secret that will sign its one-off webhook."""
    job = Job(
        project_id=project_id,
        model_id=model_id,
        dataset_id=dataset_id,
        recipe=recipe,
        webhook_url=webhook_url,
        webhook_secret=generate_secret() if webhook_url else None,
    )
    session.add(job)
    session.flush()
    add_event(session=session, job_id=job.id, kind="status", message="queued", data={"status": "queued"})
    return job


# Built once (its construction cost more than the rest of the lookup): every API route that acts on one
# job (cancel, events, report, artifacts) reads it through here. GET /jobs/{id} reads `jobs.job_reads`.
_PROJECT_JOB = select(Job).where(Job.id == bindparam("job_id"), Job.project_id == bindparam("project_id"))


def get_job(*, session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> Job | None:
    return session.scalar(_PROJECT_JOB, {"job_id": job_id, "project_id": project_id})


def get_job_unscoped(*, session: Session, job_id: uuid.UUID) -> Job | None:
    return session.get(Job, job_id)


def list_jobs(
    *,
    session: Session,
    project_id: uuid.UUID,
    status: JobStatus | None,
    limit: int,
    cursor: str | None,
    model_id: uuid.UUID | None = None,
) -> tuple[list[Job], str | None]:
    query = select(Job).where(Job.project_id == project_id)
    if status is not None:
        query = query.where(Job.status == status)
    if model_id is not None:
        query = query.where(Job.model_id == model_id)
    return paginate(session=session, query=query, entity=Job, limit=limit, cursor=cursor)


def request_cancel(*, session: Session, job: Job) -> Job:
    """queued → canceled at once; running → canceling (the worker stops at its next check)."""
    now = utcnow()
    if job.status == JobStatus.queued:
        done = _transition(
            session=session,
            job_id=job.id,
            allowed=(JobStatus.queued,),
            status=JobStatus.canceled,
            values={"cancel_requested": True, "finished_at": now, "error": "canceled before it started"},
        )
        if done:
            add_event(session=session, job_id=job.id, kind="status", message="canceled", data={"status": "canceled"})
    elif job.status == JobStatus.running:
        done = _transition(
            session=session,
            job_id=job.id,
            allowed=(JobStatus.running,),
            status=JobStatus.canceling,
            values={"cancel_requested": True},
        )
        if done:
            add_event(session=session, job_id=job.id, kind="status", message="canceling", data={"status": "canceling"})
    session.refresh(job)
    return job


def claim_job(
    *,
    session: Session,
    job_id: uuid.UUID,
    worker_id: str,
    heartbeat_timeout: float,
    max_attempts: int,
    dead_owner: bool = False,
) -> Job | None:
    """Make `worker_id` the job's only runner, or return None when someone else holds it.

    A job is claimable when queued, or running with a heartbeat older than `heartbeat_timeout`
    (its worker died), or running under an owner the caller has proven dead (`dead_owner`, same
    host, pid gone). A job that has used up `max_attempts` fails instead of starting again.
    Commits.
    """
    job = session.get(Job, job_id)
    if job is None or job.status not in (JobStatus.queued, JobStatus.running):
        return None
    now = utcnow()
    stale = now - timedelta(seconds=heartbeat_timeout)
    condition = or_(
        Job.status == JobStatus.queued,
        and_(Job.status == JobStatus.running, Job.heartbeat_at < stale),
    )
    if dead_owner and job.claimed_by:
        condition = or_(condition, and_(Job.status == JobStatus.running, Job.claimed_by == job.claimed_by))
    if job.attempts >= max_attempts:
        # where the last attempt was when its process died: a job whose every attempt kills its worker at
        # the same stage (a native crash in a library) says so
        where = f" (the last attempt during stage {job.stage!r})" if job.stage else ""
        failed = _transition(
            session=session,
            job_id=job_id,
            allowed=(JobStatus.queued, JobStatus.running),
            status=JobStatus.failed,
            values={"finished_at": now, "error": f"worker lost {job.attempts} times{where}; giving up"},
            extra=condition,
        )
        if failed:
            add_event(session=session, job_id=job_id, kind="status", message="failed", data={"status": "failed"})
        session.commit()
        return None
    # Taking over a running job: its last attempt's worker died without a word (kill -9, OOM); say so.
    lost = (job.stage, job.claimed_by) if job.status == JobStatus.running else None
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, condition)
        .values(
            status=JobStatus.running,
            claimed_by=worker_id,
            heartbeat_at=now,
            attempts=Job.attempts + 1,
            started_at=job.started_at or now,
            updated_at=now,
            **workers.hand_off_closed("a new attempt took the job over before its engine build ended"),
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        session.rollback()
        return None
    session.commit()
    session.refresh(job)
    if lost is not None:
        stage, lost_worker = lost
        add_event(
            session=session,
            job_id=job_id,
            kind="log",
            message=lost_message(stage, job.attempts),
            stage=stage,
            data={"worker": lost_worker, "attempt": job.attempts},
        )
    add_event(
        session=session,
        job_id=job_id,
        kind="status",
        message=f"running (attempt {job.attempts}) on {worker_id}",
        data={"status": "running", "attempt": job.attempts, "worker": worker_id},
    )
    session.commit()
    return job


def heartbeat(*, session: Session, job_id: uuid.UUID, worker_id: str) -> bool:
    """Refresh the claim; False when the job is no longer ours (reaped, finished). Commits."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.claimed_by == worker_id, Job.status.in_((JobStatus.running, JobStatus.canceling)))
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return result.rowcount == 1


def cancel_requested(*, session: Session, job_id: uuid.UUID) -> bool:
    return bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


def set_progress(
    *,
    session: Session,
    job_id: uuid.UUID,
    worker_id: str,
    stage: str,
    progress: float,
    message: str = "",
    kind: str = "progress",
    attempt: int | None = None,
    sequence: int | None = None,
) -> None:
    """Record stage/progress on the row and as an event (kind `stage` at a stage boundary). With the
    event's `attempt` and `sequence`, running this again once it committed changes nothing more."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.claimed_by == worker_id, Job.status.in_((JobStatus.running, JobStatus.canceling)))
        .values(stage=stage, progress=progress, heartbeat_at=utcnow(), updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if event_recorded(session=session, job_id=job_id, attempt=attempt, sequence=sequence):
        return  # a retry of a unit that committed: the stage end was observed then
    now = utcnow()
    if kind == "stage":  # a new stage starts: the previous one of this attempt has ended
        record_stage_end(session=session, job_id=job_id, ended_at=now)
    add_event(
        session=session,
        job_id=job_id,
        kind=kind,
        stage=stage,
        progress=progress,
        message=message,
        attempt=attempt,
        sequence=sequence,
        created_at=now,
    )


def finish_job(
    *, session: Session, job_id: uuid.UUID, worker_id: str | None, status: JobStatus, error: str | None = None
) -> bool:
    """Make a running job terminal and announce it; False if it was not ours to finish.

    Announce means both the `status` event and, through `_transition`, the webhook outbox message:
    they commit with the terminal state or not at all.
    """
    assert status in TERMINAL_STATUSES
    values: dict[str, Any] = {"finished_at": utcnow(), "error": error}
    if status == JobStatus.succeeded:
        values["progress"] = 1.0
    extra = Job.claimed_by == worker_id if worker_id is not None else None
    done = _transition(
        session=session,
        job_id=job_id,
        allowed=(JobStatus.running, JobStatus.canceling),
        status=status,
        values=values,
        extra=extra,
    )
    if done:
        now = utcnow()
        if status == JobStatus.succeeded:  # the last stage completed too
            record_stage_end(session=session, job_id=job_id, ended_at=now)
        add_event(
            session=session,
            job_id=job_id,
            kind="status",
            message=error or status.value,
            data={"status": status.value, "error": error},
            created_at=now,
        )
    return done


def lost_message(stage: str | None, attempt: int) -> str:
    """What a job's events say when the worker running it died and attempt `attempt` takes over."""
    where = f"during {stage}" if stage else "before its first stage"
    return f"worker lost {where}; attempt {attempt}"


def requeue_job(*, session: Session, job_id: uuid.UUID, reason: str) -> bool:
    """Put an orphaned running job back in the queue (the caller then enqueues it)."""
    done = _transition(
        session=session,
        job_id=job_id,
        allowed=(JobStatus.running,),
        status=JobStatus.queued,
        values={"claimed_by": None, "stage": None, "progress": 0.0},
    )
    if done:
        add_event(session=session, job_id=job_id, kind="status", message=reason, data={"status": "queued"})
    return done


def release_job(*, session: Session, job_id: uuid.UUID, worker_id: str, reason: str) -> bool:
    """A job whose worker is shutting down: running → queued with this attempt not counted (True,
    the caller enqueues it); canceling → canceled. False when it was not ours or not running."""
    done = _transition(
        session=session,
        job_id=job_id,
        allowed=(JobStatus.running,),
        status=JobStatus.queued,
        values={"claimed_by": None, "stage": None, "progress": 0.0, "attempts": Job.attempts - 1},
        extra=Job.claimed_by == worker_id,
    )
    if done:
        add_event(session=session, job_id=job_id, kind="status", message=reason, data={"status": "queued"})
        return True
    finish_job(  # only a canceling job of ours is left to end here
        session=session, job_id=job_id, worker_id=worker_id, status=JobStatus.canceled, error="canceled by request"
    )
    return False


def orphaned_jobs(*, session: Session, heartbeat_timeout: float) -> Sequence[Job]:
    """Running or canceling jobs whose worker stopped beating."""
    stale = utcnow() - timedelta(seconds=heartbeat_timeout)
    return session.scalars(
        select(Job).where(Job.status.in_((JobStatus.running, JobStatus.canceling)), Job.heartbeat_at < stale)
    ).all()


def stale_queued_jobs(*, session: Session, older_than: float, limit: int = 1000) -> Sequence[uuid.UUID]:
    """Ids of queued jobs whose row has not changed for `older_than` seconds, oldest first."""
    cutoff = utcnow() - timedelta(seconds=older_than)
    return session.scalars(
        select(Job.id)
        .where(Job.status == JobStatus.queued, Job.updated_at < cutoff)
        .order_by(Job.updated_at)
        .limit(limit)
    ).all()


def note_resent(*, session: Session, job_id: uuid.UUID, reason: str) -> bool:
    """Record that a still-queued job's message is sent again (the caller sends it after commit);
    restarts its `older_than` clock. False when the job left the queue meanwhile."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued)
        .values(updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return False
    add_event(session=session, job_id=job_id, kind="log", message=reason)
    return True


def _transition(
    *,
    session: Session,
    job_id: uuid.UUID,
    allowed: tuple[JobStatus, ...],
    status: JobStatus,
    values: dict[str, Any],
    extra: Any = None,
) -> bool:
    query = update(Job).where(Job.id == job_id, Job.status.in_(allowed))
    if extra is not None:
        query = query.where(extra)
    if status not in (JobStatus.running, JobStatus.canceling):  # the attempt is over: so is its hand-off
        ended = "was queued again" if status == JobStatus.queued else f"ended {status.value}"
        values = {**values, **workers.hand_off_closed(f"the job {ended} before its engine build ended")}
    result = session.execute(
        query.values(status=status, updated_at=utcnow(), **values).execution_options(synchronize_session=False)
    )
    done = result.rowcount == 1
    if done and status in TERMINAL_STATUSES:
        # Every way a job ends (worker, reaper, cancel while queued, attempts used up) passes here,
        # so the webhook message is written in the very transaction that makes the job terminal.
        record_job_end(session=session, job_id=job_id, status=status)
    return done


# Events ---------------------------------------------------------------------------------------


def add_event(
    *,
    session: Session,
    job_id: uuid.UUID,
    kind: str,
    message: str = "",
    stage: str | None = None,
    progress: float | None = None,
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
    sequence: int | None = None,
    created_at: datetime | None = None,
) -> None:
    """Append an event (at `created_at`, default now). With `attempt` and `sequence` (a worker's n-th event
    of its attempt) adding the same event again does nothing (INSERT ... ON CONFLICT DO NOTHING on
    PostgreSQL and SQLite), so a unit of work retried by `jobs.db.in_transaction` after a COMMIT that did
    land adds no duplicate."""
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    session.execute(
        insert(JobEvent)
        .values(
            job_id=job_id,
            kind=kind,
            stage=stage,
            progress=progress,
            message=message,
            data=data,
            attempt=attempt,
            sequence=sequence,
            created_at=created_at or utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["job_id", "attempt", "sequence"])
    )


def event_recorded(*, session: Session, job_id: uuid.UUID, attempt: int | None, sequence: int | None) -> bool:
    """Whether the worker's event `sequence` of `attempt` is already stored (never for unnumbered events)."""
    if attempt is None or sequence is None:
        return False
    stored = select(JobEvent.id).where(
        JobEvent.job_id == job_id, JobEvent.attempt == attempt, JobEvent.sequence == sequence
    )
    return session.scalar(stored) is not None


def events_after(*, session: Session, job_id: uuid.UUID, after_id: int, limit: int = 500) -> Sequence[JobEvent]:
    return session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id).order_by(JobEvent.id).limit(limit)
    ).all()


# Artifacts ------------------------------------------------------------------------------------


def add_artifact(
    *, session: Session, job_id: uuid.UUID, name: str, media_type: str, path: str, size_bytes: int, sha256: str
) -> Artifact:
    existing = session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))
    if existing is not None:  # a retried attempt replaces what an earlier one recorded
        session.delete(existing)
        session.flush()
    artifact = Artifact(
        job_id=job_id, name=name, media_type=media_type, path=path, size_bytes=size_bytes, sha256=sha256
    )
    session.add(artifact)
    session.flush()
    return artifact


def list_artifacts(*, session: Session, job_id: uuid.UUID) -> Sequence[Artifact]:
    return session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.name)).all()


def artifacts_by_job(*, session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[Artifact]]:
    """Every artifact of the given jobs in one query, by job id (jobs without any map to [])."""
    found: dict[uuid.UUID, list[Artifact]] = {job_id: [] for job_id in job_ids}
    if job_ids:
        rows = session.scalars(select(Artifact).where(Artifact.job_id.in_(job_ids)).order_by(Artifact.name))
        for artifact in rows:
            found[artifact.job_id].append(artifact)
    return found


def get_artifact(*, session: Session, job_id: uuid.UUID, name: str) -> Artifact | None:
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))
