"""`/models`: upload an ONNX file, wait briefly for its validation task, read models back."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from api.deps import CeleryDep, ProjectDep, SessionDep, SettingsDep
from api.pagination import CursorQuery, LimitQuery, page
from api.problems import Problem
from api.schemas import ModelPublic, Page
from api.uploads import UPLOAD_BODY, ReuseQuery, Upload, receive_upload, storage_quota, stored_copy
from api.verdicts import wait_for_verdict
from jobs import storage, uploaded
from jobs.config import Settings
from jobs.db import session_scope
from jobs.keys import KeyProject
from jobs.model_archives import InvalidModelArchive, inspect_model_zip, is_zip, model_archive_limits
from jobs.models import Model, ModelStatus
from jobs.queue import enqueue_validation
from jobs.quotas import reserve_storage
from jobs.storage import open_store

router = APIRouter(prefix="/models", tags=["models"])


@router.post(
    "",
    status_code=201,
    response_model=ModelPublic,
    openapi_extra=UPLOAD_BODY,
    responses={
        200: {
            "model": ModelPublic,
            "description": "The project already held these bytes (same SHA-256): that model, "
            "nothing stored and no quota charged (`?reuse=false` stores a copy).",
        },
        202: {"model": ModelPublic, "description": "Stored; validation still running (poll the model)."},
    },
    summary="Upload an ONNX model",
)
async def upload_model(
    request: Request,
    response: Response,
    settings: SettingsDep,
    project: ProjectDep,
    celery: CeleryDep,
    reuse: ReuseQuery = True,
) -> Model:
    """Streams the file to the store (size cap, SHA-256 on the fly), then a worker validates it: protobuf
    parse, `onnx.checker`, opset range, external data confined to the upload. An invalid file is
    removed and answered with 422 naming the reason. The file is an ONNX model, or a zip archive of one
    with the external data files it references (its listing is checked here,
    its unpacked size counts against the quota, and the worker unpacks it before validating). The same
    bytes uploaded again are answered with the model that holds them (200; see `reuse`)."""
    store = open_store(settings)
    room = await storage_quota(settings, project, reusable=Model if reuse else None)
    upload = await receive_upload(
        request,
        store=store,
        limit=settings.max_model_bytes,
        fallback_name="model.onnx",
        quota=room,
    )
    if (existing := await stored_copy(settings, project, upload, room, Model)) is not None:
        response.status_code = 200
        return existing
    model_id = uuid.uuid4()
    relative = storage.model_path(project.id, model_id)
    try:
        stored_bytes = await run_in_threadpool(_stored_bytes, settings, upload)
        await upload.commit(relative)
        model = await run_in_threadpool(_create, settings, project, model_id, upload, relative, stored_bytes)
        enqueue_validation(celery, model_id)
    except BaseException:
        await upload.abort()
        await run_in_threadpool(_discard, settings, model_id, relative)
        raise
    model = await wait_for_verdict(settings, lambda: _load(settings, model_id))
    if model.status == ModelStatus.invalid:
        await run_in_threadpool(_discard, settings, model_id, relative)
        raise Problem(422, f"not a usable ONNX model: {model.error}", slug="invalid-model")
    if model.status == ModelStatus.pending:
        response.status_code = 202
    return model


@router.get("", response_model=Page[ModelPublic], summary="List the project's models, newest first")
def list_models(session: SessionDep, project: ProjectDep, limit: LimitQuery = 50, cursor: CursorQuery = None) -> dict:
    return page(uploaded.list_models, session=session, project_id=project.id, limit=limit, cursor=cursor)


@router.get("/{model_id}", response_model=ModelPublic, summary="Read one model")
def read_model(session: SessionDep, project: ProjectDep, model_id: uuid.UUID) -> Model:
    model = uploaded.get_model(session=session, project_id=project.id, model_id=model_id)
    if model is None:
        raise Problem(404, f"model {model_id} not found", slug="model-not-found")
    return model


def _stored_bytes(settings: Settings, upload: Upload) -> int:
    """What the model will take in storage: the upload, or an archive's members unpacked."""
    if not is_zip(upload.path):
        return upload.size_bytes
    try:
        return inspect_model_zip(upload.path, limits=model_archive_limits(settings)).expanded_bytes
    except InvalidModelArchive as exc:
        raise Problem(422, f"not a usable ONNX model: {exc}", slug="invalid-model") from exc


def _create(
    settings: Settings, project: KeyProject, model_id: uuid.UUID, upload: Upload, relative: str, stored_bytes: int
) -> Model:
    with session_scope(settings.resolved_database_url) as session:
        reserve_storage(session=session, project=project, settings=settings, size_bytes=stored_bytes)
        return uploaded.create_model(
            session=session,
            project_id=project.id,
            model_id=model_id,
            filename=upload.filename,
            sha256=upload.sha256,
            size_bytes=stored_bytes,
            path=relative,
        )


def _discard(settings: Settings, model_id: uuid.UUID, relative: str) -> None:
    with session_scope(settings.resolved_database_url) as session:
        model = uploaded.get_model_unscoped(session=session, model_id=model_id)
        if model is not None:
            uploaded.delete_model(session=session, model=model)
    open_store(settings).delete_prefix(storage.folder(relative))


def _load(settings: Settings, model_id: uuid.UUID) -> Model:
    with session_scope(settings.resolved_database_url) as session:
        model = uploaded.get_model_unscoped(session=session, model_id=model_id)
        assert model is not None
        return model
