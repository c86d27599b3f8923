"""The job page against answers the test controls (Playwright request interception on the job's
routes): a real report written by quantcore (the planted-outlier CNN with an accuracy target, so it
holds the layer-wise analysis and the target's steps), the same report when the target was not met,
plus a section a later engine may add; and an event stream that drops mid-way.
"""

from __future__ import annotations

import json
import re
import uuid

import numpy as np
import pytest
from playwright.sync_api import expect

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize
from quantcore.config import AccuracyTarget
from tests.conftest import Service
from tests.frontend.conftest import audit, overflow, screenshot, sign_in
from tests.quantcore.models import planted_outlier, save

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]

JOB_ID = str(uuid.UUID(int=7))
NOW = "2026-01-01T00:00:00+00:00"
JOB = {
    "id": JOB_ID,
    "model_id": str(uuid.UUID(int=1)),
    "dataset_id": str(uuid.UUID(int=2)),
    "recipe": {},
    "status": "succeeded",
    "stage": "store",
    "progress": 1.0,
    "error": None,
    "attempts": 1,
    "created_at": NOW,
    "updated_at": NOW,
    "started_at": NOW,
    "finished_at": NOW,
}
MODEL_FILE = "planted-outlier.onnx"
# The chart's text alternative lists the layers worst first: the planted layer conv3 leads.
RANKED = re.compile(r"lowest first\): conv3 \d+\.\d+, ")


def real_report(tmp_path, target: AccuracyTarget) -> dict:
    """quantcore's report.json for the planted-outlier CNN (labels: the FP32 model's own predictions)."""
    path = save(planted_outlier(), tmp_path / "planted.onnx")
    data = np.random.default_rng(1).normal(size=(64, 3, 8, 8)).astype(np.float32)
    config = QuantizeConfig(platform="tensorrt", target=target)
    labels = np.arange(16) % 10
    report = quantize(path, {"input": data[:48]}, {"input": data[48:]}, config, tmp_path / "out", labels=labels).report
    Report.model_validate(report)  # the shape the API serves
    return report


def serve_job(page, job: dict, report: dict) -> None:
    def fulfil(route) -> None:
        path = route.request.url.split("/api/v1", 1)[1]
        if path.endswith("/events"):
            event = {
                "id": 1,
                "kind": "status",
                "stage": None,
                "progress": 1.0,
                "message": job["status"],
                "data": {"status": job["status"]},
                "created_at": NOW,
            }
            body = f"id: 1\nevent: status\ndata: {json.dumps(event)}\n\n"
            route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)
        elif path.endswith("/artifacts"):
            artifact = {
                "name": "report.json",
                "media_type": "application/json",
                "size_bytes": 10,
                "sha256": "0" * 64,
                "url": f"/api/v1/jobs/{JOB_ID}/artifacts/report.json",
            }
            route.fulfill(json=[artifact])
        elif path.endswith("/report"):
            route.fulfill(json=report)
        else:
            route.fulfill(json=job)

    page.route(f"**/api/v1/jobs/{JOB_ID}**", fulfil)
    serve_model(page, job)


def serve_model(page, job: dict) -> None:
    """The job's model, which the job page names."""
    model = {"id": job["model_id"], "filename": MODEL_FILE, "status": "ready", "sha256": "0" * 64, "size_bytes": 1}
    page.route(f"**/api/v1/models/{job['model_id']}", lambda route: route.fulfill(json=model))


def test_report_view_ranks_layers_and_shows_the_target(page, service: Service, tmp_path):
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.999))
    report["reconstruction"] = {"status": "skipped"}  # a section a later engine adds: shown generically
    serve_job(page, JOB, report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    section = page.locator("#report")
    model = report["evaluation"]["model"]
    ratio = model["fp32_bytes"] / model["qdq_bytes"]
    expect(section.locator("#report-summary")).to_contain_text(f"{ratio:.2f}\u00d7 smaller")
    expect(section.locator("#report-summary")).to_contain_text("Top-5 · FP32")
    expect(page.locator("#target-verdict")).to_contain_text("met: cosine")
    expect(page.locator("#target-steps tbody tr")).to_have_count(len(report["target"]["steps"]))
    expect(page.locator("#target-steps tbody tr").nth(1)).to_contain_text("conv3")
    layers = page.locator("#layers")
    expect(layers.locator("canvas[role=img]")).to_have_attribute("aria-label", RANKED)
    expect(layers.locator("#layer-table tbody tr")).to_have_count(len(report["analysis"]["layers"]))
    expect(layers.locator("#layer-table tbody tr").first).to_contain_text("conv3")
    expect(layers.locator("#tensor-table tbody tr")).to_have_count(len(report["analysis"]["tensors"]))
    expect(page.locator("#output-metrics")).to_contain_text("relative error p99")
    expect(section.get_by_text("reconstruction", exact=True)).to_be_visible()
    expect(page.locator("#parity-verdict")).to_contain_text(report["parity"]["reason"])
    expect(page.locator("#parity-verdict")).to_have_class(re.compile("info"))
    expect(page.locator("#run-as")).to_have_count(0)  # nothing to change in how it runs
    screenshot(page, "report-with-layers")
    audit(page, "report-with-layers")


def test_job_page_shows_the_cpu_benchmark_names_the_model_and_fits_1366_px(page, service: Service, tmp_path):
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.999))
    serve_job(page, JOB, report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("dl.facts").first).to_contain_text(f"Model{MODEL_FILE}")
    cpu = report["latency"]["cpu"]
    rows = page.locator("#latency table tbody tr")
    expect(rows).to_have_count(len(cpu["batch_sizes"]))
    for row, batch in zip(rows.all(), cpu["batch_sizes"], strict=True):
        speedup = cpu["speedup_p50"][f"batch_{batch}"]
        expect(row.locator("td").first).to_have_text(str(batch))
        expect(row).to_contain_text(f"{speedup:.2f}\u00d7")
    expect(page.locator("#latency")).to_contain_text("Evaluation time per sample (not a benchmark)")
    expect(page.locator("#report details.generic summary", has_text="Latency")).to_have_count(0)
    screenshot(page, "job-page-1366")
    assert page.viewport_size["width"] == 1366
    assert overflow(page, "#output-metrics") == {"element": 0, "page": 0}


def test_unmet_target_is_shown_as_a_failure_with_its_report(page, service: Service, tmp_path):
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.9999999, max_float_layers=1))
    failed = {**JOB, "status": "failed", "error": report["target"]["verdict"]}
    serve_job(page, failed, report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#job-status")).to_have_text("failed")
    expect(page.locator("#target-verdict")).to_contain_text("NOT met")
    expect(page.locator("#target-verdict")).to_have_class(re.compile("error"))
    expect(page.locator("#layer-table tbody tr").first).to_contain_text("conv3")
    screenshot(page, "report-target-not-met")
    audit(page, "report-target-not-met")


def test_a_deployment_that_needs_rewrites_off_says_how_to_run_it(page, service: Service, tmp_path):
    """The parity section as the pipeline writes it when a remedy was needed (the reason and remedy texts
    of quantcore.evaluate.parity for an ONNX Runtime rewrite that changed the results): the dashboard shows what
    was changed and the exact InferenceSession call that runs the model as measured."""
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.999))
    before = dict(report["parity"], agree=False, reason="deployed vs exact SQNR 12.0 dB < 30.0 dB")
    remedy = "ONNX Runtime 1.32.0's graph rewrite 'QDQSelectorActionTransformer' changes this model's results"
    report["parity"] = {**report["parity"], "remedy": remedy, "before_remedy": before}
    report["config"]["disabled_optimizers"] = ["QDQSelectorActionTransformer"]
    serve_job(page, JOB, report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#parity-remedy")).to_contain_text(remedy)
    expect(page.locator("#run-as")).to_contain_text(
        'onnxruntime.InferenceSession(path, disabled_optimizers=["QDQSelectorActionTransformer"])'
    )
    audit(page, "report-rewrites-off")


def test_event_stream_resumes_with_last_event_id_after_a_drop(page, service: Service):
    """The fetch-based SSE reader: a stream that closes before the terminal event is resumed with
    the key header and `Last-Event-ID`, and no event is shown twice."""
    running = {**JOB, "status": "running", "finished_at": None, "progress": 0.3, "stage": "calibrate"}
    seen: list[dict] = []

    def event(number: int, kind: str, message: str, data: dict | None = None) -> str:
        body = {
            "id": number,
            "kind": kind,
            "stage": "calibrate",
            "progress": 0.1 * number,
            "message": message,
            "data": data,
            "created_at": NOW,
        }
        return f"id: {number}\nevent: {kind}\ndata: {json.dumps(body)}\n\n"

    def fulfil(route) -> None:
        path = route.request.url.split("/api/v1", 1)[1]
        if path.endswith("/events"):
            seen.append(route.request.headers)
            if len(seen) == 1:  # dropped after two events
                body = "retry: 100\n\n" + event(1, "stage", "calibrate started") + event(2, "progress", "batch 1/2")
            else:
                body = event(3, "progress", "batch 2/2") + event(4, "status", "canceled", {"status": "canceled"})
            route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)
        elif path.endswith("/artifacts"):
            route.fulfill(json=[])
        else:
            route.fulfill(json=running if len(seen) < 2 else {**running, "status": "canceled"})

    page.route(f"**/api/v1/jobs/{JOB_ID}**", fulfil)
    serve_model(page, running)
    key = service.new_key()
    sign_in(page, service.url, key, f"/jobs/{JOB_ID}")
    expect(page.locator("#job-status")).to_have_text("canceled")
    expect(page.locator("#event-log li")).to_have_count(4)
    assert len(seen) == 2
    assert "last-event-id" not in seen[0] and seen[1]["last-event-id"] == "2"
    assert seen[1]["x-api-key"] == key
