"""The job page of a finished QAT job: the report's qat section (a real one, written by quantcore for the tiny
CNN trained 3 epochs with a label loss) as a chart of the training loss and the held-out SQNR per epoch, the
outcome and the same numbers in a table. The job's routes are answered by the test (``test_report_view``)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from playwright.sync_api import expect

from jobs.report_schema import Report
from quantcore import AnalysisOptions, QuantizeConfig, quantize
from quantcore.config import QatConfig
from samples.tiny import tiny_conv_model
from tests.conftest import Service
from tests.frontend.conftest import audit, screenshot, sign_in
from tests.frontend.test_report_view import JOB, JOB_ID, serve_job

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]

EPOCHS = 3
# the canvas' painted (non-transparent) pixels
PAINTED = (
    "c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; "
    "for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n; }"
)


def qat_report(tmp_path) -> dict:
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_conv_model(), model)
    data = np.random.default_rng(0).uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    qat = QatConfig(epochs=EPOCHS, lr=1e-3, batch_size=8, threads=1, label_weight=0.5)
    config = QuantizeConfig(
        platform="academic", precision="w4a4", cpu_latency=False, analysis=AnalysisOptions(enabled=False), qat=qat
    )
    labels = np.arange(40) % 2
    report = quantize(
        model, {"image": data[:40]}, {"image": data[40:]}, config, tmp_path / "out", calibration_labels=labels
    ).report
    Report.model_validate(report)  # the shape the API serves
    return report


def test_a_finished_qat_job_shows_its_loss_curve(page, service: Service, tmp_path):
    report = qat_report(tmp_path)
    qat = report["qat"]
    assert len(qat["curve"]) == EPOCHS
    serve_job(page, JOB, report)
    sign_in(page, service.url, service.new_key(), f"/jobs/{JOB_ID}")
    section = page.locator("#qat")
    expect(section.locator("#qat-statement")).to_contain_text(qat["status"])
    expect(section).to_contain_text("label weight 0.5")
    # the chart's text alternative carries every point: epoch 0 (the post-training model) has no loss
    points = "; ".join(rf"epoch {e} loss [-\d.e]+, SQNR [-\d.]+" for e in range(1, EPOCHS + 1))
    canvas = section.locator("canvas[role=img]")
    expect(canvas).to_have_attribute("aria-label", re.compile(rf"epoch 0 SQNR [-\d.]+; {points}$"))
    rows = section.locator("#qat-curve tbody tr")
    expect(rows).to_have_count(EPOCHS)
    expect(rows.first.locator("td").nth(1)).to_have_text(str(qat["curve"][0]["steps"]))
    # drawn, not just placed: Chart.js paints the lines onto the canvas (a line controller it lacked would
    # throw, which the page fixture reports as a console error)
    expect(canvas).to_be_visible()
    page.wait_for_function(f"() => ({PAINTED})(document.querySelector('#qat canvas')) > 1000")
    expect(page.locator("#report details.generic summary", has_text=re.compile("^Qat$"))).to_have_count(0)
    screenshot(page, "qat-loss-curve")
    audit(page, "qat-loss-curve")
