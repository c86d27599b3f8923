"""Per-project quotas: storage bytes and concurrent jobs.

    storage used     = Σ models.size_bytes + Σ datasets.size_bytes + Σ artifacts.size_bytes (the project's)
    concurrent used  = #jobs in queued | running | canceling
    limit            = the project's own column when set, else the settings' default

A request that would go past a limit raises `QuotaExceeded` (the API answers 413 for storage, 429 for
jobs, naming the quota, its limit and the current use). Checks that must hold under concurrency run
after `lock_project`, which serializes them per project: a no-op UPDATE of the project row takes its
row lock on PostgreSQL and the database write lock on SQLite, until the caller's transaction ends.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jobs.config import Settings
from jobs.keys import KeyProject
from jobs.models import Artifact, Dataset, Job, JobStatus, Model, Project

STORAGE = "storage_bytes"
CONCURRENT_JOBS = "concurrent_jobs"
ACTIVE_STATUSES = (JobStatus.queued, JobStatus.running, JobStatus.canceling)


@dataclass(frozen=True)
class QuotaUse:
    quota: str  # STORAGE | CONCURRENT_JOBS
    limit: int
    used: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


class QuotaExceeded(Exception):
    def __init__(self, use: QuotaUse, requested: int) -> None:
        unit = " bytes" if use.quota == STORAGE else ""
        super().__init__(
            f"quota {use.quota} exceeded: {use.used}{unit} used of {use.limit}{unit}, "
            f"this request needs {requested}{unit} more"
        )
        self.use = use
        self.requested = requested


def lock_project(*, session: Session, project_id: uuid.UUID) -> None:
    """Serialize quota checks of one project until the transaction ends (see the module docstring)."""
    session.execute(
        update(Project)
        .where(Project.id == project_id)
        .values(name=Project.name)
        .execution_options(synchronize_session=False)
    )


def storage_use(*, session: Session, project: Project | KeyProject, settings: Settings) -> QuotaUse:
    models = select(func.coalesce(func.sum(Model.size_bytes), 0)).where(Model.project_id == project.id)
    datasets = select(func.coalesce(func.sum(Dataset.size_bytes), 0)).where(Dataset.project_id == project.id)
    artifacts = (
        select(func.coalesce(func.sum(Artifact.size_bytes), 0))
        .join(Job, Job.id == Artifact.job_id)
        .where(Job.project_id == project.id)
    )
    used = sum(int(session.scalar(query) or 0) for query in (models, datasets, artifacts))
    limit = project.max_storage_bytes if project.max_storage_bytes is not None else settings.quota_storage_bytes
    return QuotaUse(STORAGE, limit, used)


def concurrent_jobs_use(*, session: Session, project: Project | KeyProject, settings: Settings) -> QuotaUse:
    used = session.scalar(
        select(func.count()).select_from(Job).where(Job.project_id == project.id, Job.status.in_(ACTIVE_STATUSES))
    )
    limit = project.max_concurrent_jobs if project.max_concurrent_jobs is not None else settings.quota_concurrent_jobs
    return QuotaUse(CONCURRENT_JOBS, limit, int(used or 0))


def reserve_storage(*, session: Session, project: Project | KeyProject, settings: Settings, size_bytes: int) -> None:
    """Raise QuotaExceeded unless `size_bytes` more still fit; call before inserting the row."""
    lock_project(session=session, project_id=project.id)
    use = storage_use(session=session, project=project, settings=settings)
    if use.used + size_bytes > use.limit:
        raise QuotaExceeded(use, size_bytes)


def reserve_job_slot(*, session: Session, project: Project | KeyProject, settings: Settings) -> None:
    """Raise QuotaExceeded when the project may not start one more job (slots or storage used up)."""
    lock_project(session=session, project_id=project.id)
    jobs = concurrent_jobs_use(session=session, project=project, settings=settings)
    if jobs.used + 1 > jobs.limit:
        raise QuotaExceeded(jobs, 1)
    storage = storage_use(session=session, project=project, settings=settings)
    if storage.remaining == 0:  # its artifacts would not fit
        raise QuotaExceeded(storage, 1)
