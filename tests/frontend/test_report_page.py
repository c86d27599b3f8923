"""The standalone report page (quantcore.report.html, the job's report.html artifact) in Chromium:
the CPU latency benchmark is there and the outputs table fits a 1366 px wide window."""

from __future__ import annotations

from playwright.sync_api import expect

from quantcore.config import AccuracyTarget
from quantcore.report.html import render_html
from tests.frontend.conftest import overflow, screenshot
from tests.frontend.test_report_view import real_report


def test_report_page_shows_the_cpu_benchmark_and_fits_1366_px(page, tmp_path):
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.999))
    path = tmp_path / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    page.goto(path.as_uri())
    cpu = report["latency"]["cpu"]
    rows = page.locator("h2:text-is('Latency') ~ table").first.locator("tbody tr")
    expect(rows).to_have_count(len(cpu["batch_sizes"]))
    for row, batch in zip(rows.all(), cpu["batch_sizes"], strict=True):
        expect(row.locator("td").first).to_have_text(str(batch))
        expect(row).to_contain_text(f"{cpu['speedup_p50'][f'batch_{batch}']:.2f}\u00d7")
    screenshot(page, "report-html-1366")
    assert page.viewport_size["width"] == 1366
    assert overflow(page, "table.fit") == {"element": 0, "page": 0}


def test_report_page_says_when_latency_was_not_measured(tmp_path):
    report = real_report(tmp_path, AccuracyTarget("cosine", 0.999))
    page = render_html({**report, "latency": {"cpu": None}})
    assert '<h2>Latency</h2><p class="note">Not measured' in page
