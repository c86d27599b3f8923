"""Jobs as a client is shown them: the public columns as plain rows, for the API's hottest reads.

`GET /jobs/{id}` and `GET /jobs` (bench.load's whole GET load) only serialize what they read, so they
select just the columns `api.schemas.JobPublic` shows, on the table rather than the ORM class: no
`Job` objects are built, tracked in the session and then read back attribute by attribute. Their
statements are built once, values bound at execution (building a select and its cache key took a
list request about 7 % of its CPU). Beyond the session's fixed cost (checkout, pre-ping, commit), a
page of 20 fell from 0.49 to 0.15 ms of CPU, one job from 0.14 to 0.07 ms (``bench.request_cpu``). Pages
follow `jobs.cursors` (newest first, keyset on (created_at, id)). Writes and everything that needs a
`Job` object go through `jobs.queries`.
"""

from __future__ import annotations

import functools
import uuid

from sqlalchemy import Row, Select, and_, bindparam, or_, select
from sqlalchemy.orm import Session

from jobs.cursors import cut_page, decode_cursor
from jobs.models import Job, JobStatus

# The fields of api.schemas.JobPublic, in its order (tests/test_api.py holds the two together).
PUBLIC_COLUMNS = (
    "id",
    "model_id",
    "dataset_id",
    "recipe",
    "status",
    "stage",
    "progress",
    "error",
    "attempts",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "webhook_url",
    "engine_status",
    "engine_reason",
    "engine_worker",
    "engine_gpu",
    "engine_tensorrt_version",
)
_jobs = Job.__table__.c
_PUBLIC = [_jobs[name] for name in PUBLIC_COLUMNS]
_BY_ID = select(*_PUBLIC).where(_jobs.id == bindparam("job_id"), _jobs.project_id == bindparam("project_id"))


def get_public_job(*, session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> Row | None:
    """The job's public columns, or None when the project has no such job."""
    return session.execute(_BY_ID, {"job_id": job_id, "project_id": project_id}).first()


@functools.cache
def _page(by_status: bool, after_cursor: bool) -> Select:
    query = select(*_PUBLIC).where(_jobs.project_id == bindparam("project_id"))
    if by_status:
        query = query.where(_jobs.status == bindparam("status"))
    if after_cursor:  # strictly older than the cursor's row
        after = bindparam("after_created_at", type_=_jobs.created_at.type)
        query = query.where(
            or_(_jobs.created_at < after, and_(_jobs.created_at == after, _jobs.id < bindparam("after_id")))
        )
    return query.order_by(_jobs.created_at.desc(), _jobs.id.desc()).limit(bindparam("limit"))


def list_public_jobs(
    *,
    session: Session,
    project_id: uuid.UUID,
    status: JobStatus | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Row], str | None]:
    """A page of the project's jobs, newest first, as rows of the public columns; raises
    `jobs.cursors.InvalidCursor` for a cursor this API did not hand out."""
    values: dict = {"project_id": project_id, "limit": limit + 1}
    if status is not None:
        values["status"] = status
    if cursor:
        values["after_created_at"], values["after_id"] = decode_cursor(cursor)
    rows = session.execute(_page(status is not None, bool(cursor)), values).all()
    return cut_page(rows, limit)
