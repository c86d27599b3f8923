"""`GET /models/{id}/comparison`: every job of one model side by side, read from the stored reports.

Two real jobs on the tiny model (minmax and percentile calibration, a labelled .npz) are compared;
each figure is cross-checked against the job's own report and artifacts, not against constants.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from cli import quantctl
from jobs.summary import recipe_summary, report_summary
from samples.tiny import tiny_conv_bytes
from tests.conftest import Service
from tests.test_api import assert_problem, npz_bytes
from tests.test_e2e import read_events


def run_job(client, model_id: str, dataset_id: str, recipe: dict) -> dict:
    created = client.post("/jobs", json={"model_id": model_id, "dataset_id": dataset_id, "recipe": recipe})
    assert created.status_code == 202, created.text
    with client.stream("GET", f"/jobs/{created.json()['id']}/events") as response:
        read_events(response)
    return client.get(f"/jobs/{created.json()['id']}").json()


@pytest.fixture(scope="module")
def compared(service: Service) -> dict:
    rng = np.random.default_rng(4)
    data = npz_bytes(image=rng.normal(size=(40, 3, 8, 8)).astype(np.float32), labels=rng.integers(0, 2, 40))
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), data)
    with service.client(key) as client:
        jobs = [
            run_job(client, model["id"], dataset["id"], {"calibration": {"observer": "minmax"}}),
            run_job(client, model["id"], dataset["id"], {"calibration": {"observer": "percentile"}}),
        ]
        comparison = client.get(f"/models/{model['id']}/comparison")
        assert comparison.status_code == 200, comparison.text
        reports = {job["id"]: client.get(f"/jobs/{job['id']}/report").json() for job in jobs}
        artifacts = {job["id"]: client.get(f"/jobs/{job['id']}/artifacts").json() for job in jobs}
    return {"key": key, "model": model, "jobs": jobs, "body": comparison.json(), "reports": reports, "art": artifacts}


def test_both_jobs_side_by_side_newest_first(compared: dict) -> None:
    body, jobs = compared["body"], compared["jobs"]
    assert all(job["status"] == "succeeded" for job in jobs), jobs
    assert body["model_id"] == compared["model"]["id"] and body["size_bytes"] == compared["model"]["size_bytes"]
    assert [row["job_id"] for row in body["items"]] == [jobs[1]["id"], jobs[0]["id"]]
    assert [row["recipe"]["observer"] for row in body["items"]] == ["percentile", "minmax"]
    assert body["items"][0]["recipe"]["percentile"] == 99.99 and body["items"][1]["recipe"]["percentile"] is None
    assert body["next_cursor"] is None


def test_figures_match_each_jobs_report_and_artifacts(compared: dict) -> None:
    for row in compared["body"]["items"]:
        report = compared["reports"][row["job_id"]]
        evaluation = report["evaluation"]
        metrics = row["metrics"]
        # Copied from the report, so exactly equal; the minimum over outputs is over one output here.
        assert metrics["top1_fp32"] == evaluation["fp32"]["top1"] is not None
        assert metrics["top1_quantized"] == evaluation["qdq_exact"]["top1"] is not None
        assert metrics["top1_drop"] == pytest.approx((metrics["top1_fp32"] - metrics["top1_quantized"]) * 100)
        assert metrics["sqnr_db_min"] == evaluation["qdq_exact"]["outputs"]["logits"]["sqnr_db"]
        assert metrics["cosine_min"] == evaluation["qdq_exact"]["outputs"]["logits"]["cosine"]
        assert metrics["num_samples"] == evaluation["num_samples"] == report["dataset"]["evaluation"]["count"]
        artifacts = {a["name"]: a for a in compared["art"][row["job_id"]]}
        assert row["size"]["quantized_bytes"] == artifacts["model.qdq.onnx"]["size_bytes"]
        assert row["size"]["fp32_bytes"] > 0
        assert row["latency"]["fp32_p50_ms"] > 0 and row["latency"]["quantized_p50_ms"] > 0
        assert {a["name"] for a in row["artifacts"]} == set(artifacts)
        assert row["report_url"] == f"/api/v1/jobs/{row['job_id']}/report"


def test_pages_and_links(service: Service, compared: dict) -> None:
    with service.client(compared["key"]) as client:
        url = f"/models/{compared['model']['id']}/comparison"
        first = client.get(url, params={"limit": 1}).json()
        assert len(first["items"]) == 1 and first["next_cursor"]
        second = client.get(url, params={"limit": 1, "cursor": first["next_cursor"]}).json()
        assert [first["items"][0]["job_id"], second["items"][0]["job_id"]] == [
            j["job_id"] for j in compared["body"]["items"]
        ]
        assert second["next_cursor"] is None
        link = first["items"][0]["artifacts"][0]["url"]
        assert client.get(link.removeprefix("/api/v1")).status_code == 200
        assert_problem(client.get(url, params={"limit": 51}), 422, "limit")


def test_another_projects_model_is_not_found(service: Service, compared: dict) -> None:
    url = f"/models/{compared['model']['id']}/comparison"
    with service.client() as stranger:
        assert_problem(stranger.get(url), 404, "not found")
        assert_problem(stranger.get(f"/models/{uuid.uuid4()}/comparison"), 404, "not found")
    with service.client(key="") as anonymous:
        assert anonymous.get(url).status_code == 401


def test_quantctl_compare_prints_the_table(service: Service, compared: dict, capsys) -> None:
    argv = ["--url", service.url, "--api-key", compared["key"], "--no-progress", "compare", compared["model"]["id"]]
    assert quantctl.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["JOB", "STATUS", "RECIPE"]
    rows = compared["body"]["items"]
    for line, row in zip(lines[1:], rows, strict=True):
        assert line.startswith(row["job_id"][:8]) and "succeeded" in line and row["recipe"]["observer"] in line
        assert f"{row['metrics']['sqnr_db_min']:.2f}" in line
    assert quantctl.main([*argv, "--json"]) == 0
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [r["job_id"] for r in rows]


def test_a_job_without_report_shows_nulls_not_zeros() -> None:
    summary = report_summary({"evaluation": {"fp32": {"top1": None}, "qdq_exact": {"outputs": {}}}})
    assert set(summary["metrics"].values()) == {None}
    assert summary["size"] == {"fp32_bytes": None, "quantized_bytes": None}
    assert recipe_summary({})["observer"] is None


def test_an_accuracy_target_verdict_is_carried_over() -> None:
    assert report_summary({"target": {"met": False}})["metrics"]["target_met"] is False
    assert report_summary({"target": {"met": True}})["metrics"]["target_met"] is True
    assert recipe_summary({"target": {"metric": "cosine", "threshold": 0.999}})["target"]["metric"] == "cosine"



def test_the_strategy_is_carried_over_and_a_recipe_from_before_strategies_is_fixed() -> None:
    assert recipe_summary({})["strategy"] == "fixed" and recipe_summary({})["auto"] is None
    auto = recipe_summary({"strategy": "auto", "auto": {"budget_seconds": 60}})
    assert auto["strategy"] == "auto" and auto["auto"] == {"budget_seconds": 60}
