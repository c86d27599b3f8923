"""Queries for the worker registry and the TensorRT engine hand-off (keyword-only, like `jobs.queries`).

Registry: every worker node upserts its row at start (`register_worker`), refreshes `heartbeat_at`
(`touch_worker`) and deletes it at shutdown (`remove_worker`). `engine_workers` lists the live ones that
can build engines.

Hand-off, one job row carries it (columns ``engine_*``):

    request_engine (runner, engine_status := queued, a fresh engine_request id)
      └─ claim_engine (engine worker: queued → running, only for the current request id)
           └─ finish_engine (engine worker: running → built | skipped | failed, same request id)
    end_engine (runner: queued | running → skipped/failed when it stops waiting; the late task then
                finds its request no longer current and does nothing)
    hand_off_closed (`jobs.queries`: a job leaving its attempt, whatever the runner did, retires the
                request and ends a stage still queued | running as skipped, in the same UPDATE)
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import case, delete, select, update
from sqlalchemy.orm import Session

from jobs.models import Job, JobStatus, Worker, utcnow

ENGINE_WAITING = ("queued", "running")
ENGINE_ENDED = ("built", "skipped", "failed")


# Registry -------------------------------------------------------------------------------------


def register_worker(
    *,
    session: Session,
    name: str,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    engine_capable: bool,
    reason: str | None,
    capabilities: dict[str, Any] | None,
) -> Worker:
    """Insert or replace the row of node `name` (a restarted node replaces its predecessor's row)."""
    gpu = (capabilities or {}).get("gpu") or {}
    row = session.get(Worker, name) or Worker(name=name)
    row.hostname, row.pid, row.queues = hostname, pid, list(queues)
    row.engine_capable, row.reason, row.capabilities = engine_capable, reason, capabilities
    row.gpu_name, row.compute_capability = gpu.get("name"), gpu.get("compute_capability")
    row.tensorrt_version = (capabilities or {}).get("tensorrt_version")
    row.started_at = row.heartbeat_at = utcnow()
    session.add(row)
    session.flush()
    return row


def touch_worker(*, session: Session, name: str, pid: int) -> bool:
    """Refresh the heartbeat; False when the row is gone or belongs to another process (re-register)."""
    result = session.execute(
        update(Worker)
        .where(Worker.name == name, Worker.pid == pid)
        .values(heartbeat_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def remove_worker(*, session: Session, name: str, pid: int) -> None:
    session.execute(delete(Worker).where(Worker.name == name, Worker.pid == pid))


def get_worker(*, session: Session, name: str, timeout: float) -> Worker | None:
    """Node `name` if it is registered and its heartbeat is younger than `timeout` seconds."""
    stale = utcnow() - timedelta(seconds=timeout)
    return session.scalar(select(Worker).where(Worker.name == name, Worker.heartbeat_at >= stale))


def engine_workers(*, session: Session, timeout: float) -> Sequence[Worker]:
    """Live workers that can build TensorRT engines (heartbeat younger than `timeout` seconds)."""
    stale = utcnow() - timedelta(seconds=timeout)
    return session.scalars(
        select(Worker).where(Worker.engine_capable.is_(True), Worker.heartbeat_at >= stale).order_by(Worker.name)
    ).all()


# Engine hand-off ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineState:
    status: str | None
    reason: str | None
    worker: str | None
    request: uuid.UUID | None
    job_status: JobStatus
    cancel_requested: bool


def engine_state(*, session: Session, job_id: uuid.UUID) -> EngineState | None:
    row = session.execute(
        select(
            Job.engine_status,
            Job.engine_reason,
            Job.engine_worker,
            Job.engine_request,
            Job.status,
            Job.cancel_requested,
        ).where(Job.id == job_id)
    ).one_or_none()
    return None if row is None else EngineState(*row)


def record_engine(
    *,
    session: Session,
    job_id: uuid.UUID,
    status: str,
    reason: str | None,
    worker: str | None = None,
    gpu: str | None = None,
    tensorrt_version: str | None = None,
) -> None:
    """Record an engine stage decided where the job runs (built locally, or skipped without a hand-off)."""
    assert status in ENGINE_ENDED
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(
            engine_status=status,
            engine_reason=reason,
            engine_worker=worker,
            engine_gpu=gpu,
            engine_tensorrt_version=tensorrt_version,
            engine_request=None,
        )
        .execution_options(synchronize_session=False)
    )


def request_engine(*, session: Session, job_id: uuid.UUID, owner: str) -> uuid.UUID | None:
    """Open a hand-off for the job that `owner` runs; returns its request id (None: no longer ours)."""
    request = uuid.uuid4()
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.claimed_by == owner, Job.status == JobStatus.running)
        .values(
            engine_status="queued",
            engine_reason=None,
            engine_worker=None,
            engine_gpu=None,
            engine_tensorrt_version=None,
            engine_request=request,
        )
        .execution_options(synchronize_session=False)
    )
    return request if result.rowcount == 1 else None


def claim_engine(
    *,
    session: Session,
    job_id: uuid.UUID,
    request: uuid.UUID,
    worker: str,
    gpu: str | None,
    tensorrt_version: str | None,
) -> bool:
    """The engine worker takes the hand-off: queued → running, only while `request` is current."""
    result = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.engine_request == request,
            Job.engine_status == "queued",
            Job.status == JobStatus.running,
            Job.cancel_requested.is_(False),
        )
        .values(engine_status="running", engine_worker=worker, engine_gpu=gpu, engine_tensorrt_version=tensorrt_version)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def finish_engine(
    *,
    session: Session,
    job_id: uuid.UUID,
    request: uuid.UUID,
    status: str,
    reason: str | None,
    gpu: str | None,
    tensorrt_version: str | None,
) -> bool:
    """The engine worker reports: running → built | skipped | failed; False when the runner gave up."""
    assert status in ENGINE_ENDED
    values: dict[str, Any] = {"engine_status": status, "engine_reason": reason}
    if gpu is not None:  # what the build itself measured beats what the registration said
        values["engine_gpu"] = gpu
    if tensorrt_version is not None:
        values["engine_tensorrt_version"] = tensorrt_version
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.engine_request == request, Job.engine_status == "running")
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def hand_off_closed(reason: str) -> dict[str, Any]:
    """UPDATE values that retire the job's hand-off: the engine worker can no longer claim it or report
    on it, and its build stops at its next check; a stage still queued or running ends ``skipped`` with
    `reason`, an ended one keeps what it says. For every change that takes a job out of its attempt, so
    no path (release, soft time limit, reaper, a takeover after a crash) leaves a hand-off open."""
    waiting = Job.engine_status.in_(ENGINE_WAITING)
    return {
        "engine_status": case((waiting, "skipped"), else_=Job.engine_status),
        "engine_reason": case((waiting, reason), else_=Job.engine_reason),
        "engine_request": None,
    }


def end_engine(*, session: Session, job_id: uuid.UUID, request: uuid.UUID, status: str, reason: str) -> bool:
    """The runner stops waiting for hand-off `request` (timeout, cancel, engine worker gone); False when the
    engine worker finished first (the caller then reads its result)."""
    assert status in ENGINE_ENDED
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.engine_request == request, Job.engine_status.in_(ENGINE_WAITING))
        .values(engine_status=status, engine_reason=reason)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1
