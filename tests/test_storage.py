"""The two stores behind one interface (`jobs.storage`), the workers' input cache (`worker.inputs`) and
the sweep (`worker.sweep`): each test runs against the local filesystem and a real S3 API (moto's
server on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobs import queries, storage, uploaded
from jobs.config import settings
from jobs.db import session_scope
from jobs.local_store import LocalStore
from jobs.models import JobStatus
from jobs.object_store import PART_BYTES, ObjectStore
from jobs.storage import Store
from launcher.servers import S3_CREDENTIALS, new_bucket, s3_client
from worker.inputs import InputCache, JobInputs, StoredInput

# Each child of the cache race waits this long at most for the other to start (bounded, not forever).
RACE_TIMEOUT = 60.0


def make_store(kind: str, tmp_path: Path, endpoint: str | None) -> Store:
    if kind == "local":
        return LocalStore(tmp_path / "store")
    client = s3_client(endpoint)
    return ObjectStore(client, new_bucket(endpoint), "deployment/a", tmp_path / "scratch")


@pytest.fixture(params=["local", "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def endpoint(store_kind: str, request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("s3_endpoint") if store_kind == "s3" else None


@pytest.fixture
def store(store_kind: str, endpoint: str | None, tmp_path: Path) -> Store:
    return make_store(store_kind, tmp_path, endpoint)


def _file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_put_fetch_range_move_and_delete(store: Store, tmp_path: Path) -> None:
    source = _file(tmp_path / "in.bin", 3 * 1024 * 1024 + 17)
    data = source.read_bytes()
    assert store.put_file(source, "p/jobs/j/.staging/1/model.onnx") == (len(data), hashlib.sha256(data).hexdigest())
    store.move("p/jobs/j/.staging/1/model.onnx", "p/jobs/j/model.onnx")
    store.move("p/jobs/j/.staging/1/model.onnx", "p/jobs/j/model.onnx")  # a retried move is a no-op
    with pytest.raises(FileNotFoundError):
        store.size("p/jobs/j/.staging/1/model.onnx")
    assert store.size("p/jobs/j/model.onnx") == len(data)
    assert b"".join(store.read_range("p/jobs/j/model.onnx", 1000, 2_000_017)) == data[1000:2_000_017]
    store.fetch("p/jobs/j/model.onnx", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == data
    assert [(o.key, o.size) for o in store.list("p/jobs/")] == [("p/jobs/j/model.onnx", len(data))]
    store.delete_prefix("p/jobs/j/")
    assert list(store.list("p/")) == []


def test_a_streamed_upload_is_invisible_until_committed(store: Store) -> None:
    body = os.urandom(2 * PART_BYTES + 12345)  # two full parts and a short last one on S3
    upload = store.begin_upload()
    for start in range(0, len(body), 64 * 1024):
        upload.write(body[start : start + 64 * 1024])
        if upload.pending():
            upload.send()
    upload.finish()
    assert upload.path.read_bytes() == body  # the local copy archives are inspected from
    assert [o.key for o in store.list("p/")] == []
    upload.commit("p/models/m/model.onnx")
    assert store.read_bytes("p/models/m/model.onnx") == body
    assert not upload.path.exists()
    assert [o.key for o in store.list()] == ["p/models/m/model.onnx"]  # nothing left under .uploads


def test_an_aborted_upload_leaves_nothing(store: Store, store_kind: str) -> None:
    upload = store.begin_upload()
    upload.write(os.urandom(PART_BYTES + 1))
    upload.send()
    upload.abort()
    upload.abort()
    assert list(store.list()) == []
    assert not upload.path.exists()
    if store_kind == "s3":
        assert isinstance(store, ObjectStore)
        assert store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []


def test_presigned_urls_serve_the_object_with_range(store: Store, store_kind: str, tmp_path: Path) -> None:
    data = _file(tmp_path / "a.bin", 5000).read_bytes()
    store.put_file(tmp_path / "a.bin", "p/jobs/j/tqc.json")
    url = store.presign("p/jobs/j/tqc.json", seconds=60, filename="tqc.json", media_type="application/json")
    if store_kind == "local":
        assert url is None  # the API streams it itself
        return
    response = httpx.get(url, headers={"Range": "bytes=100-199"})
    assert response.status_code == 206 and response.content == data[100:200]
    assert 'filename="tqc.json"' in response.headers["content-disposition"]


# The input cache ---------------------------------------------------------------------------------


def _stored_model(store: Store, tmp_path: Path, size: int, name: str = "m") -> StoredInput:
    source = _file(tmp_path / f"{name}.onnx", size)
    _size, digest = store.put_file(source, f"p/models/{name}/model.onnx")
    store.put_file(_file(tmp_path / f"{name}.data", 100), f"p/models/{name}/weights.data")
    return StoredInput("model", f"p/models/{name}/model.onnx", digest)


def test_the_cache_downloads_once_and_evicts_the_least_recently_used(store: Store, tmp_path: Path) -> None:
    first, second = _stored_model(store, tmp_path, 1000, "a"), _stored_model(store, tmp_path, 1000, "b")
    cache = InputCache(store, tmp_path / "cache", max_bytes=1500)
    with cache.use(first) as (path, downloaded):
        assert downloaded == 1100 and path.read_bytes() == store.read_bytes(first.key)
        assert (path.parent / "weights.data").is_file()  # external data comes with the model
    with cache.use(first) as (_path, downloaded):
        assert downloaded is None
    with cache.use(second) as (_path, downloaded):
        assert downloaded == 1100
    assert sorted(p.name for p in (tmp_path / "cache" / "entries").iterdir() if p.is_dir()) == [second.sha256]


def test_an_entry_a_job_reads_is_not_evicted(store: Store, tmp_path: Path) -> None:
    first, second = _stored_model(store, tmp_path, 1000, "a"), _stored_model(store, tmp_path, 1000, "b")
    cache = InputCache(store, tmp_path / "cache", max_bytes=1500)
    with cache.use(first) as (path, _), cache.use(second):
        assert path.is_file()  # over the bound, but both are in use
    cache.evict()
    assert len([p for p in (tmp_path / "cache" / "entries").iterdir() if p.is_dir()]) == 1


def _race(
    kind: str, tmp_path: str, endpoint: str | None, bucket: str | None, item: StoredInput, barrier, results
) -> None:
    """One worker process: open the store, wait for the other, then read the input through the cache."""
    if kind == "local":
        store: Store = LocalStore(Path(tmp_path) / "store")
    else:
        client = s3_client(endpoint)
        store = ObjectStore(client, bucket, "deployment/a", Path(tmp_path) / "scratch")
    barrier.wait(RACE_TIMEOUT)
    with InputCache(store, Path(tmp_path) / "cache", max_bytes=10**9).use(item) as (path, downloaded):
        results.put((path.read_bytes() == store.read_bytes(item.key), downloaded))


def test_two_worker_processes_racing_for_one_input_download_it_once(
    store: Store, store_kind: str, endpoint: str | None, tmp_path: Path
) -> None:
    item = _stored_model(store, tmp_path, 4 * 1024 * 1024)
    bucket = store.bucket if isinstance(store, ObjectStore) else None
    context = multiprocessing.get_context("spawn")  # as Celery's prefork children are separate processes
    barrier, results = context.Barrier(2), context.Queue()
    args = (store_kind, str(tmp_path), endpoint, bucket, item, barrier, results)
    workers = [context.Process(target=_race, args=args) for _ in range(2)]
    for worker in workers:
        worker.start()
    answers = [results.get(timeout=RACE_TIMEOUT) for _ in workers]
    for worker in workers:
        worker.join(timeout=RACE_TIMEOUT)
        assert worker.exitcode == 0
    assert all(intact for intact, _ in answers)
    assert sorted((downloaded for _, downloaded in answers), key=lambda d: d is None) == [4 * 1024 * 1024 + 100, None]


def test_job_inputs_on_a_local_store_are_read_in_place(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    item = _stored_model(store, tmp_path, 10)
    events: list[str] = []
    with JobInputs(store, tmp_path / "cache", 10**6, item) as inputs:
        assert inputs.fetch(events.append) == [store.local_path(item.key)]
    assert events == [] and not (tmp_path / "cache").exists()


# The sweep ---------------------------------------------------------------------------------------


@pytest.fixture
def swept_store(
    store_kind: str, endpoint: str | None, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Store]:
    """The process's settings pointed at a fresh store and a migrated database."""
    monkeypatch.setattr(settings, "database_url", database)
    monkeypatch.setattr(settings, "var_dir", tmp_path / "var")
    if store_kind == "s3":
        for name, value in S3_CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(settings, "storage_url", f"s3://{new_bucket(endpoint)}/sweep")
        monkeypatch.setattr(settings, "storage_endpoint_url", endpoint)
    else:
        monkeypatch.setattr(settings, "storage_url", None)
    yield storage.open_store(settings)


def test_a_crash_between_storing_artifacts_and_committing_leaves_nothing_visible_and_the_sweep_removes_it(
    swept_store: Store, tmp_path: Path
) -> None:
    from quantcore.pipeline import QuantizeResult
    from worker import runner
    from worker.sweep import sweep

    store = swept_store
    with session_scope(settings.resolved_database_url) as session:
        project = queries.create_project(session=session, name=f"p-{uuid.uuid4().hex[:6]}")
        model_key, dataset_key = storage.model_path(project.id, uuid.uuid4()), "unused"
        model = uploaded.create_model(
            session=session, project_id=project.id, model_id=uuid.UUID(model_key.split("/")[2]),
            filename="m.onnx", sha256="0" * 64, size_bytes=1, path=model_key,
        )  # fmt: skip
        dataset_id = uuid.uuid4()
        dataset_key = storage.dataset_path(project.id, dataset_id)
        uploaded.create_dataset(
            session=session, project_id=project.id, dataset_id=dataset_id, filename="d.npz",
            sha256="1" * 64, size_bytes=1, path=dataset_key, arrays=[], num_samples=1,
        )  # fmt: skip
        job = queries.create_job(
            session=session, project_id=project.id, model_id=model.id, dataset_id=dataset_id, recipe={}
        )
        project_id, job_id = project.id, job.id
    for key in (model_key, dataset_key, f"{project_id}/models/{uuid.uuid4()}/model.onnx"):
        store.put_file(_file(tmp_path / "x", 10), key)

    work = tmp_path / "work"
    work.mkdir()
    for name in ("model.qdq.onnx", "tqc.json", "report.json", "report.html"):
        (work / name).write_bytes(name.encode())
    result = QuantizeResult(
        model_path=work / "model.qdq.onnx", tqc_path=work / "tqc.json", report_path=work / "report.json", report={}
    )
    progress = runner.Progress(job_id, "crashed-worker", 1)
    stored = runner._store(progress, project_id, result)  # and then the worker dies before `finish`

    for artifact in stored:
        with pytest.raises(FileNotFoundError):
            store.size(artifact["path"])
    with session_scope(settings.resolved_database_url) as session:
        assert queries.list_artifacts(session=session, job_id=job_id) == []

    later = time.time() + settings.storage_sweep_grace_seconds + 60
    staged = {o.key for o in store.list(f"{storage.job_dir(project_id, job_id)}/")}
    assert len(staged) == 4
    left_by_crash = {o.key for o in store.list()} - {model_key, dataset_key}
    assert set(sweep(now=later).deleted) == left_by_crash - staged  # the job may still be retried: kept
    with session_scope(settings.resolved_database_url) as session:
        queries.get_job_unscoped(session=session, job_id=job_id).status = JobStatus.failed
    upload = store.begin_upload()  # an upload a crash cut off mid-stream
    upload.write(b"x" * 10)
    upload.send()
    result = sweep(now=later)
    assert staged <= set(result.deleted)
    assert all(key.startswith(".uploads/") for key in set(result.deleted) - staged)  # the local store's upload
    assert {o.key for o in store.list()} == {model_key, dataset_key}  # rows name these
    if isinstance(store, ObjectStore):
        assert result.aborted_uploads == 1
        assert store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
