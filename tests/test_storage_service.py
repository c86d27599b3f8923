"""The service on each store: the local filesystem (one host, one var directory) and a real S3 API
(moto's server), where the API and the workers run as on two hosts: separate var directories, so
separate caches, and nothing shared but the database, the broker and the store."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli.client import Client
from cli.transfer import download
from jobs.db import session_scope
from jobs.keys import create_api_key
from jobs.queries import create_project, events_after, get_project_by_name
from launcher.servers import S3_CREDENTIALS, new_bucket, s3_client
from launcher.stack import Stack
from tests.conftest import ARTIFACTS, SERVICE_ENV, make_database, redis_database
from tests.test_api import assert_problem

RECIPE = {"calibration": {"num_samples": 64}, "evaluation": {"holdout_fraction": 0.3}}
JOB_TIMEOUT = 180.0


@dataclass
class StoredService:
    kind: str
    url: str
    presign_url: str | None  # an API answering downloads with presigned redirects (S3 only)
    database_url: str
    api_var: Path
    worker_var: Path
    bucket: str | None
    endpoint: str | None

    def client(self, key: str, url: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=f"{url or self.url}/api/v1", headers={"X-API-Key": key}, timeout=120)

    def objects(self, prefix: str = "") -> list[str]:
        if self.bucket is None:
            root = self.api_var / "storage"
            return sorted(str(p.relative_to(root)) for p in (root / prefix).rglob("*") if p.is_file())
        s3 = s3_client(self.endpoint)
        listed = s3.list_objects_v2(Bucket=self.bucket, Prefix=f"svc/{prefix}").get("Contents", [])
        return sorted(item["Key"].removeprefix("svc/") for item in listed)


@pytest.fixture(scope="module", params=["local", "s3"])
def stored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoredService]:
    kind = request.param
    api_var = tmp_path_factory.mktemp(f"api-var-{kind}")
    worker_var = api_var if kind == "local" else tmp_path_factory.mktemp("worker-var-s3")
    endpoint = request.getfixturevalue("s3_endpoint") if kind == "s3" else None
    bucket = new_bucket(endpoint) if endpoint else None
    with make_database("sqlite") as database_url, redis_database() as broker_url:
        env = dict(os.environ, DATABASE_URL=database_url, BROKER_URL=broker_url, **SERVICE_ENV)
        if bucket is not None:
            env.update(S3_CREDENTIALS, QUANT_STORAGE_URL=f"s3://{bucket}/svc", QUANT_STORAGE_ENDPOINT_URL=endpoint)
        logs = ARTIFACTS / "logs" / f"storage-{kind}-{os.getpid()}"
        api = Stack(env=dict(env, QUANT_VAR_DIR=str(api_var)), log_dir=logs / "api")
        workers = Stack(env=dict(env, QUANT_VAR_DIR=str(worker_var)), log_dir=logs / "workers")
        presigning = Stack(env=dict(env, QUANT_VAR_DIR=str(api_var), QUANT_STORAGE_PRESIGN="true"), log_dir=logs / "p")
        try:
            api.migrate()
            workers.start_worker("default", "default", beat=True)
            workers.start_worker("gpu", "gpu")
            url = api.start_api()
            presign_url = presigning.start_api() if bucket else None
            yield StoredService(kind, url, presign_url, database_url, api_var, worker_var, bucket, endpoint)
        finally:
            for stack in (presigning, api, workers):
                stack.stop()


def _new_key(stored: StoredService) -> tuple[str, str]:
    """A new project and an API key of it."""
    project = f"storage-{os.urandom(4).hex()}"
    with session_scope(stored.database_url) as session:
        row = create_project(session=session, name=project)
        _key, plaintext = create_api_key(session=session, project_id=row.id)
    return project, plaintext


def _run_job(client: httpx.Client, model_id: str, dataset_id: str) -> str:
    job = client.post("/jobs", json={"model_id": model_id, "dataset_id": dataset_id, "recipe": RECIPE})
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    deadline = time.monotonic() + JOB_TIMEOUT
    while (status := client.get(f"/jobs/{job_id}").json()["status"]) not in ("succeeded", "failed", "canceled"):
        assert time.monotonic() < deadline, f"job {job_id} did not end within {JOB_TIMEOUT} s"
        time.sleep(0.3)
    assert status == "succeeded", client.get(f"/jobs/{job_id}").json()
    return job_id


def _messages(stored: StoredService, job_id: str) -> list[str]:
    with session_scope(stored.database_url) as session:
        return [event.message for event in events_after(session=session, job_id=uuid.UUID(job_id), after_id=0)]


@pytest.fixture(scope="module")
def uploaded(stored: StoredService, digits: tuple[Path, Path]) -> dict:
    model_path, data_path = digits
    _project, key = _new_key(stored)
    with stored.client(key) as client:
        model = client.post("/models", files={"file": ("model.onnx", model_path.read_bytes())})
        assert model.status_code == 201, model.text
        dataset = client.post("/datasets", files={"file": ("data.npz", data_path.read_bytes())})
        assert dataset.status_code == 201, dataset.text
    return {"key": key, "model": model.json(), "dataset": dataset.json()}


def test_uploads_land_in_the_store_and_a_re_upload_reuses_them(
    stored: StoredService, uploaded: dict, digits: tuple[Path, Path]
) -> None:
    model = uploaded["model"]
    assert model["sha256"] == hashlib.sha256(digits[0].read_bytes()).hexdigest()
    objects = stored.objects()
    assert any(key.endswith(f"/models/{model['id']}/model.onnx") for key in objects)
    assert not [key for key in objects if key.startswith(".uploads/")]  # nothing left mid-way
    with stored.client(uploaded["key"]) as client:
        again = client.post("/models", files={"file": ("model.onnx", digits[0].read_bytes())})
    assert again.status_code == 200 and again.json()["id"] == model["id"]
    assert stored.objects() == objects  # nothing stored for the re-upload


def test_a_job_reads_its_inputs_through_the_cache_and_its_artifacts_download_with_range(
    stored: StoredService, uploaded: dict
) -> None:
    with stored.client(uploaded["key"]) as client:
        first = _run_job(client, uploaded["model"]["id"], uploaded["dataset"]["id"])
        second = _run_job(client, uploaded["model"]["id"], uploaded["dataset"]["id"])
        listing = {a["name"]: a for a in client.get(f"/jobs/{second}/artifacts").json()}
        whole = client.get(f"/jobs/{second}/artifacts/model.qdq.onnx")
        part = client.get(f"/jobs/{second}/artifacts/model.qdq.onnx", headers={"Range": "bytes=10-109"})
        past = client.get(f"/jobs/{second}/artifacts/model.qdq.onnx", headers={"Range": "bytes=99999999-"})
        report = client.get(f"/jobs/{second}/report")
    if stored.kind == "s3":
        assert "model: downloaded" in " ".join(_messages(stored, first))
        messages = _messages(stored, second)
        assert any(m.startswith("model: cache hit") for m in messages), messages
        assert any(m.startswith("dataset: cache hit") for m in messages), messages
        assert not (stored.api_var / "storage").exists()  # the API host keeps no files
        assert list((stored.worker_var / "cache" / "entries").iterdir())
    announced = listing["model.qdq.onnx"]
    assert whole.status_code == 200 and hashlib.sha256(whole.content).hexdigest() == announced["sha256"]
    assert whole.headers["etag"] == f'"{announced["sha256"]}"'
    assert part.status_code == 206 and part.content == whole.content[10:110]
    assert part.headers["content-range"] == f"bytes 10-109/{len(whole.content)}"
    assert_problem(past, 416, "past the end")
    assert report.status_code == 200 and report.json()
    staged = [key for key in stored.objects() if "/.staging/" in key]
    assert staged == []  # moved into place when the job's end was committed


def test_quantctl_follows_a_presigned_redirect(stored: StoredService, uploaded: dict, tmp_path: Path) -> None:
    if stored.presign_url is None:
        pytest.skip("the local store has no presigned URLs: the API streams artifacts itself")
    with stored.client(uploaded["key"]) as client:
        job_id = _run_job(client, uploaded["model"]["id"], uploaded["dataset"]["id"])
        announced = {a["name"]: a for a in client.get(f"/jobs/{job_id}/artifacts").json()}["tqc.json"]
    with stored.client(uploaded["key"], stored.presign_url) as client:
        redirect = client.get(f"/jobs/{job_id}/artifacts/tqc.json")
    assert redirect.status_code == 307 and redirect.headers["location"].startswith(stored.endpoint)
    with Client(stored.presign_url, uploaded["key"]) as cli:
        path = f"/jobs/{job_id}/artifacts/tqc.json"
        target = tmp_path / "tqc.json"
        assert download(cli, path, target, size=announced["size_bytes"], sha256=announced["sha256"], progress=False)
        target.write_bytes(target.read_bytes()[:100])  # a cut-off download, resumed with Range through the redirect
        target.rename(tmp_path / "tqc.json.part")
        assert download(cli, path, target, size=announced["size_bytes"], sha256=announced["sha256"], progress=False)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == announced["sha256"]


def test_an_upload_past_the_quota_is_cut_off_and_leaves_nothing(
    stored: StoredService, digits: tuple[Path, Path]
) -> None:
    project, key = _new_key(stored)
    with session_scope(stored.database_url) as session:
        row = get_project_by_name(session=session, name=project)
        row.max_storage_bytes = 1000
        project_id = str(row.id)
    body = digits[0].read_bytes()
    assert len(body) > 1000
    with stored.client(key) as client:
        refused = client.post("/models", content=body, headers={"content-type": "application/octet-stream"})
    assert_problem(refused, 413, "quota")
    assert stored.objects(f"{project_id}/") == []
    assert not [key for key in stored.objects() if key.startswith(".uploads/")]
    if stored.bucket is not None:
        s3 = s3_client(stored.endpoint)
        assert s3.list_multipart_uploads(Bucket=stored.bucket).get("Uploads", []) == []
