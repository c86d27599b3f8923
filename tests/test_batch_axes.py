"""A model whose inputs do not all hold samples on axis 0, through the real service (API, Celery
workers, SQLite and PostgreSQL): x (B, 16), a recurrent state (2, B, 16) batched along axis 1, and a
scalar sample rate `sr` that is the same for every sample (as Silero VAD declares them).

The job must count and split samples along each input's own axis, say so in the report's split
record, derive the engine's optimization profile along that axis, and a dataset laid out for another
axis must be refused at POST /jobs with a message naming the input and the axis.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import onnxruntime as ort
import pytest

from jobs.recipe import Recipe
from samples.tiny import stateful_data, stateful_model
from tests.conftest import Service
from tests.test_api import assert_problem
from tests.test_e2e import read_events
from worker.splits import split_indices

pytestmark = pytest.mark.e2e

SAMPLES = 40
RECIPE = {
    "seed": 3,
    "calibration": {"observer": "minmax", "batch_size": 8},
    "evaluation": {"holdout_fraction": 0.25},
    "deploy": {"cpu_latency": False},
}


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def stateful(service: Service) -> dict:
    model = stateful_model(state_size=16)
    data = stateful_data(SAMPLES, seed=5, state_size=16)
    # Labels = the FP32 model's own top-1, computed on all samples at once: the job's FP32 top-1 is 1.0
    # only if its evaluation labels stay aligned with the evaluation samples of x and of state.
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    labels = session.run(["y"], data)[0].argmax(axis=1)
    key = service.new_key()
    uploaded_model, dataset = service.upload(key, model.SerializeToString(), npz(**data, labels=labels))
    with service.client(key) as client:
        created = client.post(
            "/jobs", json={"model_id": uploaded_model["id"], "dataset_id": dataset["id"], "recipe": RECIPE}
        )
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            read_events(response)
        job = client.get(f"/jobs/{job_id}").json()
        report = client.get(f"/jobs/{job_id}/report").json()
    return {"key": key, "model": uploaded_model, "dataset": dataset, "job": job, "report": report, "data": data}


def test_upload_records_each_inputs_batch_axis(stateful: dict) -> None:
    inputs = stateful["model"]["info"]["inputs"]
    assert [(i["name"], i["shape"], i["batch_axis"]) for i in inputs] == [
        ("x", ["batch", 16], 0),
        ("state", [2, "batch", 16], 1),
        ("sr", [], None),
    ]
    dataset = stateful["dataset"]
    assert dataset["num_samples"] is None  # x (40, 16) and state (2, 40, 16) share no first axis
    assert {"name": "sr", "dtype": "float32", "shape": []} in dataset["arrays"]


def test_job_splits_along_each_inputs_axis(stateful: dict) -> None:
    job, report = stateful["job"], stateful["report"]
    assert job["status"] == "succeeded", job
    calibration, evaluation = split_indices(SAMPLES, Recipe.model_validate(RECIPE))
    split = report["dataset"]
    assert split["num_samples"] == SAMPLES and split["batch_axes"] == {"x": 0, "state": 1, "sr": None}
    assert split["calibration"] == {
        "count": 30,
        "sha256": hashlib.sha256("\n".join(map(str, calibration)).encode()).hexdigest(),
    }
    assert split["evaluation"] == {
        "count": 10,
        "sha256": hashlib.sha256("\n".join(map(str, evaluation)).encode()).hexdigest(),
    }
    assert split["label_source"] == "npz array 'labels'"
    # quantcore batched the parts along the same axes: 30 calibration samples in 8, 8, 8, 6
    # 30 calibration samples: too few to choose a clipping percentile on (quantcore.calibrate.clip_search.MIN_SAMPLES)
    assert report["calibration"] == {"num_samples": 30, "batch_size": 8, "num_batches": 4, "percentile_search": None}
    assert report["evaluation"]["num_samples"] == 10
    assert report["evaluation"]["fp32"]["top1"] == 1.0  # labels aligned with the samples of x and state


def test_engine_profile_bounds_the_state_along_axis_1(stateful: dict) -> None:
    engine = stateful["report"]["engine"]
    assert engine["status"] == "skipped"  # no GPU here; the profile is still derived and recorded
    (profile,) = engine["metadata"]["profiles"]
    # fed at (2, 8, 16) x3 and (2, 6, 16); axis 1 widened to the deployment batches 1 and 32; sr is a
    # scalar: no dimension to bound
    assert profile == {
        "state": {"min": [2, 1, 16], "opt": [2, 8, 16], "max": [2, 32, 16]},
        "x": {"min": [1, 16], "opt": [8, 16], "max": [32, 16]},
    }


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"state": np.zeros((SAMPLES, 2, 16), np.float32)}, ("input 'state' axis 0 must be 2", "samples on axis 1")),
        ({"state": np.zeros((2, 30, 16), np.float32)}, ("'x' axis 0: 40", "'state' axis 1: 30")),
        ({"sr": np.full(SAMPLES, 0.5, np.float32)}, ("input 'sr' expects rank 0", "a constant input")),
    ],
    ids=["state-samples-first", "state-too-few-samples", "sr-per-sample"],
)
def test_mismatched_dataset_is_refused_naming_input_and_axis(
    service: Service, stateful: dict, change: dict, needles: tuple[str, ...]
) -> None:
    with service.client(stateful["key"]) as client:
        dataset = client.post("/datasets", files={"file": ("bad.npz", npz(**{**stateful["data"], **change}))})
        assert dataset.status_code == 201, dataset.text  # which axis holds samples depends on the model
        body = assert_problem(
            client.post(
                "/jobs",
                json={"model_id": stateful["model"]["id"], "dataset_id": dataset.json()["id"], "recipe": RECIPE},
            ),
            422,
            *needles,
        )
        assert [e["field"] for e in body["errors"]] == ["dataset_id"]
        assert [j["id"] for j in client.get("/jobs").json()["items"]] == [stateful["job"]["id"]]
