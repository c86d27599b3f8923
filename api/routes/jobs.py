"""`/jobs`: create with a recipe, list, read, cancel, follow events, read the report and artifacts."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse

from api.bodies import JsonBody
from api.deps import CeleryDep, ProjectDep, SessionDep, SettingsDep
from api.downloads import ArtifactResponse, StoredArtifactResponse
from api.events import stream_events
from api.pagination import CursorQuery, LimitQuery, page
from api.problems import Problem
from api.routes.webhooks import check_target
from api.schemas import ArtifactPublic, JobCreate, JobCreated, JobPublic, Page
from jobs import job_reads, queries, uploaded
from jobs.models import DatasetStatus, Job, JobStatus, ModelStatus
from jobs.preprocessing import job_input_mismatches
from jobs.queue import enqueue_job
from jobs.quotas import reserve_job_slot
from jobs.report_schema import Report
from jobs.storage import open_store

router = APIRouter(prefix="/jobs", tags=["jobs"])
log = logging.getLogger(__name__)
# The two reads a dashboard polls, serialized in the route (api.bodies) from rows (jobs.job_reads).
_JOB_BODY = JsonBody(JobPublic)
_JOB_PAGE_BODY = JsonBody(Page[JobPublic])


def _job_not_found(job_id: uuid.UUID) -> Problem:
    return Problem(404, f"job {job_id} not found", slug="job-not-found")


def _job_or_404(session: SessionDep, project: ProjectDep, job_id: uuid.UUID) -> Job:
    job = queries.get_job(session=session, project_id=project.id, job_id=job_id)
    if job is None:
        raise _job_not_found(job_id)
    return job


@router.post(
    "",
    status_code=202,
    response_model=JobCreated,
    summary="Create a quantization job",
    responses={503: {"description": "The job queue is unreachable; the job was not started"}},
)
def create_job(
    body: JobCreate, session: SessionDep, project: ProjectDep, settings: SettingsDep, celery: CeleryDep
) -> Job:
    """Validates the recipe and that the dataset fits the model, commits the job, then queues it.

    With `webhook_url`, the response carries `webhook_secret` (once) for verifying that webhook."""
    webhook_url = str(body.webhook_url) if body.webhook_url else None
    if webhook_url:
        check_target(webhook_url, settings, "webhook_url")
    model = uploaded.get_model(session=session, project_id=project.id, model_id=body.model_id)
    if model is None:
        raise Problem(
            404,
            f"model_id: model {body.model_id} not found",
            slug="model-not-found",
            errors=[{"field": "model_id", "message": "not found"}],
        )
    if model.status != ModelStatus.ready:
        raise Problem(
            409,
            f"model_id: model {model.id} is {model.status.value}, not ready",
            slug="model-not-ready",
            errors=[{"field": "model_id", "message": f"model is {model.status.value}"}],
        )
    dataset = uploaded.get_dataset(session=session, project_id=project.id, dataset_id=body.dataset_id)
    if dataset is None:
        raise Problem(
            404,
            f"dataset_id: dataset {body.dataset_id} not found",
            slug="dataset-not-found",
            errors=[{"field": "dataset_id", "message": "not found"}],
        )
    if dataset.status != DatasetStatus.ready:
        raise Problem(
            409,
            f"dataset_id: dataset {dataset.id} is {dataset.status.value}, not ready",
            slug="dataset-not-ready",
            errors=[{"field": "dataset_id", "message": f"dataset is {dataset.status.value}"}],
        )
    problems = job_input_mismatches(
        model.info or {}, dataset=dataset, recipe=body.recipe, max_decoded_bytes=settings.max_decoded_image_bytes
    )
    if problems:
        raise Problem(
            422,
            "dataset does not fit the model: " + "; ".join(f"{field}: {message}" for field, message in problems),
            slug="dataset-mismatch",
            errors=[{"field": field, "message": message} for field, message in problems],
        )
    reserve_job_slot(session=session, project=project, settings=settings)  # 429 / 413 naming the quota
    job = queries.create_job(
        session=session,
        project_id=project.id,
        model_id=model.id,
        dataset_id=dataset.id,
        recipe=body.recipe.model_dump(mode="json"),
        webhook_url=webhook_url,
    )
    session.commit()
    try:
        enqueue_job(celery, job.id)
    except Exception as exc:
        log.exception("could not enqueue job %s", job.id)
        queries.request_cancel(session=session, job=job)
        session.commit()
        raise Problem(
            503,
            f"the job queue is unreachable ({type(exc).__name__}); the job was not started",
            slug="queue-unavailable",
        ) from exc
    return job


@router.get("", response_model=Page[JobPublic], summary="List jobs, newest first")
def list_jobs(
    session: SessionDep,
    project: ProjectDep,
    status: JobStatus | None = None,
    limit: LimitQuery = 50,
    cursor: CursorQuery = None,
) -> Response:
    jobs = page(
        job_reads.list_public_jobs, session=session, project_id=project.id, status=status, limit=limit, cursor=cursor
    )
    return _JOB_PAGE_BODY(jobs)


@router.get("/{job_id}", response_model=JobPublic, summary="Read a job: status, stage, progress, error")
def read_job(session: SessionDep, project: ProjectDep, job_id: uuid.UUID) -> Response:
    job = job_reads.get_public_job(session=session, project_id=project.id, job_id=job_id)
    if job is None:
        raise _job_not_found(job_id)
    return _JOB_BODY(job)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic, summary="Cancel a job")
def cancel_job(session: SessionDep, project: ProjectDep, job_id: uuid.UUID) -> Job:
    """A queued job is canceled at once; a running one stops at its next check (status `canceling`)."""
    job = _job_or_404(session, project, job_id)
    if job.status.terminal:
        raise Problem(409, f"job {job_id} already ended ({job.status.value})", slug="job-ended")
    return queries.request_cancel(session=session, job=job)


@router.get(
    "/{job_id}/events",
    summary="Follow a job as Server-Sent Events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "status, stage, progress and log events"}},
)
def job_events(
    session: SessionDep,
    project: ProjectDep,
    settings: SettingsDep,
    job_id: uuid.UUID,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0, description="Resume after this event id (as Last-Event-ID).")] = None,
) -> StreamingResponse:
    """Each event carries `id:` (resume with `Last-Event-ID`), `event:` (status | stage | progress |
    log) and a JSON `data:` line. The stream closes after the job's terminal status event."""
    job = _job_or_404(session, project, job_id)
    start = after or 0
    if last_event_id:
        if not last_event_id.isdigit():
            raise Problem(400, "Last-Event-ID must be an event id this stream sent", slug="invalid-last-event-id")
        start = int(last_event_id)
    return StreamingResponse(
        stream_events(settings.resolved_database_url, job.id, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/{job_id}/report", response_model=Report, summary="The job's accuracy report (JSON)")
def read_report(session: SessionDep, project: ProjectDep, settings: SettingsDep, job_id: uuid.UUID) -> dict:
    """Per-output metrics, task metrics, the layers ranked by harm, the accuracy target's steps, latency.
    Also stored as the artifacts `report.json` and `report.html` (a standalone page with the per-layer chart)."""
    job = _job_or_404(session, project, job_id)
    artifact = queries.get_artifact(session=session, job_id=job.id, name="report.json")
    if artifact is None:
        raise Problem(404, f"job {job_id} has no report yet (status {job.status.value})", slug="report-not-ready")
    return json.loads(open_store(settings).read_bytes(artifact.path))


@router.get("/{job_id}/artifacts", response_model=list[ArtifactPublic], summary="List the files a job produced")
def list_artifacts(request: Request, session: SessionDep, project: ProjectDep, job_id: uuid.UUID) -> list[dict]:
    job = _job_or_404(session, project, job_id)
    return [
        {
            "name": a.name,
            "media_type": a.media_type,
            "size_bytes": a.size_bytes,
            "sha256": a.sha256,
            "url": str(request.url_for("download_artifact", job_id=job.id, name=a.name).path),
        }
        for a in queries.list_artifacts(session=session, job_id=job.id)
    ]


@router.get(
    "/{job_id}/artifacts/{name}",
    response_class=ArtifactResponse,
    summary="Download one artifact (supports Range)",
    responses={
        200: {"content": {"application/octet-stream": {}}},
        206: {"description": "Partial content"},
        307: {"description": "QUANT_STORAGE_PRESIGN: a short-lived URL of the object store serves it"},
    },
)
def download_artifact(
    session: SessionDep, project: ProjectDep, settings: SettingsDep, job_id: uuid.UUID, name: str
) -> Response:
    job = _job_or_404(session, project, job_id)
    artifact = queries.get_artifact(session=session, job_id=job.id, name=name)
    if artifact is None:
        raise Problem(404, f"job {job_id} has no artifact named '{name}'", slug="artifact-not-found")
    store = open_store(settings)
    fields = {"media_type": artifact.media_type, "filename": artifact.name, "headers": {"ETag": f'"{artifact.sha256}"'}}
    if (path := store.local_path(artifact.path)) is not None:
        return ArtifactResponse(path, **fields)
    if settings.storage_presign:
        url = store.presign(
            artifact.path,
            seconds=settings.storage_presign_seconds,
            filename=artifact.name,
            media_type=artifact.media_type,
        )
        return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
    return StoredArtifactResponse(
        store, artifact.path, size=artifact.size_bytes, modified=artifact.created_at.timestamp(), **fields
    )
