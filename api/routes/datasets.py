"""`/datasets`: upload calibration/evaluation data as `.npz` of arrays named after model inputs."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.deps import ProjectDep, SessionDep, SettingsDep
from api.pagination import CursorQuery, LimitQuery, page
from api.problems import Problem
from api.schemas import DatasetPublic, Page
from api.uploads import UPLOAD_BODY, Upload, receive_upload, storage_quota
from jobs import queries, storage
from jobs.config import Settings
from jobs.db import session_scope
from jobs.models import Dataset, Project
from jobs.npz import InvalidArchive, inspect_npz
from jobs.quotas import reserve_storage

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetPublic, openapi_extra=UPLOAD_BODY, summary="Upload a dataset")
async def upload_dataset(request: Request, settings: SettingsDep, project: ProjectDep) -> Dataset:
    """An `.npz` whose arrays are named after the model's inputs, first axis = samples; other
    arrays (e.g. `labels`) may ride along. Object arrays are refused (they would unpickle)."""
    upload = await receive_upload(
        request,
        directory=settings.artifact_root / ".uploads",
        limit=settings.max_dataset_bytes,
        fallback_name="data.npz",
        quota=await storage_quota(settings, project),
    )
    try:
        return await run_in_threadpool(_store, settings, project, upload)
    finally:
        upload.path.unlink(missing_ok=True)  # moved into place on success, discarded otherwise


def _store(settings: Settings, project: Project, upload: Upload) -> Dataset:
    try:
        arrays, num_samples = inspect_npz(upload.path, max_arrays=settings.max_dataset_arrays)
    except InvalidArchive as exc:
        raise Problem(422, f"not a usable dataset: {exc}", slug="invalid-dataset") from exc
    dataset_id = uuid.uuid4()
    project_id = project.id
    relative = storage.dataset_path(project_id, dataset_id)
    target = storage.resolve(settings.artifact_root, relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    upload.path.replace(target)
    try:
        with session_scope(settings.resolved_database_url) as session:
            reserve_storage(session=session, project=project, settings=settings, size_bytes=upload.size_bytes)
            return queries.create_dataset(
                session=session,
                project_id=project_id,
                dataset_id=dataset_id,
                filename=upload.filename,
                sha256=upload.sha256,
                size_bytes=upload.size_bytes,
                path=relative,
                arrays=arrays,
                num_samples=num_samples,
            )
    except BaseException:
        storage.remove_tree(settings.artifact_root, relative.rsplit("/", 1)[0])
        raise


@router.get("", response_model=Page[DatasetPublic], summary="List the project's datasets, newest first")
def list_datasets(session: SessionDep, project: ProjectDep, limit: LimitQuery = 50, cursor: CursorQuery = None) -> dict:
    return page(queries.list_datasets, session=session, project_id=project.id, limit=limit, cursor=cursor)


@router.get("/{dataset_id}", response_model=DatasetPublic, summary="Read one dataset")
def read_dataset(session: SessionDep, project: ProjectDep, dataset_id: uuid.UUID) -> Dataset:
    dataset = queries.get_dataset(session=session, project_id=project.id, dataset_id=dataset_id)
    if dataset is None:
        raise Problem(404, f"dataset {dataset_id} not found", slug="dataset-not-found")
    return dataset
