"""`/datasets`: upload calibration/evaluation data: an `.npz` of arrays named after model inputs, or a
zip of JPEG/PNG images (optionally one folder per class, or a `labels.csv`)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import CeleryDep, ProjectDep, SessionDep, SettingsDep
from api.pagination import CursorQuery, LimitQuery, page
from api.problems import Problem
from api.schemas import DatasetPublic, Page
from api.uploads import UPLOAD_BODY, ReuseQuery, Upload, receive_upload, storage_quota, stored_copy
from api.verdicts import wait_for_verdict
from jobs import storage, uploaded
from jobs.archives import InvalidImageArchive, archive_limits, inspect_image_zip, is_image_zip
from jobs.config import Settings
from jobs.db import session_scope
from jobs.keys import KeyProject
from jobs.models import Dataset, DatasetKind, DatasetStatus
from jobs.npz import InvalidArchive, inspect_npz, npz_limits
from jobs.queue import enqueue_dataset_validation
from jobs.quotas import reserve_storage
from jobs.storage import open_store

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.post(
    "",
    status_code=201,
    response_model=DatasetPublic,
    openapi_extra=UPLOAD_BODY,
    responses={
        200: {
            "model": DatasetPublic,
            "description": "The project already held these bytes (same SHA-256): that dataset, "
            "nothing stored and no quota charged (`?reuse=false` stores a copy).",
        },
        202: {"model": DatasetPublic, "description": "Images stored; decoding still running (poll it)."},
    },
    summary="Upload a dataset",
)
async def upload_dataset(
    request: Request,
    response: Response,
    settings: SettingsDep,
    project: ProjectDep,
    celery: CeleryDep,
    reuse: ReuseQuery = True,
) -> Dataset:
    """Either an `.npz` whose arrays are named after the model's inputs, samples along each input's
    batch axis (`batch_axis` in the model's info: usually the first; a constant input such as a scalar
    sample rate is the value itself), other arrays (e.g. `labels`, one integer per sample) riding
    along; object arrays are refused (they would unpickle). A job checks the arrays against its model.

    Or a zip of `.jpg`/`.jpeg`/`.png` images: in one folder per class (labels = sorted folder names →
    0, 1, ...), or with a top-level `labels.csv` of `file,label` rows, or unlabelled. Its listing is
    checked here (no absolute or `..` names, no symlinks, caps on members, size per image and in all,
    compression ratio); then a worker decodes every image, and a corrupt one is answered with 422
    naming it. Jobs on image datasets need `recipe.preprocessing`. The same bytes uploaded again are
    answered with the dataset that holds them (200; see `reuse`)."""
    room = await storage_quota(settings, project, reusable=Dataset if reuse else None)
    upload = await receive_upload(
        request,
        store=open_store(settings),
        limit=settings.max_dataset_bytes,
        fallback_name="data.npz",
        quota=room,
    )
    if (existing := await stored_copy(settings, project, upload, room, Dataset)) is not None:
        response.status_code = 200
        return existing
    try:
        dataset = await run_in_threadpool(_store, settings, project, upload)
    except BaseException:
        await upload.abort()
        raise
    if dataset.kind == DatasetKind.arrays:
        return dataset
    try:
        enqueue_dataset_validation(celery, dataset.id)
    except BaseException:
        await run_in_threadpool(_discard, settings, dataset.id, dataset.path)
        raise
    dataset = await wait_for_verdict(settings, lambda: _load(settings, dataset.id))
    if dataset.status == DatasetStatus.invalid:
        await run_in_threadpool(_discard, settings, dataset.id, dataset.path)
        raise Problem(422, f"not a usable image dataset: {dataset.error}", slug="invalid-dataset")
    if dataset.status == DatasetStatus.pending:
        response.status_code = 202
    return dataset


def _store(settings: Settings, project: KeyProject, upload: Upload) -> Dataset:
    """Check the archive's listing, commit the upload under its key and record it."""
    dataset_id = uuid.uuid4()
    project_id = project.id
    fields: dict = {"kind": DatasetKind.arrays}
    stored_bytes = upload.size_bytes
    try:
        if upload.filename.lower().endswith(".zip") or is_image_zip(upload.path, max_files=settings.max_dataset_images):
            listing = inspect_image_zip(upload.path, limits=archive_limits(settings))
            relative = storage.image_archive_path(project_id, dataset_id)
            fields = {
                "kind": DatasetKind.images,
                "arrays": [],
                "num_samples": len(listing.files),
                "images": listing.summary(),
            }
        else:
            listing = inspect_npz(upload.path, limits=npz_limits(settings))
            relative = storage.dataset_path(project_id, dataset_id)
            fields.update(arrays=listing.arrays, num_samples=listing.num_samples)
            # A job's worker holds the arrays decompressed: a compressed .npz counts at that size.
            stored_bytes = max(upload.size_bytes, listing.expanded_bytes)
    except (InvalidArchive, InvalidImageArchive) as exc:
        raise Problem(422, f"not a usable dataset: {exc}", slug="invalid-dataset") from exc
    upload.staged.commit(relative)
    try:
        with session_scope(settings.resolved_database_url) as session:
            reserve_storage(session=session, project=project, settings=settings, size_bytes=stored_bytes)
            return uploaded.create_dataset(
                session=session,
                project_id=project_id,
                dataset_id=dataset_id,
                filename=upload.filename,
                sha256=upload.sha256,
                size_bytes=stored_bytes,
                path=relative,
                **fields,
            )
    except BaseException:
        open_store(settings).delete_prefix(storage.folder(relative))
        raise


def _load(settings: Settings, dataset_id: uuid.UUID) -> Dataset:
    with session_scope(settings.resolved_database_url) as session:
        dataset = uploaded.get_dataset_unscoped(session=session, dataset_id=dataset_id)
        assert dataset is not None
        return dataset


def _discard(settings: Settings, dataset_id: uuid.UUID, relative: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        dataset = uploaded.get_dataset_unscoped(session=session, dataset_id=dataset_id)
        if dataset is not None:
            uploaded.delete_dataset(session=session, dataset=dataset)
    open_store(settings).delete_prefix(storage.folder(relative))


@router.get("", response_model=Page[DatasetPublic], summary="List the project's datasets, newest first")
def list_datasets(session: SessionDep, project: ProjectDep, limit: LimitQuery = 50, cursor: CursorQuery = None) -> dict:
    return page(uploaded.list_datasets, session=session, project_id=project.id, limit=limit, cursor=cursor)


@router.get("/{dataset_id}", response_model=DatasetPublic, summary="Read one dataset")
def read_dataset(session: SessionDep, project: ProjectDep, dataset_id: uuid.UUID) -> Dataset:
    dataset = uploaded.get_dataset(session=session, project_id=project.id, dataset_id=dataset_id)
    if dataset is None:
        raise Problem(404, f"dataset {dataset_id} not found", slug="dataset-not-found")
    return dataset
