"""`GET /models/{id}/comparison`: every job of one model side by side, so a user can pick between
platforms, precisions and calibration methods.

The figures come from each job's stored report.json (`jobs.summary`), read when asked rather than
copied onto the job row at completion: the report is the one source of truth (a report format that
gains a figure shows it for old jobs too), and no migration or worker change is needed. A report
file is immutable once stored (its SHA-256 is on the artifact row), so summaries are cached by
(path, SHA-256) and each report is parsed once per API process. Pages hold at most 50 jobs, which
bounds the work of one request.
"""

from __future__ import annotations

import json
import uuid
from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from api.deps import ProjectDep, SessionDep, SettingsDep
from api.pagination import CursorQuery, page
from api.problems import Problem
from api.schemas import ModelComparison
from jobs import queries, uploaded
from jobs.models import Artifact, Job
from jobs.storage import Store, open_store
from jobs.summary import recipe_summary, report_summary

router = APIRouter(prefix="/models", tags=["models"])
REPORT = "report.json"
ComparisonLimit = Annotated[int, Query(ge=1, le=50, description="Jobs per page (at most 50: each has a report).")]


@lru_cache(maxsize=2048)
def _summary(store: Store, key: str, sha256: str) -> dict[str, Any] | None:
    try:
        report = json.loads(store.read_bytes(key))
    except (OSError, ValueError):
        return None  # a missing or unreadable report shows as "no figures", not as a failed page
    return report_summary(report) if isinstance(report, dict) else None


def _row(request: Request, store: Store, job: Job, artifacts: list[Artifact]) -> dict[str, Any]:
    report = next((a for a in artifacts if a.name == REPORT), None)
    summary = _summary(store, report.path, report.sha256) if report is not None else None
    return {
        "job_id": job.id,
        "status": job.status,
        "error": job.error,
        "dataset_id": job.dataset_id,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "recipe": recipe_summary(job.recipe),
        **(summary or {"metrics": None, "size": None, "latency": None}),
        "artifacts": [
            {
                "name": a.name,
                "media_type": a.media_type,
                "size_bytes": a.size_bytes,
                "sha256": a.sha256,
                "url": request.url_for("download_artifact", job_id=job.id, name=a.name).path,
            }
            for a in artifacts
        ],
        "report_url": request.url_for("read_report", job_id=job.id).path if report is not None else None,
    }


@router.get(
    "/{model_id}/comparison",
    response_model=ModelComparison,
    summary="Compare every job of one model: recipe, accuracy, size, latency, artifacts",
)
def compare_jobs(
    request: Request,
    session: SessionDep,
    project: ProjectDep,
    settings: SettingsDep,
    model_id: uuid.UUID,
    limit: ComparisonLimit = 20,
    cursor: CursorQuery = None,
) -> dict[str, Any]:
    """Newest job first. Accuracy figures are those of the exact QDQ model on the held-out samples
    (top-1 when the dataset has labels); latency is the CPU EP median at batch 1. Figures a job has not
    measured (not finished, failed, switched off in its recipe) are null."""
    model = uploaded.get_model(session=session, project_id=project.id, model_id=model_id)
    if model is None:
        raise Problem(404, f"model {model_id} not found", slug="model-not-found")
    jobs = page(
        queries.list_jobs,
        session=session,
        project_id=project.id,
        model_id=model.id,
        status=None,
        limit=limit,
        cursor=cursor,
    )
    artifacts = queries.artifacts_by_job(session=session, job_ids=[job.id for job in jobs["items"]])
    store = open_store(settings)
    return {
        "model_id": model.id,
        "filename": model.filename,
        "size_bytes": model.size_bytes,
        "items": [_row(request, store, job, artifacts[job.id]) for job in jobs["items"]],
        "next_cursor": jobs["next_cursor"],
    }
