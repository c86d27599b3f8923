"""Uploads whose validation message was lost end ready or invalid, never `pending` forever.

The lost message is set up as state: a model (or image dataset) row committed `pending` through
`jobs.queries`, its file in place, no validation message in any queue, and its last send backdated
past `validation_resend_seconds` (the fixture keeps the 900 s default). The fixture's `default`
worker runs the reaper on beat every second, so the test only waits; the row can leave `pending`
only through the reaper (a re-sent check, or giving up).
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from jobs import queries, storage, uploaded
from jobs.config import Settings
from jobs.db import session_scope
from jobs.models import Dataset, DatasetKind, Model, utcnow
from jobs.queue import (
    DEFAULT_QUEUE,
    VALIDATE_MODEL,
    enqueue_dataset_validation,
    enqueue_job,
    enqueue_validation,
    make_celery,
    pending_job_ids,
    pending_validation_ids,
)
from samples.tiny import tiny_conv_bytes
from tests.conftest import Service, redis_database
from tests.test_datasets_images import class_folders, zip_bytes

pytestmark = pytest.mark.e2e

RESEND_SECONDS = Settings().validation_resend_seconds  # the fixture does not override it
LONG_AGO = timedelta(seconds=2 * RESEND_SECONDS)


def _new_project(service: Service) -> tuple[str, uuid.UUID]:
    name = f"revalidate-{uuid.uuid4().hex[:8]}"
    key = service.new_key(name)
    with session_scope(service.database_url) as session:
        return key, queries.get_project_by_name(session=session, name=name).id


def _stored(service: Service, relative: str, data: bytes) -> None:
    path = storage.resolve(service.var_dir.resolve() / "storage", relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _pending_model(service: Service, project_id: uuid.UUID, *, age: timedelta, attempts: int = 1) -> uuid.UUID:
    """A pending model row whose validation message (the `attempts`-th) went out `age` ago and was lost."""
    model_id = uuid.uuid4()
    relative = storage.model_path(project_id, model_id)
    data = tiny_conv_bytes()
    _stored(service, relative, data)
    with session_scope(service.database_url) as session:
        model = uploaded.create_model(
            session=session,
            project_id=project_id,
            model_id=model_id,
            filename="model.onnx",
            sha256="0" * 64,
            size_bytes=len(data),
            path=relative,
        )
        model.created_at = utcnow() - age
        model.validation_attempts = attempts
    return model_id


def _row(service: Service, entity: type[Model] | type[Dataset], row_id: uuid.UUID) -> Model | Dataset:
    with session_scope(service.database_url) as session:
        row = session.get(entity, row_id)
        session.expunge(row)
        return row


def _wait_decided(service: Service, entity: type[Model] | type[Dataset], row_id: uuid.UUID, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _row(service, entity, row_id)
        if row.status != "pending":
            return row
        time.sleep(0.2)
    raise AssertionError(f"{entity.__name__} {row_id} still pending after {timeout} s")


def test_lost_model_validation_is_sent_again_and_decides_the_model(service: Service) -> None:
    key, project_id = _new_project(service)
    lost = _pending_model(service, project_id, age=LONG_AGO)
    recent = _pending_model(service, project_id, age=timedelta(0))  # its message may still be on its way
    try:
        model = _wait_decided(service, Model, lost)
        assert model.status == "ready", model.error
        assert model.info is not None and model.info["inputs"], model.info
        assert model.validation_attempts == 2 and model.validation_sent_at is not None  # one re-send
        with service.client(key) as client:
            assert client.get(f"/models/{lost}").json()["status"] == "ready"
        time.sleep(3.0)  # three more reaper beats: the recent row is not overdue and is left alone
        fresh = _row(service, Model, recent)
        assert fresh.status == "pending" and fresh.validation_attempts == 1
    finally:
        with session_scope(service.database_url) as session:
            uploaded.delete_model(session=session, model=session.get(Model, recent))


def test_after_the_last_attempt_the_model_is_marked_invalid_with_the_reason(service: Service) -> None:
    key, project_id = _new_project(service)
    attempts = Settings().validation_max_attempts
    model_id = _pending_model(service, project_id, age=LONG_AGO, attempts=attempts)
    model = _wait_decided(service, Model, model_id)
    # The file is a valid model: had the reaper sent a check instead of giving up, it would be ready.
    assert model.status == "invalid"
    assert model.error.startswith(f"validation did not complete after {attempts} attempts"), model.error
    assert model.validation_attempts == attempts
    with service.client(key) as client:
        body = client.get(f"/models/{model_id}").json()
    assert body["status"] == "invalid" and body["error"] == model.error


def test_lost_image_dataset_validation_is_sent_again(service: Service) -> None:
    _key, project_id = _new_project(service)
    dataset_id = uuid.uuid4()
    relative = storage.image_archive_path(project_id, dataset_id)
    data = zip_bytes(class_folders(per_class=3))
    _stored(service, relative, data)
    with session_scope(service.database_url) as session:
        dataset = uploaded.create_dataset(
            session=session,
            project_id=project_id,
            dataset_id=dataset_id,
            filename="images.zip",
            sha256="0" * 64,
            size_bytes=len(data),
            path=relative,
            arrays=[],
            num_samples=0,
            kind=DatasetKind.images,
        )
        dataset.created_at = utcnow() - LONG_AGO
    dataset = _wait_decided(service, Dataset, dataset_id)
    assert dataset.status == "ready", dataset.error
    assert dataset.validation_attempts == 2


def test_a_second_check_of_a_decided_model_changes_nothing(service: Service) -> None:
    _key, project_id = _new_project(service)
    model_id = _pending_model(service, project_id, age=timedelta(0))
    with session_scope(service.database_url) as session:
        assert uploaded.record_model_validation(session=session, model_id=model_id, info=None, error="decided first")
        assert not uploaded.record_model_validation(session=session, model_id=model_id, info={}, error=None)
    # A duplicate message for it (a re-send racing the original) runs to the end on the real worker.
    app = make_celery(Settings(), broker_url=service.stack.env["BROKER_URL"])
    task_id = app.send_task(VALIDATE_MODEL, args=[str(model_id)], queue=DEFAULT_QUEUE).id
    app.close()
    log = Path(service.stack.log_dir / "default.log")
    deadline = time.monotonic() + 60
    while f"{task_id}] succeeded" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the duplicate check never ran"
        time.sleep(0.2)
    model = _row(service, Model, model_id)
    assert (model.status, model.error, model.info) == ("invalid", "decided first", None)


def test_validation_messages_in_redis_are_seen_as_live() -> None:
    """Waiting messages are found by id, per kind of task (nothing consumes this Redis database)."""
    with redis_database() as url:
        app = make_celery(Settings(), broker_url=url)
        model_id, dataset_id, job_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        assert pending_validation_ids(app) == set()
        enqueue_validation(app, model_id)
        enqueue_dataset_validation(app, dataset_id)
        enqueue_job(app, job_id)
        assert pending_validation_ids(app) == {model_id, dataset_id}
        assert pending_job_ids(app) == {job_id}
        app.close()
