"""The whole path through real processes: upload, submit, follow events, download, verify the model.

Runs once per database (the `service` fixture), with a real Celery worker on the real Redis.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from jobs.report_schema import Report
from samples.digits import HELDOUT_FILE
from tests.conftest import Service
from tests.test_report_schema import undocumented

pytestmark = pytest.mark.e2e


def read_events(response: httpx.Response, limit: int | None = None) -> list[dict]:
    """Parse an SSE body into [{id, event, data}] (stops after `limit` events when given)."""
    events, current = [], {}
    for line in response.iter_lines():
        if line == "":
            if "data" in current:
                events.append(current)
                if limit is not None and len(events) >= limit:
                    break
            current = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(": ")
            current[field] = json.loads(value) if field == "data" else value
    return events


def follow(client: httpx.Client, job_id: str) -> list[dict]:
    """Read a few events, drop the connection, resume with Last-Event-ID until the job ends."""
    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response, limit=2)
    with client.stream("GET", f"/jobs/{job_id}/events", headers={"Last-Event-ID": events[-1]["id"]}) as response:
        events += read_events(response)
    return events


@pytest.fixture(scope="module")
def finished_job(service: Service, digits: tuple[Path, Path]) -> dict:
    model_path, _ = digits
    data_path = model_path.parent / HELDOUT_FILE  # samples the model never saw in training
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), data_path.read_bytes())
    with service.client(key) as client:
        recipe = {
            "calibration": {"observer": "percentile", "num_samples": 512},
            "evaluation": {"holdout_fraction": 0.3},
        }
        job = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": recipe})
        assert job.status_code == 202, job.text
        assert job.json()["status"] == "queued"
        job_id = job.json()["id"]
        events = follow(client, job_id)
        final = client.get(f"/jobs/{job_id}").json()
        artifacts = client.get(f"/jobs/{job_id}/artifacts").json()
        report = client.get(f"/jobs/{job_id}/report").json()
        downloaded = client.get(f"/jobs/{job_id}/artifacts/model.qdq.onnx").content
        tqc = client.get(f"/jobs/{job_id}/artifacts/tqc.json").json()
        partial = client.get(f"/jobs/{job_id}/artifacts/model.qdq.onnx", headers={"Range": "bytes=0-99"})
    return {
        "key": key,
        "job": final,
        "events": events,
        "artifacts": artifacts,
        "report": report,
        "model_bytes": downloaded,
        "tqc": tqc,
        "partial": partial,
        "data_path": data_path,
        "fp32_path": model_path,
    }


def test_job_succeeds_with_stage_progress_events(finished_job: dict) -> None:
    job, events = finished_job["job"], finished_job["events"]
    assert job["status"] == "succeeded", job
    assert job["progress"] == 1.0 and job["error"] is None and job["attempts"] == 1
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids)), "events repeated or out of order across the Last-Event-ID resume"
    stages = [e["data"]["stage"] for e in events if e["event"] == "stage"]
    for stage in ("load", "prepare", "annotate", "calibrate", "export", "evaluate", "store"):
        assert stage in stages, (stage, stages)
    progress = [e["data"]["progress"] for e in events if e["event"] in ("stage", "progress")]
    assert progress == sorted(progress), "overall progress went backwards"
    statuses = [e["data"]["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses[0] == "queued" and statuses[-1] == "succeeded" and "running" in statuses


def test_artifacts_download_and_range(finished_job: dict) -> None:
    names = {a["name"] for a in finished_job["artifacts"]}
    assert names == {"model.qdq.onnx", "tqc.json", "report.json", "report.html"}
    model_artifact = next(a for a in finished_job["artifacts"] if a["name"] == "model.qdq.onnx")
    assert model_artifact["size_bytes"] == len(finished_job["model_bytes"])
    import hashlib

    assert model_artifact["sha256"] == hashlib.sha256(finished_job["model_bytes"]).hexdigest()
    partial = finished_job["partial"]
    assert partial.status_code == 206
    assert partial.content == finished_job["model_bytes"][:100]


def test_downloaded_model_is_valid_qdq_with_expected_nodes(finished_job: dict) -> None:
    model = onnx.load_from_string(finished_job["model_bytes"])
    onnx.checker.check_model(model, full_check=True)
    fp32 = onnx.load(finished_job["fp32_path"])
    assert [i.name for i in model.graph.input] == [i.name for i in fp32.graph.input]
    assert [o.name for o in model.graph.output] == [o.name for o in fp32.graph.output]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch kept
    tensors = finished_job["tqc"]["tensors"]
    activations = [name for name, t in tensors.items() if t["kind"] == "activation"]
    weights = [name for name, t in tensors.items() if t["kind"] != "activation"]
    ops = [node.op_type for node in model.graph.node]
    # One Q→DQ pair per quantized activation; weights are stored int8 with only a DequantizeLinear.
    assert ops.count("QuantizeLinear") == len(activations) > 0
    assert ops.count("DequantizeLinear") == len(activations) + len(weights)
    report_model = finished_job["report"]["evaluation"]["model"]
    assert report_model["quantize_linear_nodes"] == ops.count("QuantizeLinear")
    assert all(node.op_type != "BatchNormalization" for node in model.graph.node)  # folded before quantizing


def _sqnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - candidate) ** 2)))


def test_outputs_agree_with_fp32_as_the_report_says(finished_job: dict, tmp_path: Path) -> None:
    qdq_path = tmp_path / "model.qdq.onnx"
    qdq_path.write_bytes(finished_job["model_bytes"])
    with np.load(finished_job["data_path"]) as archive:
        images, labels = archive["input"], archive["labels"]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # exact QDQ arithmetic
    fp32 = ort.InferenceSession(str(finished_job["fp32_path"]), providers=["CPUExecutionProvider"])
    qdq = ort.InferenceSession(str(qdq_path), options, providers=["CPUExecutionProvider"])
    reference = fp32.run(None, {"input": images})[0]
    quantized = qdq.run(None, {"input": images})[0]
    evaluation = finished_job["report"]["evaluation"]
    reported = evaluation["qdq_exact"]["outputs"]["logits"]
    measured = _sqnr_db(reference, quantized)
    # The report measured the held-out 30%; here all samples. SQNR is a ratio of sums over samples,
    # so the two agree to within sampling noise: 1.5 dB is several times the spread seen between splits.
    assert abs(measured - reported["sqnr_db"]) < 1.5, (measured, reported)
    assert reported["sqnr_db"] > 25, reported  # INT8 on a small CNN: ~37 dB measured; 25 flags a real regression
    # The output error is bounded as the SQNR implies: noise power = signal power / 10^(SQNR/10).
    noise = np.mean((reference - quantized) ** 2)
    assert noise <= np.mean(reference**2) / 10 ** ((reported["sqnr_db"] - 1.5) / 10)
    agreement = float(np.mean(reference.argmax(1) == quantized.argmax(1)))
    assert agreement >= 0.98, agreement
    assert reported["argmax_agreement"] >= 0.98, reported
    assert evaluation["qdq_deployed"]["outputs"]["logits"]["argmax_agreement"] is not None
    fp32_top1, qdq_top1 = evaluation["fp32"]["top1"], evaluation["qdq_exact"]["top1"]
    assert fp32_top1 > 0.9 and qdq_top1 >= fp32_top1 - 0.02, (fp32_top1, qdq_top1)
    assert float(np.mean(quantized.argmax(1) == labels)) >= float(np.mean(reference.argmax(1) == labels)) - 0.02


def test_cancel_a_running_job(service: Service, finished_job: dict) -> None:
    with service.client(finished_job["key"]) as client:
        job = finished_job["job"]
        # 4000 batches of one sample: calibration lasts long enough to be canceled in the middle.
        with np.load(finished_job["data_path"]) as archive:
            buffer = io.BytesIO()
            np.savez(buffer, input=np.tile(archive["input"], (10, 1, 1, 1)))
        dataset = client.post("/datasets", files={"file": ("tiled.npz", buffer.getvalue())}).json()
        slow = {"calibration": {"observer": "minmax", "batch_size": 1, "num_samples": 4000}}
        created = client.post(
            "/jobs", json={"model_id": job["model_id"], "dataset_id": dataset["id"], "recipe": slow}
        ).json()
        deadline = time.monotonic() + 60
        while client.get(f"/jobs/{created['id']}").json()["stage"] != "calibrate":
            assert time.monotonic() < deadline, "job never reached calibrate"
            time.sleep(0.05)
        assert client.post(f"/jobs/{created['id']}/cancel").json()["status"] in ("canceling", "canceled")
        with client.stream("GET", f"/jobs/{created['id']}/events") as response:
            events = read_events(response)
        final = client.get(f"/jobs/{created['id']}").json()
        assert final["status"] == "canceled", final
        assert events[-1]["data"]["data"]["status"] == "canceled"
        assert client.get(f"/jobs/{created['id']}/artifacts").json() == []
        stored = list((service.var_dir / "storage").glob(f"*/jobs/{created['id']}/*"))
        assert stored == [], stored


def test_report_has_cpu_latency_and_an_honest_engine_stage(finished_job: dict) -> None:
    report = finished_job["report"]
    cpu = report["latency"]["cpu"]
    for model in ("fp32", "quantized"):
        summary = cpu[model]["batch_1"]
        assert 0 < summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"]
    engine = report["engine"]  # asked for by default on the tensorrt platform
    try:
        import tensorrt  # noqa: F401

        has_tensorrt = True
    except ImportError:
        has_tensorrt = False
    if not has_tensorrt:  # this machine: no GPU, no TensorRT. The stage must say so, not pretend.
        assert engine["status"] == "skipped" and "TensorRT" in engine["reason"], engine
        assert engine["latency"] is None and engine["comparison"] is None
        assert "model.engine" not in {a["name"] for a in finished_job["artifacts"]}
    assert engine["qdq_checks"]["errors"] == 0, engine["qdq_checks"]  # TensorRT's Q/DQ rules hold anyway
    events = finished_job["events"]
    assert {"latency", "engine"} <= {e["data"]["stage"] for e in events if e["event"] == "stage"}


def test_served_report_validates_and_ranks_layers(finished_job: dict) -> None:
    report = Report.model_validate(finished_job["report"])  # the OpenAPI schema of GET /jobs/{id}/report
    assert report.analysis is not None and report.target is None
    assert undocumented(report) == []  # the service's own additions (the split record) are in the schema too
    assert report.dataset is not None and report.dataset.kind == "arrays" and report.dataset.evaluation.count > 0
    ranks = [layer.rank for layer in report.analysis.layers]
    assert ranks == list(range(1, len(ranks) + 1)) and report.analysis.layers[0].sqnr_db is not None
    assert report.evaluation.fp32.task_metrics["top1"] == report.evaluation.fp32.top1


def test_unmet_target_fails_the_job_and_keeps_the_best_model(service: Service, finished_job: dict) -> None:
    job = finished_job["job"]
    # No INT8 model of the digits CNN with at most one float layer has a 100 dB output SQNR (measured ~37 dB).
    recipe = {"target": {"metric": "sqnr", "threshold": 100, "max_float_layers": 1}, "deploy": {"cpu_latency": False}}
    with service.client(finished_job["key"]) as client:
        created = client.post(
            "/jobs", json={"model_id": job["model_id"], "dataset_id": job["dataset_id"], "recipe": recipe}
        ).json()
        with client.stream("GET", f"/jobs/{created['id']}/events") as response:
            read_events(response)
        final = client.get(f"/jobs/{created['id']}").json()
        names = {a["name"] for a in client.get(f"/jobs/{created['id']}/artifacts").json()}
        report = client.get(f"/jobs/{created['id']}/report").json()
        page = client.get(f"/jobs/{created['id']}/artifacts/report.html")
    assert final["status"] == "failed" and "NOT met" in final["error"], final
    assert {"model.qdq.onnx", "report.json", "report.html"} <= names
    target = report["target"]
    assert target["met"] is False and target["verdict"] == final["error"]
    assert [len(step["float_layers"]) for step in target["steps"]] == [0, 1]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "NOT met" in page.text and "<svg" in page.text
