"""A job whose recipe asks for reconstruction, through the real API, Celery worker and database."""

from __future__ import annotations

import io
import time
from pathlib import Path

import onnx
import pytest

from samples.digits import HELDOUT_FILE
from tests.conftest import Service

pytestmark = pytest.mark.e2e

RECIPE = {
    "platform": "academic",
    "precision": "w4a4",
    "calibration": {"num_samples": 128},
    "evaluation": {"holdout_fraction": 0.3},
    "deploy": {"cpu_latency": False},
    "reconstruction": {"method": "qdrop", "iters": 40, "num_samples": 128},
}


def test_a_qdrop_job_reports_its_blocks_and_exports_a_qdq_model(service: Service, digits: tuple[Path, Path]) -> None:
    model_path, _ = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), (model_path.parent / HELDOUT_FILE).read_bytes())
    with service.client(key) as client:
        response = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": RECIPE})
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        deadline = time.monotonic() + 300
        while (job := client.get(f"/jobs/{job_id}").json())["status"] not in ("succeeded", "failed", "canceled"):
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
        assert job["status"] == "succeeded", job
        report = client.get(f"/jobs/{job_id}/report").json()
        exported = onnx.load(io.BytesIO(client.get(f"/jobs/{job_id}/artifacts/model.qdq.onnx").content))
    section = report["reconstruction"]
    assert section["method"] == "qdrop" and section["iters"] == 40 and section["seed"] == 0
    # stem, residual block, downsampling conv, and the head alone (it produces the graph output)
    assert [b["kind"] for b in section["blocks"]] == ["layer", "residual", "layer", "layer"]
    assert all(b["status"] in ("reconstructed", "kept_nearest") for b in section["blocks"])
    assert "reconstruct" in report["stage_seconds"]
    assert any(n.op_type == "DequantizeLinear" for n in exported.graph.node)
