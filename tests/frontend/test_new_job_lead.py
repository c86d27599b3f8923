"""The new-job page: the lead questions (where the model runs, what matters most) and the settings
preset produce the recipe posted (read from the intercepted POST, and validated with the service's
own `Recipe`); Advanced is collapsed with worded section titles; overrides are rows, and the real
API's 422 for a row is shown beside that row's field."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from playwright.sync_api import expect

from jobs.recipe import Recipe
from tests.conftest import Service
from tests.frontend.conftest import audit, overflow, screenshot, sign_in

MODEL_ID, DATASET_ID = str(uuid.UUID(int=31)), str(uuid.UUID(int=32))
UNAVAILABLE = {
    "type": "about:blank",
    "title": "Unavailable",
    "status": 503,
    "detail": "test",
    "instance": "/api/v1/jobs",
}
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]


def listing(item: dict):
    """A route handler answering a one-item page of a collection."""
    return lambda route: route.fulfill(json={"items": [item], "next_cursor": None})


def open_form(page, service: Service) -> list[dict]:
    """The new-job page with one ready model and one array dataset; returns the job bodies posted
    (each answered 503, so the page stays on the form: the job page is not under test here)."""
    model = {"id": MODEL_ID, "filename": "m.onnx", "status": "ready", "sha256": "0" * 64, "size_bytes": 1}
    dataset = {
        "id": DATASET_ID,
        "filename": "d.npz",
        "kind": "arrays",
        "sha256": "0" * 64,
        "size_bytes": 1,
        "num_samples": 8,
    }
    for collection, item in (("models", model), ("datasets", dataset)):
        page.route(re.compile(rf"/api/v1/{collection}(\?.*)?$"), listing(item))
    posted: list[dict] = []

    def create(route) -> None:
        if route.request.method != "POST":
            return route.fallback()
        posted.append(json.loads(route.request.post_data))
        route.fulfill(status=503, content_type="application/problem+json", json=UNAVAILABLE)

    page.route(re.compile(r"/api/v1/jobs$"), create)
    page.console.allowed_statuses.add(503)
    sign_in(page, service.url, service.new_key(), "/jobs/new")
    expect(page.get_by_role("heading", name="New job")).to_be_visible()
    return posted


def submit(page, posted: list[dict]) -> dict:
    page.get_by_role("button", name="Start job").click()
    expect(page.locator("#form-errors")).to_contain_text("not started: test")
    recipe = posted[-1]["recipe"]
    Recipe.model_validate(recipe)  # what the API would accept
    return recipe


@pytest.mark.parametrize(
    ("runs_on", "matters", "platform", "threshold", "cpu_objective"),
    [
        ("TensorRT on an NVIDIA GPU", "Balance", "tensorrt", 0.99, "accuracy"),
        ("TensorRT FP8 (Hopper/Ada)", "Accuracy", "tensorrt-fp8", 0.999, "accuracy"),
        ("ONNX Runtime on a CPU", "Balance", "onnxruntime", 0.99, "latency"),
        ("ONNX Runtime, transformers", "Size", "onnxruntime-dynamic", 0.98, "size"),
    ],
)
def test_lead_questions_produce_the_recipe(
    page, service: Service, runs_on, matters, platform, threshold, cpu_objective
):
    posted = open_form(page, service)
    page.get_by_role("radio", name=runs_on).check()  # a substring: each name goes on past the choice
    page.get_by_role("radio", name=re.compile(f"^{matters}")).check()
    recipe = submit(page, posted)
    assert recipe["platform"] == platform
    assert recipe["strategy"] == "auto"  # the default way the settings are found
    assert recipe["auto"]["objective"] == {"metric": "cosine", "threshold": threshold}
    assert recipe["deploy"]["cpu_objective"] == cpu_objective
    assert "precision" not in recipe  # the platform's own (fp8 on tensorrt-fp8)


def test_a_fixed_preset_keeps_the_lead_answers(page, service: Service):
    posted = open_form(page, service)
    page.get_by_role("radio", name=re.compile("ONNX Runtime on a CPU")).check()
    page.get_by_role("radio", name=re.compile("Quick check")).check()
    recipe = submit(page, posted)
    assert recipe["strategy"] == "fixed"
    assert recipe["platform"] == "onnxruntime"
    assert recipe["calibration"]["observer"] == "minmax" and recipe["calibration"]["num_samples"] == 128


def test_advanced_is_collapsed_with_worded_sections_and_the_page_fits(page, service: Service):
    open_form(page, service)
    advanced = page.locator("#advanced")
    expect(advanced).not_to_have_attribute("open", "")
    expect(page.get_by_label("Observer", exact=True)).to_be_hidden()
    screenshot(page, "new-job-lead-1366")
    audit(page, "new-job-lead")
    advanced.locator("summary").click()
    legends = advanced.locator("legend").all_inner_texts()
    for worded in ("General", "Calibration", "Target", "Reconstruction", "Auto", "Objective", "Deploy", "Overrides"):
        assert any(text.strip() == worded for text in legends), (worded, legends)
    assert not [text for text in legends if "Spec" in text], legends
    assert overflow(page, "#advanced") == {"element": 0, "page": 0}
    screenshot(page, "new-job-advanced-1366")
    audit(page, "new-job-advanced")


def test_override_rows_add_remove_and_submit(page, service: Service):
    posted = open_form(page, service)
    # a fixed preset (it resets Advanced): academic takes 4 bits
    page.get_by_role("radio", name=re.compile("Defaults")).check()
    page.locator("#advanced summary").click()
    page.locator("#f-recipe-platform").select_option("academic")
    add = page.get_by_role("button", name="Add a row")
    for _ in range(3):
        add.click()
    page.get_by_label("Pattern of row 1").fill("/stem/*")
    page.get_by_label("Bits of row 1").fill("4")
    page.get_by_label("Pattern of row 2").fill("/unused/*")
    page.get_by_label("Observer of row 2").select_option("mse")
    page.get_by_label("Pattern of row 3").fill("/head/*")
    page.get_by_label("Observer of row 3").select_option("minmax")
    page.locator("#f-recipe-overrides tbody tr").nth(1).get_by_role("button", name="Remove").click()
    expect(page.locator("#f-recipe-overrides tbody tr")).to_have_count(2)
    expect(page.get_by_label("Pattern of row 2")).to_have_value("/head/*")  # renumbered
    recipe = submit(page, posted)
    assert recipe["overrides"] == [{"pattern": "/stem/*", "bits": 4}, {"pattern": "/head/*", "observer": "minmax"}]


def test_the_apis_422_is_shown_beside_the_override_field(page, service: Service):
    """The POST reaches the real API: the body is validated before the model is looked up."""
    open_form(page, service)
    page.unroute(re.compile(r"/api/v1/jobs$"))
    page.console.allowed_statuses.add(422)
    page.locator("#advanced summary").click()
    page.get_by_role("button", name="Add a row").click()
    page.get_by_label("Pattern of row 1").fill("/stem/*")
    page.get_by_label("Bits of row 1").fill("9")
    page.get_by_role("button", name="Add a row").click()
    page.get_by_label("Pattern of row 2").fill("/head/*")  # neither bits nor observer
    page.locator("#advanced summary").click()  # closed again: the error must open it
    page.get_by_role("button", name="Start job").click()
    rows = page.locator("#f-recipe-overrides tbody tr")
    expect(rows.nth(0).locator(".field-error:visible")).to_have_count(1)
    expect(rows.nth(0).locator("td").nth(1).locator(".field-error")).to_contain_text("8")  # the bits cell: at most 8
    expect(page.get_by_label("Bits of row 1")).to_have_attribute("aria-invalid", "true")
    expect(rows.nth(1).locator(".field-error:visible")).to_contain_text("bits and/or observer")
    expect(page.locator("#form-errors")).to_contain_text("fix the fields marked above")
    screenshot(page, "new-job-override-errors")
