"""The job page of a job left on the default tensorrt platform that got no TensorRT engine: it recommends
the onnxruntime platform with the figures the run measured for both models (`latency.cpu_alternative`),
from a real report. Served the way test_report_view serves a report."""

from __future__ import annotations

import numpy as np
import pytest
from playwright.sync_api import expect

from jobs.report_schema import Report
from quantcore import AnalysisOptions, QuantizeConfig, quantize
from tests.conftest import Service
from tests.frontend.conftest import audit, overflow, sign_in
from tests.frontend.test_report_view import JOB, JOB_ID, serve_job
from tests.quantcore.models import conv_relu_gemm, save

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]


@pytest.fixture(scope="module")
def alternative_report(tmp_path_factory) -> dict:
    tmp_path = tmp_path_factory.mktemp("alternative")
    rng = np.random.default_rng(0)
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    config = QuantizeConfig(
        tensorrt_engine=True,  # no TensorRT here: the stage skips
        cpu_alternative=True,
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        percentile_candidates=(),
        cpu_batch_sizes=(1, 8),
    )
    calibration = {"input": rng.normal(size=(32, 2, 6, 6)).astype(np.float32)}
    evaluation = {"input": rng.normal(size=(16, 2, 6, 6)).astype(np.float32)}
    report = quantize(path, calibration, evaluation, config, tmp_path / "out").report
    Report.model_validate(report)  # the shape the API serves
    return report


def test_a_job_without_engine_recommends_onnxruntime_with_both_models_figures(
    page, service: Service, alternative_report
):
    measured = alternative_report["latency"]["cpu_alternative"]
    serve_job(page, JOB, alternative_report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    expect(page.locator("#cpu-alternative-title")).to_have_text("Recommended for a CPU: platform onnxruntime")
    expect(page.locator("#cpu-alternative-statement")).to_contain_text(measured["why"])
    rows = page.locator("#cpu-alternative-table tbody tr")
    expect(rows).to_have_count(2)
    for row, key in zip(rows.all(), ("default", "onnxruntime"), strict=True):
        for batch in ("batch_1", "batch_8"):
            expect(row).to_contain_text(f"{measured['speedup_p50'][key][batch]:.2f}\u00d7")
    expect(page.locator("#report details.generic summary", has_text="cpu alternative")).to_have_count(0)
    assert overflow(page, "#cpu-alternative-table") == {"element": 0, "page": 0}
    audit(page, "cpu-alternative")
