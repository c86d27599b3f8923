"""Per-project quotas: storage (models + datasets + artifacts) → 413, concurrent jobs → 429.

Each refusal is problem+json naming the quota with its limit and the current use; an upload past
the remaining storage is cut off while streaming and leaves no file behind.
"""

from __future__ import annotations

import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

from jobs.config import Settings
from jobs.db import session_scope
from jobs.queries import get_project_by_name
from jobs.quotas import storage_use
from samples.tiny import tiny_conv_bytes
from tests.conftest import Service
from tests.test_api import _wait_terminal, assert_problem, leftovers, tiny_dataset

FAST_RECIPE = {"deploy": {"cpu_latency": False, "tensorrt_engine": False}}


def _set_quota(service: Service, project: str, **limits: int | None) -> None:
    with session_scope(service.database_url) as session:
        row = get_project_by_name(session=session, name=project)
        for name, value in limits.items():
            setattr(row, name, value)


def _storage_used(service: Service, project: str) -> int:
    with session_scope(service.database_url) as session:
        row = get_project_by_name(session=session, name=project)
        return storage_use(session=session, project=row, settings=Settings()).used


def test_storage_quota_cuts_uploads_off_and_counts_artifacts(service: Service) -> None:
    project = f"quota-{uuid.uuid4().hex[:8]}"
    key = service.new_key(project)
    model_bytes, dataset_bytes = tiny_conv_bytes(), tiny_dataset()
    _set_quota(service, project, max_storage_bytes=len(model_bytes) + 100)
    with service.client(key) as client:
        model = client.post("/models", files={"file": ("m.onnx", model_bytes)})
        assert model.status_code == 201, model.text

        declared = client.post("/datasets", files={"file": ("d.npz", dataset_bytes)})
        body = assert_problem(declared, 413, "storage_bytes")
        assert (body["quota"], body["limit"], body["used"]) == (
            "storage_bytes",
            len(model_bytes) + 100,
            len(model_bytes),
        )

        def chunks():  # no Content-Length: cut off while streaming, after the 100 bytes left
            for _ in range(64):
                yield b"\0" * 16384

        streamed = client.post(
            "/datasets",
            params={"filename": "big.npz"},
            content=chunks(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert assert_problem(streamed, 413, "storage_bytes")["used"] == len(model_bytes)
        assert client.get("/datasets").json()["items"] == []
        assert leftovers(service) == []

        # Exactly full is allowed; then nothing more fits, and no job may start (its artifacts would not fit).
        _set_quota(service, project, max_storage_bytes=len(model_bytes) + len(dataset_bytes))
        dataset = client.post("/datasets", files={"file": ("d.npz", dataset_bytes)})
        assert dataset.status_code == 201, dataset.text
        assert_problem(client.post("/datasets", files={"file": ("e.npz", b"x")}), 413, "storage_bytes")
        full = client.post(
            "/jobs", json={"model_id": model.json()["id"], "dataset_id": dataset.json()["id"], "recipe": FAST_RECIPE}
        )
        assert assert_problem(full, 413, "storage_bytes")["limit"] == len(model_bytes) + len(dataset_bytes)

        _set_quota(service, project, max_storage_bytes=None)  # back to the settings' default
        job = client.post(
            "/jobs", json={"model_id": model.json()["id"], "dataset_id": dataset.json()["id"], "recipe": FAST_RECIPE}
        )
        assert job.status_code == 202, job.text
        assert _wait_terminal(client, job.json()["id"]) == "succeeded"
        artifacts = client.get(f"/jobs/{job.json()['id']}/artifacts").json()
    assert artifacts
    assert _storage_used(service, project) == len(model_bytes) + len(dataset_bytes) + sum(
        a["size_bytes"] for a in artifacts
    )


def test_concurrent_jobs_quota(service: Service) -> None:
    project = f"quota-{uuid.uuid4().hex[:8]}"
    key = service.new_key(project)
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    request = {"model_id": model["id"], "dataset_id": dataset["id"], "recipe": FAST_RECIPE}
    _set_quota(service, project, max_concurrent_jobs=0)
    with service.client(key) as client:
        body = assert_problem(client.post("/jobs", json=request), 429, "concurrent_jobs")
        assert (body["quota"], body["limit"], body["used"]) == ("concurrent_jobs", 0, 0)
        assert client.get("/jobs").json()["items"] == []  # nothing was created

        _set_quota(service, project, max_concurrent_jobs=1)
        service.stack.kill("gpu", signal.SIGTERM)  # so the first job stays queued
        try:
            first = client.post("/jobs", json=request)
            assert first.status_code == 202, first.text
            body = assert_problem(client.post("/jobs", json=request), 429, "concurrent_jobs")
            assert (body["limit"], body["used"]) == (1, 1)
            assert client.post(f"/jobs/{first.json()['id']}/cancel").json()["status"] == "canceled"
            second = client.post("/jobs", json=request)  # a slot is free again
            assert second.status_code == 202, second.text
        finally:
            service.start_job_worker()
        assert _wait_terminal(client, second.json()["id"]) == "succeeded"


def test_concurrent_submissions_cannot_overshoot_the_jobs_quota(service: Service) -> None:
    """Eight clients submit at once against a quota of two: the per-project lock admits exactly two."""
    project = f"quota-{uuid.uuid4().hex[:8]}"
    key = service.new_key(project)
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    request = {"model_id": model["id"], "dataset_id": dataset["id"], "recipe": FAST_RECIPE}
    _set_quota(service, project, max_concurrent_jobs=2)
    service.stack.kill("gpu", signal.SIGTERM)  # nothing leaves the queue meanwhile
    try:
        with service.client(key) as client, ThreadPoolExecutor(8) as pool:
            statuses = sorted(pool.map(lambda _: client.post("/jobs", json=request).status_code, range(8)))
            assert statuses == [202, 202] + [429] * 6, statuses
            accepted = client.get("/jobs").json()["items"]
            assert len(accepted) == 2
    finally:
        service.start_job_worker()
    with service.client(key) as client:
        assert {_wait_terminal(client, job["id"]) for job in accepted} == {"succeeded"}


def test_a_reupload_is_answered_with_the_stored_row_and_charged_nothing(service: Service) -> None:
    """The same bytes again: 200 with the model (dataset) the project holds, even with its quota full;
    `?reuse=false` stores a copy, which the quota then refuses. No temp file is left either way."""
    project = f"quota-{uuid.uuid4().hex[:8]}"
    key = service.new_key(project)
    model_bytes, dataset_bytes = tiny_conv_bytes(), tiny_dataset()
    model, dataset = service.upload(key, model_bytes, dataset_bytes)
    _set_quota(service, project, max_storage_bytes=len(model_bytes) + len(dataset_bytes))  # full
    with service.client(key) as client:
        again = client.post("/models", files={"file": ("renamed.onnx", model_bytes)})
        assert (again.status_code, again.json()["id"], again.json()["filename"]) == (200, model["id"], "model.onnx")
        data_again = client.post("/datasets", files={"file": ("d.npz", dataset_bytes)})
        assert (data_again.status_code, data_again.json()["id"]) == (200, dataset["id"])
        assert _storage_used(service, project) == len(model_bytes) + len(dataset_bytes)
        assert len(client.get("/models").json()["items"]) == len(client.get("/datasets").json()["items"]) == 1

        copy = client.post("/models", params={"reuse": "false"}, files={"file": ("m.onnx", model_bytes)})
        assert assert_problem(copy, 413, "storage_bytes")["used"] == len(model_bytes) + len(dataset_bytes)
        other_bytes = tiny_conv_bytes(input_name="pixel")  # as large, other bytes: streamed, then refused
        assert len(other_bytes) == len(model_bytes)
        assert_problem(client.post("/models", files={"file": ("o.onnx", other_bytes)}), 413, "storage_bytes")

        _set_quota(service, project, max_storage_bytes=None)
        copy = client.post("/models", params={"reuse": "false"}, files={"file": ("m.onnx", model_bytes)})
        assert copy.status_code == 201 and copy.json()["id"] != model["id"], copy.text
    assert leftovers(service) == []
