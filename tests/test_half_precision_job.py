"""A float16 model through the real service (API, Celery workers, SQLite and PostgreSQL): the sample
CNN converted by onnxconverter-common, its input float16, with a float16 dataset. The upload records the
float16 interface, the dataset must match it, and the job quantizes the model (it used to export it
unquantized), keeping the float16 interface, with the report saying how it was measured."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxconverter_common import float16

from samples.digits import HELDOUT_FILE
from tests.conftest import Service
from tests.test_api import assert_problem
from tests.test_e2e import follow

pytestmark = pytest.mark.e2e

RECIPE = {"calibration": {"observer": "percentile"}, "evaluation": {"holdout_fraction": 0.3}}


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def half_job(service: Service, digits: tuple[Path, Path]) -> dict:
    model_path, _ = digits
    half = float16.convert_float_to_float16(onnx.load(model_path))
    data = dict(np.load(model_path.parent / HELDOUT_FILE))
    images16 = data["input"].astype(np.float16)
    key = service.new_key()
    model, dataset = service.upload(key, half.SerializeToString(), npz(input=images16, labels=data["labels"]))
    with service.client(key) as client:
        single = client.post("/datasets", files={"file": ("single.npz", npz(input=data["input"]))}).json()
        refused = client.post("/jobs", json={"model_id": model["id"], "dataset_id": single["id"], "recipe": RECIPE})
        created = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": RECIPE})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        follow(client, job_id)
        job = client.get(f"/jobs/{job_id}").json()
        report = client.get(f"/jobs/{job_id}/report").json()
        quantized = client.get(f"/jobs/{job_id}/artifacts/model.qdq.onnx").content
    return {"model": model, "refused": refused, "job": job, "report": report, "quantized": quantized, "data": data}


def test_the_upload_records_the_float16_interface_and_a_float32_dataset_is_refused(half_job: dict) -> None:
    assert [(i["name"], i["dtype"]) for i in half_job["model"]["info"]["inputs"]] == [("input", "float16")]
    assert_problem(half_job["refused"], 422, "float16", "float32")


def test_the_job_quantizes_the_float16_model_and_keeps_its_interface(half_job: dict) -> None:
    assert half_job["job"]["status"] == "succeeded", half_job["job"]
    report = half_job["report"]
    assert report["prepare"]["widened_from"] == "float16"
    assert any("computes in float16" in warning for warning in report["warnings"])
    evaluation = report["evaluation"]
    assert evaluation["model"]["quantize_linear_nodes"] > 0
    # the budget for INT8 on the digits model: within 0.5 points of the (widened) FP32 top-1
    assert abs(evaluation["qdq_deployed"]["top1"] - evaluation["fp32"]["top1"]) <= 0.5
    quantized = onnx.load_from_string(half_job["quantized"])
    assert [i.type.tensor_type.elem_type for i in quantized.graph.input] == [onnx.TensorProto.FLOAT16]
    session = ort.InferenceSession(half_job["quantized"], providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": half_job["data"]["input"][:8].astype(np.float16)})
    assert logits.dtype == np.float16 and logits.shape == (8, 10)
