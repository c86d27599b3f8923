"""The HTTP API against real processes, on SQLite and on PostgreSQL (the `service` fixture).

Bad input must get the right status and a problem+json naming the cause, and leave nothing
half-written behind (no row, no file).
"""

from __future__ import annotations

import io
import uuid
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from samples.tiny import tiny_conv_bytes
from tests.conftest import Service

PROBLEM = "application/problem+json"


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def tiny_dataset(n: int = 16, name: str = "image", shape: tuple[int, ...] = (3, 8, 8)) -> bytes:
    return npz_bytes(**{name: np.random.default_rng(1).normal(size=(n, *shape)).astype(np.float32)})


def assert_problem(response: httpx.Response, status: int, *needles: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers["content-type"]
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"].startswith("https://")
    text = (body["detail"] + " " + " ".join(f"{e['field']} {e['message']}" for e in body.get("errors", []))).lower()
    for needle in needles:
        assert needle.lower() in text, f"{needle!r} not in problem: {body}"
    return body


def leftovers(service: Service) -> list[Path]:
    """Files under the storage root that are not stored models/datasets/artifacts (temp files)."""
    root = service.var_dir / "storage"
    return [p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".part") or ".uploads" in p.parts)]


@pytest.fixture(scope="module")
def tiny(service: Service) -> dict:
    """A project with the tiny model and a matching dataset uploaded."""
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    return {"key": key, "model": model, "dataset": dataset}


def test_health_and_readiness(service: Service) -> None:
    with service.client() as client:
        assert client.get("/health").json()["status"] == "ok"
        ready = client.get("/ready").json()
        assert ready == {"status": "ok", "database": "ok", "broker": "ok"}


def test_openapi_documents_every_resource(service: Service) -> None:
    spec = httpx.get(f"{service.url}/api/v1/openapi.json").json()
    for path in (
        "/api/v1/models",
        "/api/v1/datasets",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/jobs/{job_id}/artifacts/{name}",
        "/api/v1/jobs/{job_id}/report",
    ):
        assert path in spec["paths"], path
    assert httpx.get(f"{service.url}/docs").status_code == 200


def test_requests_without_a_valid_key_are_refused(service: Service) -> None:
    assert_problem(httpx.get(f"{service.url}/api/v1/jobs"), 401, "X-API-Key")
    assert_problem(httpx.get(f"{service.url}/api/v1/jobs", headers={"X-API-Key": "qk_nope"}), 401, "unknown")


def test_model_upload_records_metadata(service: Service, tiny: dict) -> None:
    model = tiny["model"]
    data = tiny_conv_bytes()
    assert model["status"] == "ready"
    assert model["size_bytes"] == len(data)
    import hashlib

    assert model["sha256"] == hashlib.sha256(data).hexdigest()
    info = model["info"]
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 8, 8], "batch_axis": 0}]
    assert info["outputs"][0]["name"] == "logits"
    assert info["opset"] == 17
    assert info["op_histogram"] == {"Conv": 1, "Relu": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    assert info["num_parameters"] == 4 * 3 * 3 * 3 + 4 + 2 * 4 + 2
    with service.client(tiny["key"]) as client:
        assert client.get(f"/models/{model['id']}").json()["sha256"] == model["sha256"]
        listed = client.get("/models").json()
        assert [m["id"] for m in listed["items"]] == [model["id"]]


def test_raw_body_upload_is_accepted(service: Service, tiny: dict) -> None:
    with service.client(tiny["key"]) as client:
        response = client.post(
            "/models",
            params={"filename": "raw.onnx", "reuse": "false"},  # the project holds these bytes already
            content=tiny_conv_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
    assert response.status_code == 201, response.text
    assert response.json()["filename"] == "raw.onnx"


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (tiny_conv_bytes()[:200], "onnx"),  # truncated protobuf
        (b"PK\x03\x04 this is a zip, not a model" * 10, "onnx"),
        (b"\x00" * 1000, ""),
    ],
    ids=["truncated", "not-onnx", "zeros"],
)
def test_invalid_models_are_refused_and_removed(service: Service, payload: bytes, needle: str) -> None:
    key = service.new_key()
    with service.client(key) as client:
        response = client.post("/models", files={"file": ("bad.onnx", payload)})
        assert_problem(response, 422, "not a usable onnx model", needle)
        assert client.get("/models").json()["items"] == []
    project_dirs = [p for p in (service.var_dir / "storage").glob("*/models/*") if p.is_dir() and any(p.iterdir())]
    assert all((p / "model.onnx").exists() for p in project_dirs)  # no orphan directories with half files
    assert leftovers(service) == []


def test_opset_out_of_range_is_refused(service: Service) -> None:
    with service.client() as client:
        response = client.post("/models", files={"file": ("old.onnx", tiny_conv_bytes(opset=6))})
    assert_problem(response, 422, "opset")


def test_oversized_upload_is_cut_off(service: Service) -> None:
    too_big = b"\x08" * (4 * 1024 * 1024 + 1)  # QUANT_MAX_MODEL_BYTES is 4 MiB in the test service

    def chunks():  # no Content-Length: the cap must be enforced while streaming
        for start in range(0, len(too_big), 256 * 1024):
            yield too_big[start : start + 256 * 1024]

    with service.client() as client:
        declared = client.post("/models", files={"file": ("big.onnx", too_big)})
        assert_problem(declared, 413, "limit")
        streamed = client.post(
            "/models",
            params={"filename": "big.onnx"},
            content=chunks(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert_problem(streamed, 413, "limit")
        assert client.get("/models").json()["items"] == []
    assert leftovers(service) == []


def test_datasets_are_validated(service: Service) -> None:
    with service.client() as client:
        ok = client.post("/datasets", files={"file": ("d.npz", tiny_dataset(n=10))})
        assert ok.status_code == 201, ok.text
        assert ok.json()["arrays"] == [{"name": "image", "dtype": "float32", "shape": [10, 3, 8, 8]}]
        assert ok.json()["num_samples"] == 10
        objects = npz_bytes(image=np.array([{"a": 1}, None], dtype=object))
        assert_problem(client.post("/datasets", files={"file": ("o.npz", objects)}), 422, "objects")
        assert_problem(client.post("/datasets", files={"file": ("x.npz", b"not a zip")}), 422, ".npz")
        scalars = npz_bytes(rate=np.array(16000))
        assert_problem(client.post("/datasets", files={"file": ("r.npz", scalars)}), 422, "every array is a scalar")
        # No common first axis: samples may run along another axis of some model's inputs, so the upload
        # is kept and a job counts them along its model's batch axes (tests/test_batch_axes.py).
        uneven = client.post("/datasets", files={"file": ("u.npz", npz_bytes(a=np.zeros((4, 2)), b=np.zeros((2, 4))))})
        assert uneven.status_code == 201 and uneven.json()["num_samples"] is None, uneven.text
        assert len(client.get("/datasets").json()["items"]) == 2
    assert leftovers(service) == []


def test_npz_headers_and_decompressed_size_are_checked_at_upload(service: Service, tmp_path: Path) -> None:
    from tests.test_npz import npy_with_shape, write_zip

    forged = write_zip(tmp_path / "f.npz", {"x.npy": npy_with_shape((1_000_000_000, 4), b"\0" * 64)}).read_bytes()
    zeros = io.BytesIO()
    np.save(zeros, np.zeros(200_000, np.float32))
    bomb = write_zip(tmp_path / "b.npz", {"x.npy": zeros.getvalue()}, zipfile.ZIP_DEFLATED).read_bytes()
    mixed = io.BytesIO()  # a constant mask beside real data: ~2:1 over the archive
    rng = np.random.default_rng(0)
    np.savez_compressed(mixed, x=rng.normal(size=(64, 512)).astype(np.float32), mask=np.ones((64, 512), np.int8))
    with service.client() as client:
        assert_problem(client.post("/datasets", files={"file": ("f.npz", forged)}), 422, "array 'x' declares shape")
        assert_problem(client.post("/datasets", files={"file": ("b.npz", bomb)}), 422, "compression ratio")
        ok = client.post("/datasets", files={"file": ("m.npz", mixed.getvalue())})
        assert ok.status_code == 201, ok.text
        # Counted against the quota as the worker will hold it: decompressed (two 128-byte .npy headers).
        assert ok.json()["size_bytes"] == 64 * 512 * 5 + 2 * 128 > len(mixed.getvalue())
        assert len(client.get("/datasets").json()["items"]) == 1
    assert leftovers(service) == []


def test_dataset_that_does_not_fit_the_model_names_the_input(service: Service, tiny: dict) -> None:
    with service.client(tiny["key"]) as client:
        wrong_name = client.post("/datasets", files={"file": ("w.npz", tiny_dataset(name="pixels"))}).json()
        wrong_shape = client.post("/datasets", files={"file": ("s.npz", tiny_dataset(shape=(3, 9, 8)))}).json()
        wrong_dtype = client.post(
            "/datasets", files={"file": ("t.npz", npz_bytes(image=np.zeros((4, 3, 8, 8), np.float64)))}
        ).json()
        for dataset, needles in (
            (wrong_name, ("'image'", "no array")),
            (wrong_shape, ("'image'", "axis 2 must be 8", "9")),
            (wrong_dtype, ("'image'", "float32", "float64")),
        ):
            response = client.post("/jobs", json={"model_id": tiny["model"]["id"], "dataset_id": dataset["id"]})
            body = assert_problem(response, 422, *needles)
            assert body["errors"][0]["field"] == "dataset_id"
        assert client.get("/jobs").json()["items"] == []


@pytest.mark.parametrize(
    ("recipe", "field", "needle"),
    [
        ({"calibration": {"observr": "minmax"}}, "recipe.calibration.observr", "unknown field"),
        ({"calibration": {"percentile": 150}}, "recipe.calibration.percentile", "less than or equal to 100"),
        ({"calibration": {"observer": "magic"}}, "recipe.calibration.observer", "minmax"),
        ({"platform": "tpu"}, "recipe.platform", "tensorrt"),
        ({"evaluation": {"holdout_fraction": 0}}, "recipe.evaluation.holdout_fraction", "greater than 0"),
        ({"turbo": True}, "recipe.turbo", "unknown field"),
        (
            {"mixed_precision": {"max_fraction": 0.9}},
            "recipe.mixed_precision.max_fraction",
            "less than or equal to 0.5",
        ),
    ],
)
def test_bad_recipes_name_the_field(service: Service, tiny: dict, recipe: dict, field: str, needle: str) -> None:
    with service.client(tiny["key"]) as client:
        response = client.post(
            "/jobs", json={"model_id": tiny["model"]["id"], "dataset_id": tiny["dataset"]["id"], "recipe": recipe}
        )
        body = assert_problem(response, 422, needle)
        assert field in [e["field"] for e in body["errors"]], body
        assert client.get("/jobs").json()["items"] == []


def test_unknown_and_foreign_ids_are_404(service: Service, tiny: dict) -> None:
    with service.client(tiny["key"]) as owner:
        job = owner.post("/jobs", json={"model_id": tiny["model"]["id"], "dataset_id": tiny["dataset"]["id"]}).json()
    with service.client() as stranger:
        for path in (
            f"/jobs/{job['id']}",
            f"/jobs/{job['id']}/report",
            f"/jobs/{job['id']}/artifacts",
            f"/jobs/{job['id']}/events",
            f"/models/{tiny['model']['id']}",
            f"/datasets/{tiny['dataset']['id']}",
            f"/jobs/{uuid.uuid4()}",
        ):
            assert_problem(stranger.get(path), 404, "not found")
        assert_problem(stranger.post(f"/jobs/{job['id']}/cancel"), 404, "not found")
        response = stranger.post("/jobs", json={"model_id": tiny["model"]["id"], "dataset_id": tiny["dataset"]["id"]})
        assert_problem(response, 404, "model_id")
        assert stranger.get("/jobs").json()["items"] == []
    assert_problem(
        httpx.get(f"{service.url}/api/v1/jobs/not-a-uuid", headers={"X-API-Key": tiny["key"]}), 422, "job_id"
    )


def test_jobs_list_filters_and_paginates(service: Service, tiny: dict) -> None:
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    with service.client(key) as client:
        created = [
            client.post(
                "/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": {"seed": i}}
            ).json()
            for i in range(5)
        ]
        assert all(job["status"] == "queued" for job in created)
        seen, cursor = [], None
        while True:
            page = client.get("/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            assert len(page["items"]) <= 2
            seen += [job["id"] for job in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [job["id"] for job in reversed(created)]  # newest first, each exactly once
        assert_problem(client.get("/jobs", params={"cursor": "garbage"}), 400, "cursor")
        assert_problem(client.get("/jobs", params={"status": "sleeping"}), 422, "status")
        for job in created:
            canceled = client.post(f"/jobs/{job['id']}/cancel")
            assert canceled.status_code in (202, 409), canceled.text
        # every job ends (queued ones at once, running ones at their next check)
        for job in created:
            final = _wait_terminal(client, job["id"])
            assert final in ("canceled", "succeeded"), final
        canceled_ids = {
            j["id"] for j in client.get("/jobs", params={"status": "canceled", "limit": 50}).json()["items"]
        }
        assert canceled_ids <= {job["id"] for job in created}
        assert_problem(client.post(f"/jobs/{created[0]['id']}/cancel"), 409, "already ended")


def _wait_terminal(client: httpx.Client, job_id: str, timeout: float = 120.0) -> str:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/jobs/{job_id}").json()["status"]
        if status in ("succeeded", "failed", "canceled"):
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout} s")


def test_job_reads_answer_what_the_job_objects_would(service: Service) -> None:
    # GET /jobs/{id} and GET /jobs serialize rows of the public columns in the route (jobs.job_reads,
    # api.bodies); the bytes must be those FastAPI's response_model path makes of the Job objects.
    from pydantic import TypeAdapter

    from api.schemas import JobPublic, Page
    from jobs import job_reads, queries
    from jobs.db import session_scope

    assert tuple(JobPublic.model_fields) == job_reads.PUBLIC_COLUMNS
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    with service.client(key) as client:
        created = [
            client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": {"seed": i}})
            for i in range(2)
        ]
        for job in created:
            assert client.post(f"/jobs/{job.json()['id']}/cancel").status_code in (202, 409)  # 409: it ended
            _wait_terminal(client, job.json()["id"])  # a terminal job never changes: the reads below agree
        one = client.get(f"/jobs/{created[0].json()['id']}")
        listing = client.get("/jobs", params={"limit": 1})
    assert one.headers["content-type"] == listing.headers["content-type"] == "application/json"
    assert listing.json()["next_cursor"] is not None
    with session_scope(service.database_url) as session:
        job = queries.get_job_unscoped(session=session, job_id=uuid.UUID(created[0].json()["id"]))
        jobs, cursor = queries.list_jobs(session=session, project_id=job.project_id, status=None, limit=1, cursor=None)
        expected_one = TypeAdapter(JobPublic)
        assert one.content == expected_one.dump_json(expected_one.validate_python(job, from_attributes=True))
        expected_page = TypeAdapter(Page[JobPublic])
        page = expected_page.validate_python({"items": jobs, "next_cursor": cursor}, from_attributes=True)
        assert listing.content == expected_page.dump_json(page)
