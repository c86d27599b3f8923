"""The jobs list and the compare page against answers the test controls (Playwright request
interception): which columns they show, and that their tables fit a 1366 px wide window."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.conftest import overflow, screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]

NOW = "2026-01-01T00:00:00+00:00"
MODEL_ID = str(uuid.UUID(int=11))
MODEL = {
    "id": MODEL_ID,
    "filename": "resnet50-v1.5-opset17.onnx",
    "status": "ready",
    "sha256": "0" * 64,
    "size_bytes": 1,
}
# A stored recipe is the validated one, every default filled in (api/routes/jobs.py).
RECIPE = {
    "platform": "onnxruntime",
    "precision": "int8",
    "calibration": {"observer": "percentile", "percentile": 99.99, "num_samples": 512, "batch_size": 16},
    "target": {"metric": "cosine", "threshold": 0.999, "max_float_layers": None},
    "reconstruction": {"method": "qdrop", "iters": 2000},
}
ARTIFACT_NAMES = ["model.qdq.onnx", "tqc.json", "report.json", "report.html", "model.engine", "engine.json"]


def job(number: int) -> dict:
    return {
        "id": str(uuid.UUID(int=100 + number)),
        "model_id": MODEL_ID,
        "dataset_id": str(uuid.UUID(int=12)),
        "recipe": RECIPE,
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


def comparison_row(number: int) -> dict:
    """A finished job with every figure and artifact: the widest row the compare table shows."""
    job_id = str(uuid.UUID(int=100 + number))
    return {
        "job_id": job_id,
        "status": "succeeded",
        "error": None,
        "dataset_id": str(uuid.UUID(int=12)),
        "created_at": NOW,
        "finished_at": NOW,
        "recipe": {
            "platform": "tensorrt-fp8",
            "precision": "fp8",
            "observer": "percentile",
            "percentile": 99.999,
            "calibration_samples": 1024,
            "reconstruction": {"method": "qdrop"},
            "target": {"metric": "top1_drop", "threshold": 0.5, "max_float_layers": 12},
        },
        "metrics": {
            "top1_fp32": 0.76132,
            "top1_quantized": 0.75418,
            "top1_deployed": 0.75402,
            "top1_drop": 0.714,
            "sqnr_db_min": 23.4567,
            "cosine_min": 0.998765,
            "target_met": True,
        },
        "size": {"fp32_bytes": 102_548_992.0, "quantized_bytes": 25_721_344.0},
        "latency": {"fp32_p50_ms": 12.3456, "quantized_p50_ms": 4.5678},
        "artifacts": [
            {
                "name": name,
                "media_type": "application/octet-stream",
                "size_bytes": 1,
                "sha256": "0" * 64,
                "url": f"/api/v1/jobs/{job_id}/artifacts/{name}",
            }
            for name in ARTIFACT_NAMES
        ],
        "report_url": f"/api/v1/jobs/{job_id}/report",
    }


def test_jobs_list_shows_platform_and_recipe(page, service: Service):
    page.route(
        re.compile(r"/api/v1/jobs(\?.*)?$"), lambda route: route.fulfill(json={"items": [job(1)], "next_cursor": None})
    )
    page.route(f"**/api/v1/models/{MODEL_ID}", lambda route: route.fulfill(json=MODEL))
    sign_in(page, service.url, service.new_key())
    table = page.locator("#jobs-table")
    expect(table.locator("thead th")).to_have_text(
        ["Job", "Model", "Platform", "Recipe", "Status", "Stage", "Progress", "Created", "Finished"]
    )
    cells = table.locator("tbody tr").first.locator("td")
    expect(cells.nth(1)).to_have_text(MODEL["filename"])
    expect(cells.nth(2)).to_have_text("onnxruntime")
    expect(cells.nth(3)).to_have_text("int8 percentile 99.99 qdrop target cosine \u2265 0.999")
    assert overflow(page, "#jobs-table") == {"element": 0, "page": 0}


def test_compare_table_fits_1366_px(page, service: Service):
    body = {
        "model_id": MODEL_ID,
        "filename": MODEL["filename"],
        "size_bytes": 102_548_992,
        "items": [comparison_row(n) for n in range(3)],
        "next_cursor": None,
    }
    searched = body["items"][2]["recipe"]  # a job whose recipe was the start of a search
    searched.update(strategy="auto", auto={"objective": {"metric": "cosine", "threshold": 0.995}}, target=None)
    page.route(f"**/api/v1/models/{MODEL_ID}/comparison**", lambda route: route.fulfill(json=body))
    sign_in(page, service.url, service.new_key(), f"/models/{MODEL_ID}/compare")
    expect(page.locator("#compare-table tbody tr")).to_have_count(3)
    expect(page.locator("#compare-table tbody tr").nth(2).locator(".recipe-summary")).to_contain_text(
        "auto cosine \u2265 0.995"
    )
    screenshot(page, "compare-1366")
    assert page.viewport_size["width"] == 1366
    assert overflow(page, "#compare-table") == {"element": 0, "page": 0}
    # every column, the last included, lies inside the window
    right = page.locator("#compare-table thead th").last.evaluate("th => th.getBoundingClientRect().right")
    assert right <= 1366
