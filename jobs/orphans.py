"""Which stored objects no row needs any more: the sweep's question (`worker.sweep`), answered from SQL.

An object under `<project>/models/<id>/` or `<project>/datasets/<id>/` belongs to its row while the
row exists. One under `<project>/jobs/<id>/` belongs to a job that has not ended (its staged
artifacts), or is an artifact a row names. Anything under `.uploads/` is an upload in flight. The
caller only asks about objects older than the grace period, so an object being stored and recorded
right now is never taken for an orphan.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.models import Artifact, Dataset, Job, JobStatus, Model

TERMINAL = (JobStatus.succeeded, JobStatus.failed, JobStatus.canceled)
KINDS = {"models": Model, "datasets": Dataset, "jobs": Job}


def _owner(key: str) -> tuple[str, uuid.UUID] | None:
    parts = key.split("/")
    if len(parts) < 4 or parts[1] not in KINDS:
        return None  # not a layout this service writes (`.uploads/`, a local store's `.work/`): left alone
    try:
        return parts[1], uuid.UUID(parts[2])
    except ValueError:
        return None


def orphaned(*, session: Session, keys: Iterable[str]) -> list[str]:
    """The keys among `keys` that no model, dataset, unfinished job or artifact row needs."""
    owners = {key: owner for key in keys if (owner := _owner(key)) is not None}
    ids = {kind: {id_ for k, id_ in owners.values() if k == kind} for kind in KINDS}
    alive = {
        kind: set(session.scalars(select(entity.id).where(entity.id.in_(ids[kind])))) if ids[kind] else set()
        for kind, entity in KINDS.items()
    }
    ended = set()
    named: set[str] = set()
    if ids["jobs"]:
        ended = set(session.scalars(select(Job.id).where(Job.id.in_(ids["jobs"]), Job.status.in_(TERMINAL))))
        named = set(session.scalars(select(Artifact.path).where(Artifact.job_id.in_(ids["jobs"]))))
    return [
        key
        for key, (kind, id_) in owners.items()
        if id_ not in alive[kind] or (kind == "jobs" and id_ in ended and key not in named)
    ]
