"""The dashboard in a real headless Chromium against the real service (API + Celery worker + Redis).

Runs on the SQLite service only: these tests exercise the browser side; every route they call is
already tested against both databases by tests/test_api.py and tests/test_e2e.py, and a second
browser pass would cost another minute of a 2-core CI machine for no new coverage.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from samples.tiny import stateful_data, stateful_model
from tests.conftest import Service
from tests.frontend.conftest import audit, screenshot, sign_in
from tests.test_api import npz_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]
JOB_TIMEOUT_MS = 240_000  # the worker shares 2 cores with the rest of the suite; a quick job takes ~10 s alone
# An upload is validated by the default queue's worker (about 1 s alone); past expect's 5 s under load.
VALIDATION_TIMEOUT_MS = 60_000


def test_upload_quantize_watch_report_download(page, service: Service, digits: tuple[Path, Path], tmp_path: Path):
    model_path, data_path = digits
    key = service.new_key()
    page.goto(f"{service.url}/jobs")
    page.wait_for_url("**/signin**")
    screenshot(page, "signin")
    audit(page, "signin")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/jobs")

    # Models: upload with a progress bar, then the model card.
    page.get_by_role("link", name="Models").click()
    page.get_by_label("Upload an ONNX model").set_input_files(str(model_path))
    page.get_by_role("button", name="Upload", exact=True).click()
    row = page.locator("#models-table tbody tr").first
    expect(row).to_contain_text("ready", timeout=VALIDATION_TIMEOUT_MS)
    expect(row).to_contain_text(model_path.name)
    screenshot(page, "models")
    audit(page, "models")
    row.get_by_role("link", name=re.compile(model_path.name)).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(model_path.name)
    expect(page.get_by_role("heading", name="Inputs")).to_be_visible()
    expect(page.locator("main")).to_contain_text("Conv")
    model_url = page.url
    screenshot(page, "model-card")
    audit(page, "model-card")

    # Datasets.
    page.get_by_role("link", name="Datasets").click()
    page.get_by_label("Upload calibration data").set_input_files(str(data_path))
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator("#datasets-table tbody tr").first).to_contain_text(data_path.name)
    screenshot(page, "datasets")
    audit(page, "datasets")

    # New job with the quick preset; the form shows the recipe fields from the OpenAPI schema.
    page.get_by_role("link", name="New job").click()
    page.get_by_label(re.compile("Quick check")).check()
    expect(page.get_by_label("Observer", exact=True)).to_have_value("minmax")
    expect(page.locator("#f-recipe-calibration-num-samples")).to_have_value("128")
    screenshot(page, "new-job")
    audit(page, "new-job")
    page.get_by_role("button", name="Start job").click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}$"))
    job_id = page.url.rsplit("/", 1)[1]

    # Live status over SSE until it succeeds, then the report.
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=JOB_TIMEOUT_MS)
    log = page.locator("#event-log")
    for stage in ("calibrate", "export", "evaluate"):
        expect(log).to_contain_text(stage)
    expect(page.get_by_role("progressbar", name="Job progress")).to_have_attribute("aria-valuenow", "100")
    report = page.locator("#report")
    expect(report.locator("#output-metrics")).to_contain_text("logits")
    expect(report.locator("#report-summary")).to_contain_text("Top-1")
    expect(report.locator("#report-summary")).to_contain_text("smaller")
    screenshot(page, "job-report")
    audit(page, "job-report")

    # Download the QDQ model: the bytes are the artifact the API recorded.
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Download model.qdq.onnx").click()
    saved = tmp_path / "downloaded.onnx"
    download_info.value.save_as(saved)
    with service.client(key) as client:
        artifacts = {a["name"]: a for a in client.get(f"/jobs/{job_id}/artifacts").json()}
    assert download_info.value.suggested_filename == "model.qdq.onnx"
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == artifacts["model.qdq.onnx"]["sha256"]

    # The jobs list and the comparison of the model's jobs.
    page.get_by_role("link", name="Jobs", exact=True).click()
    first = page.locator("#jobs-table tbody tr").first
    expect(first).to_contain_text(job_id[:8])
    expect(first).to_contain_text("succeeded")
    screenshot(page, "jobs")
    audit(page, "jobs")
    # The comparison page reads one endpoint, not every job's report.
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(f"{model_url}/compare")
    compare = page.locator("#compare-table")
    expect(compare).to_contain_text(job_id[:8])
    expect(compare).to_contain_text(re.compile(r"\d+\.\d\d % → \d+\.\d\d %"))  # top-1 FP32 → QDQ
    expect(compare.get_by_role("button", name=f"Download model.qdq.onnx of job {job_id[:8]}")).to_be_visible()
    expect(page.locator("canvas[role=img]")).to_have_count(1)
    api_calls = [url.split("/api/v1", 1)[1] for url in requests if "/api/v1/" in url]
    assert any(call.startswith(f"/models/{model_url.rsplit('/', 1)[1]}/comparison") for call in api_calls), api_calls
    assert not [call for call in api_calls if call.endswith("/report") or call.startswith("/jobs")], api_calls
    axis = page.get_by_label("Horizontal axis")
    if axis.count():  # offered when the report measured latency as well as size
        axis.select_option("latency")
        expect(page.get_by_role("heading", name=re.compile("against CPU p50 latency"))).to_be_visible()
        expect(page.locator("canvas[role=img]")).to_have_count(1)
    screenshot(page, "compare")
    audit(page, "compare")


@pytest.fixture(scope="module")
def project(service: Service, digits: tuple[Path, Path]) -> dict:
    """A project with a ready model and a dataset, uploaded through the API."""
    key = service.new_key()
    model, dataset = service.upload(key, digits[0].read_bytes(), digits[1].read_bytes())
    return {"key": key, "model": model, "dataset": dataset}


def test_bad_recipe_value_is_shown_beside_its_field(page, service: Service, project: dict):
    page.console.allowed_statuses.add(422)  # the refused submission itself
    with service.client(project["key"]) as client:
        jobs_before = client.get("/jobs").json()["items"]
    sign_in(page, service.url, project["key"], "/jobs/new")
    page.get_by_text("Advanced: every recipe field").click()  # collapsed by default
    percentile = page.get_by_label("Percentile", exact=True)
    percentile.fill("150")
    page.get_by_role("button", name="Start job").click()
    error = page.locator("#f-recipe-calibration-percentile-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("100")
    expect(percentile).to_have_attribute("aria-invalid", "true")
    expect(percentile).to_be_focused()
    # The message is tied to the input for screen readers, and no other field is marked.
    assert "f-recipe-calibration-percentile-error" in percentile.get_attribute("aria-describedby")
    expect(page.locator("[aria-invalid=true]")).to_have_count(1)
    assert page.url.endswith("/jobs/new")
    screenshot(page, "new-job-field-error")
    audit(page, "new-job-field-error")
    with service.client(project["key"]) as client:
        assert client.get("/jobs").json()["items"] == jobs_before  # nothing was queued


def test_another_projects_job_is_not_reachable(page, service: Service, project: dict):
    with service.client(project["key"]) as client:
        created = client.post(
            "/jobs",
            json={
                "model_id": project["model"]["id"],
                "dataset_id": project["dataset"]["id"],
                "recipe": {"calibration": {"observer": "minmax", "num_samples": 64}},
            },
        )
        assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    page.console.allowed_statuses.add(404)  # the dashboard asks for the other project's job and gets 404
    sign_in(page, service.url, service.new_key(), "/jobs")
    expect(page.locator("main")).to_contain_text("No jobs match")
    page.goto(f"{service.url}/jobs/{job_id}")
    expect(page.get_by_role("alert")).to_contain_text("not found")
    expect(page.locator("#event-log")).to_have_count(0)
    page.goto(f"{service.url}/models/{project['model']['id']}")
    expect(page.get_by_role("alert")).to_contain_text("not found")


def test_keyboard_only_sign_in_and_navigation(page, service: Service, project: dict):
    page.goto(f"{service.url}/models")
    page.wait_for_url("**/signin**")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_label("API key")).to_be_focused()
    page.keyboard.type(project["key"])
    page.keyboard.press("Enter")
    page.wait_for_url("**/models")  # back where the visitor was going
    expect(page.get_by_role("heading", level=1)).to_be_focused()  # focus follows the route change
    expect(page.get_by_role("link", name="Models")).to_have_attribute("aria-current", "page")
    expect(page.locator("#models-table")).to_contain_text(project["model"]["filename"])


def test_cancel_a_running_job_from_its_page(page, service: Service, project: dict):
    # Reconstruction at 100,000 steps per block runs for many minutes: the job is surely still running when the
    # click lands, and the cancel is checked at every step.
    slow = {"platform": "academic", "precision": "w4a8", "reconstruction": {"method": "adaround", "iters": 100_000}}
    with service.client(project["key"]) as client:
        created = client.post(
            "/jobs", json={"model_id": project["model"]["id"], "dataset_id": project["dataset"]["id"], "recipe": slow}
        )
        assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    sign_in(page, service.url, project["key"], f"/jobs/{job_id}")
    expect(page.locator("#job-stage")).to_have_text("reconstruct", timeout=JOB_TIMEOUT_MS)
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-status")).to_have_text("canceled", timeout=60_000)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    expect(page.locator("#artifacts-table")).to_have_count(0)


def test_model_and_dataset_pages_say_where_samples_run(page, service: Service):
    key = service.new_key()
    data = stateful_data(12, seed=0, state_size=16)  # x (12, 16), state (2, 12, 16), sr scalar
    model, dataset = service.upload(key, stateful_model(state_size=16).SerializeToString(), npz_bytes(**data))
    sign_in(page, service.url, key, f"/models/{model['id']}")
    inputs = page.locator("section", has=page.get_by_role("heading", name="Inputs", exact=True))
    expect(inputs.get_by_role("row", name=re.compile(r"^x "))).to_contain_text("axis 0")
    expect(inputs.get_by_role("row", name=re.compile(r"^state "))).to_contain_text("axis 1")
    expect(inputs.get_by_role("row", name=re.compile(r"^sr "))).to_contain_text("constant")
    page.goto(f"{service.url}/datasets")
    row = page.get_by_role("row", name=re.compile(re.escape(dataset["filename"])))
    expect(row).to_contain_text("per input")  # no common first axis: counted per model input by a job
