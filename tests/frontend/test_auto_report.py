"""The job page of a strategy auto job, from a real report: quantcore.quantize_auto on a small
Conv-Relu-Gemm model with four candidates (equalization skipped: the model has no layer pair) and an
objective some miss, on platform onnxruntime with
cpu_objective latency, so the report holds both the search (`auto`) and the CPU placement
(`placement`). Served the way test_report_view serves a report."""

from __future__ import annotations

import numpy as np
import pytest
from playwright.sync_api import expect

from jobs.report_schema import Report
from quantcore import AnalysisOptions, AutoOptions, QuantizeConfig, quantize_auto
from quantcore.config import AccuracyTarget
from tests.conftest import Service
from tests.frontend.conftest import audit, overflow, screenshot, sign_in
from tests.frontend.test_report_view import JOB, JOB_ID, serve_job
from tests.quantcore.models import conv_relu_gemm, save

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]


@pytest.fixture(scope="module")
def auto_report(tmp_path_factory) -> dict:
    tmp_path = tmp_path_factory.mktemp("auto")
    rng = np.random.default_rng(0)
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    calibration = {"input": rng.normal(size=(40, 2, 6, 6)).astype(np.float32)}
    evaluation = {"input": rng.normal(size=(16, 2, 6, 6)).astype(np.float32)}
    candidates = ("minmax", "mse", "equalization")
    auto = AutoOptions(budget_seconds=60, candidates=candidates, objective=AccuracyTarget("cosine", 0.9999))
    config = QuantizeConfig(
        platform="onnxruntime",
        strategy="auto",
        auto=auto,
        analysis=AnalysisOptions(enabled=False),
        cpu_objective="latency",
        cpu_batch_sizes=(1,),
    )
    report = quantize_auto(path, calibration, evaluation, config, tmp_path / "out").report
    Report.model_validate(report)  # the shape the API serves
    return report


def test_auto_job_shows_its_candidates_plot_and_placement_within_1366_px(page, service: Service, auto_report):
    auto, placement = auto_report["auto"], auto_report["placement"]
    serve_job(page, {**JOB, "recipe": {"strategy": "auto"}}, auto_report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    rows = page.locator("#auto-candidates tbody tr")
    expect(rows).to_have_count(len(auto["candidates"]))  # as_given, minmax, mse, equalization
    for row, candidate in zip(rows.all(), auto["candidates"], strict=True):
        expect(row).to_contain_text(candidate["name"])
        expect(row).to_contain_text(candidate["change"])
        expect(row.locator(".mark-pareto")).to_have_count(1 if candidate["pareto"] else 0)
        expect(row.locator(".mark-chosen")).to_have_count(1 if candidate["name"] == auto["chosen"] else 0)
    skipped = [c for c in auto["candidates"] if c["error"]]
    assert [c["name"] for c in skipped] == ["equalization"] and skipped[0]["error"].startswith("skipped: ")
    expect(page.locator("#auto-candidates thead")).to_contain_text("Why no model")  # not an error: a reason
    expect(rows.nth(auto["candidates"].index(skipped[0]))).to_contain_text(skipped[0]["error"])
    expect(page.locator("#auto-verdict")).to_contain_text(auto["reason"])
    expect(page.locator("#auto-verdict")).to_contain_text("Objective met" if auto["met"] else "Objective not met")
    # every candidate measured its latency, so the plot is against latency; its text names the chosen one
    plot = page.locator("#auto-plot canvas[role=img]")
    expect(plot).to_have_count(1)
    description = plot.get_attribute("aria-label")
    assert description.startswith("cosine on the selection split against CPU p50 latency at batch 1 (ms): ")
    assert f"{auto['chosen']} (chosen)" in description
    expect(page.locator("#placement-statement")).to_have_text(placement["statement"])
    expect(page.locator("#placement-regions tbody tr")).to_have_count(len(placement["regions"]))
    speedup = placement["final"]["batch_1"]["speedup_p50"]
    expect(page.locator("#placement-final tbody tr")).to_contain_text(f"{speedup:.2f}\u00d7")
    expect(page.locator("#report details.generic summary", has_text="auto")).to_have_count(0)  # not shown twice
    assert page.viewport_size["width"] == 1366
    for table in ("#auto-candidates", "#placement-regions", "#placement-final"):
        assert overflow(page, table) == {"element": 0, "page": 0}, table
    screenshot(page, "auto-job-1366")
    audit(page, "auto-job")


def test_an_unmet_objective_and_its_fallback_are_shown(page, service: Service, auto_report):
    """The fallback as quantcore writes it when no candidate met the objective (the fields of
    quantcore.auto's fallback record), on the real report's search."""
    first = auto_report["auto"]["candidates"][0]["name"]
    fallback = {
        "from": first,
        "dropped": [],
        "float_layers": ["conv"],
        "value": 0.99995,
        "met": True,
        "verdict": "met: cosine 0.99995 >= 0.9999 with 1 layer in float",
        "seconds": 0.4,
        "error": None,
    }
    candidates = [{**c, "met": False} for c in auto_report["auto"]["candidates"]]
    auto = {**auto_report["auto"], "candidates": candidates, "met": False, "fallback": fallback}
    serve_job(page, JOB, {**auto_report, "auto": auto})
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#auto-verdict")).to_contain_text("Objective not met")
    expect(page.locator("#auto-fallback")).to_contain_text(f"Fallback from {first}")
    expect(page.locator("#auto-fallback")).to_contain_text("Kept in float: conv")
    expect(page.locator("#auto-fallback")).to_contain_text(fallback["verdict"])
    audit(page, "auto-job-fallback")


def test_the_timing_of_candidates_that_meet_the_objective_is_shown(page, service: Service, auto_report):
    """The speed entry as quantcore.auto.speed writes it where a faster candidate that meets the objective
    replaced the most accurate, on the real report's search (whose candidates share one graph)."""
    first, second = (c["name"] for c in auto_report["auto"]["candidates"][:2])
    timing = {"p25_ms": 0.8, "p50_ms": 0.9, "p75_ms": 1.0, "runs": 40}
    slower = {"p25_ms": 1.5, "p50_ms": 1.6, "p75_ms": 1.7, "runs": 40}
    speed = {
        "most_accurate": second,
        "compared": [
            {"name": first, "stands_for": [], "timings": {"batch_1": timing}, "error": None},
            {"name": second, "stands_for": ["mse"], "timings": {"batch_1": slower}, "error": None},
        ],
        "batch_sizes": [1],
        "threads": 2,
        "seconds": 0.6,
        "verdict": f"{first} kept over the more accurate {second}: it meets the objective too and its deployed model "
        "is clearly faster (p50 1.6 → 0.9 ms at batch 1)",
    }
    auto = {**auto_report["auto"], "chosen": first, "speed": speed}
    Report.model_validate({**auto_report, "auto": auto})
    serve_job(page, JOB, {**auto_report, "auto": auto})
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#auto-speed")).to_contain_text(speed["verdict"])
    rows = page.locator("#auto-speed-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td")).to_have_text([first, "—", "0.9 (0.8\u20131)"])
    expect(rows.nth(1).locator("td")).to_have_text([second, "mse", "1.6 (1.5\u20131.7)"])
    expect(page.locator("#auto-speed-table thead")).to_contain_text("p50 ms at batch 1")
    expect(page.locator("#auto-candidates tbody tr").nth(0).locator(".mark-chosen")).to_have_count(1)
    assert overflow(page, "#auto-speed-table") == {"element": 0, "page": 0}
    audit(page, "auto-job-speed")


def test_a_final_comparison_timed_past_the_budget_says_why(page, service: Service, auto_report):
    """The placement's past_budget as quantcore.analysis.placement words it, on the real report's placement
    (whose own final comparison fit in its budget: the notice is absent there)."""
    serve_job(page, JOB, auto_report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#placement-statement")).to_be_visible()
    expect(page.locator("#placement-past-budget")).to_have_count(0)
    why = (
        "the profiles' runs (2 at batch 32) are too few to promise the quantized model no slower than FP32; "
        "the final comparison was timed (at least 7 runs a batch size) past the budget"
    )
    placement = {**auto_report["placement"], "final_source": "timed", "past_budget": why}
    Report.model_validate({**auto_report, "placement": placement})
    serve_job(page, JOB, {**auto_report, "placement": placement})
    page.reload()
    expect(page.locator("#placement-past-budget")).to_have_text(f"Timed past the budget: {why}.")
    audit(page, "placement-past-budget")
