"""The job page against answers the test controls (Playwright request interception on the job's
routes): a report shaped as later engine versions may write it (per-layer analysis ranked by harm,
latency, unknown sections shown generically), and an event stream that drops mid-way.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.conftest import audit, screenshot, sign_in

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
LAYERS = [
    {"name": "/conv1/Conv_output_0", "sqnr_db": 31.5, "isolated_sqnr_db": 45.0},
    {"name": "/head/Gemm_output_0", "sqnr_db": 12.25, "isolated_sqnr_db": 14.0},  # the most harmful
    {"name": "/conv2/Conv_output_0", "sqnr_db": 27.0, "isolated_sqnr_db": 39.0},
]
# The chart's text alternative lists the layers worst first: lowest SQNR.
RANKED = re.compile(r"lowest first\): /head/Gemm_output_0 12\.25, /conv2/Conv_output_0")
REPORT = {
    "format": 2,
    "config": {"platform": "tensorrt"},
    "evaluation": {
        "model": {"fp32_bytes": 47_000, "qdq_bytes": 18_000, "quantize_linear_nodes": 6},
        "num_samples": 359,
        "fp32": {"top1": 0.98, "latency_ms": 1.9},
        "qdq_exact": {"top1": 0.97, "outputs": {"logits": {"sqnr_db": 30.0, "cosine": 0.999}}},
        "qdq_deployed": {"top1": 0.969, "latency_ms": 0.8, "outputs": {"logits": {"sqnr_db": 29.5, "cosine": 0.998}}},
    },
    "analysis": {"layers": LAYERS},
    "engine": {"status": "skipped", "reason": "no CUDA device"},
    "stage_seconds": {"calibrate": 0.5},
    "warnings": ["block /head could not be reconstructed"],
}


def test_report_view_ranks_layers_and_shows_unknown_sections(page, service: Service):
    def fulfil(route) -> None:
        path = route.request.url.split("/api/v1", 1)[1]
        if path.endswith("/events"):
            event = {
                "id": 1,
                "kind": "status",
                "stage": None,
                "progress": 1.0,
                "message": "succeeded",
                "data": {"status": "succeeded"},
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
            route.fulfill(json=REPORT)
        else:
            route.fulfill(json=JOB)

    page.route(f"**/api/v1/jobs/{JOB_ID}**", fulfil)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    report = page.locator("#report")
    expect(report.locator("#report-summary")).to_contain_text("2.61\u00d7 smaller")
    expect(report.locator("#report-summary")).to_contain_text("-1.00 points vs FP32")
    expect(report).to_contain_text("block /head could not be reconstructed")
    layers = page.locator("#layers")
    expect(layers.get_by_role("heading")).to_contain_text("SQNR (dB)")
    chart = layers.locator("canvas[role=img]")
    expect(chart).to_have_attribute("aria-label", RANKED)
    first_row = layers.locator("tbody tr").first
    expect(first_row).to_contain_text("/head/Gemm_output_0")
    expect(page.locator("#latency-table")).to_contain_text("0.8")
    expect(report.get_by_text("engine", exact=True)).to_be_visible()  # an unknown section, shown generically
    screenshot(page, "report-with-layers")
    audit(page, "report-with-layers")


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
    key = service.new_key()
    sign_in(page, service.url, key, f"/jobs/{JOB_ID}")
    expect(page.locator("#job-status")).to_have_text("canceled")
    expect(page.locator("#event-log li")).to_have_count(4)
    assert len(seen) == 2
    assert "last-event-id" not in seen[0] and seen[1]["last-event-id"] == "2"
    assert seen[1]["x-api-key"] == key
