"""The report summary (defensive about the report's layout) and recipe overrides, without a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.quantctl import main
from cli.recipe import RecipeError, apply_override, build_recipe
from cli.report_text import render_report


def test_report_by_mode_then_output(api) -> None:
    text = render_report(api.report)
    assert text.startswith("platform: tensorrt  precision: int8  observer: minmax\nevaluated on 359 held-out samples")
    table = text.split("per-output error, quantized vs FP32\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split() for line in table] == [
        ["mode", "output", "SQNR", "dB", "cosine", "argmax", "agree"],
        ["exact", "QDQ", "logits", "31.2", "0.9996", "0.99"],
        ["deployed", "logits", "29.8", "0.9993", "0.98"],
    ]
    assert "top-1 on logits: FP32 0.76, exact QDQ 0.755, deployed 0.75" in text
    assert "per-layer analysis: 2 entries" in text
    assert text.index("fc_out") < text.index("conv1_out")  # lowest SQNR first
    assert "sizes:\n  fp32_bytes: 3.81 MiB\n  qdq_bytes: 1.05 MiB" in text
    assert "time per stage:\n  calibrate: 0.05 s\n  export: 0.01 s" in text
    assert "batch_size" not in text  # a setting, not a size
    assert "engine: skipped (no CUDA device)" in text
    assert "block /layer4 left at round-to-nearest" in text


def test_a_figure_the_report_states_twice_is_shown_once() -> None:
    # the worker's layout: top-1 at the mode's top level and again among its task metrics
    report = {
        "evaluation": {
            "top1_output": "logits",
            "fp32": {"top1": 0.9, "task_metrics": {"top1": 0.9, "top5": 1.0}},
            "qdq_exact": {"top1": 0.85, "task_metrics": {"top1": 0.85, "top5": 0.99}},
        }
    }
    text = render_report(report)
    assert "top-1 on logits: FP32 0.9, exact QDQ 0.85\n" in text
    assert text.endswith("top-5 on logits: FP32 1, exact QDQ 0.99")


def test_report_by_output_then_mode() -> None:
    report = {
        "outputs": {
            "logits": {"exact_qdq": {"sqnr_db": 30.0, "cosine": 0.999}, "deployed": {"sqnr_db": 12.0}},
            "boxes": {"exact_qdq": {"max_abs_error": 0.25}},
        },
        "latency": {"fp32_ms": 4.0, "quantized_ms": 1.5},
        "recipe": {"calibration": {"batch_size": 16}},
    }
    text = render_report(report)
    assert "deployed   logits  12" in text
    assert text.index("exact QDQ  boxes") < text.index("deployed   logits")
    assert "exact QDQ  boxes" in text and "0.25" in text
    assert "latency:\n  fp32_ms: 4 ms\n  quantized_ms: 1.5 ms" in text
    assert "batch_size" not in text  # a setting, not a size


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"outputs": {}},
        {"outputs": None, "evaluation": "pending"},
        {"evaluation": {"exact_qdq": {"outputs": {"y": {"sqnr_db": None, "cosine": "n/a"}}}}},
        {"layers": [1, None, {"tensor": "t"}], "warnings": "not a list", "engine": 3},
        {"outputs": [{"name": "y", "sqnr_db": 5}], "size": {"fp32": "big"}, "top1": True},
        [],
        None,
    ],
)
def test_report_never_crashes_on_odd_shapes(report) -> None:
    assert isinstance(render_report(report), str)


def test_report_command_prints_summary_or_raw_json(api, capsys) -> None:
    api.add_job("job-1", "succeeded")
    assert main(["jobs", "report", "job-1"]) == 0
    assert "per-output error" in capsys.readouterr().out
    assert main(["jobs", "report", "job-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == api.report


def test_overrides_nest_and_parse_json_values() -> None:
    recipe: dict = {"calibration": {"observer": "percentile"}}
    for override in [
        "calibration.observer=minmax",
        "calibration.percentile=99.9",
        "seed=3",
        'exclude.op_types=["Gemm"]',
    ]:
        apply_override(recipe, override)
    assert recipe == {
        "calibration": {"observer": "minmax", "percentile": 99.9},
        "seed": 3,
        "exclude": {"op_types": ["Gemm"]},
    }


@pytest.mark.parametrize("override", ["observer", "=x", "a..b=1", "calibration.observer.x=1"])
def test_malformed_overrides_are_refused(override: str) -> None:
    with pytest.raises(RecipeError):
        apply_override({"calibration": {"observer": "minmax"}}, override)


def test_recipe_file_must_be_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"
    path.write_text("[1, 2]")
    with pytest.raises(RecipeError, match="JSON object"):
        build_recipe(path, [])
    path.write_text("{nope")
    with pytest.raises(RecipeError, match="not valid JSON"):
        build_recipe(path, [])
    with pytest.raises(RecipeError, match="cannot read"):
        build_recipe(tmp_path / "missing.json", [])


def test_cpu_latency_is_a_table_and_engine_settings_are_not_sizes() -> None:
    summary = {"p50_ms": 0.5, "p90_ms": 0.7, "p99_ms": 1.5, "throughput_samples_per_s": 2000.0}
    report = {
        "evaluation": {"model": {"fp32_bytes": 4096, "qdq_bytes": 1024}},
        "latency": {
            "cpu": {
                "provider": "CPUExecutionProvider",
                "fp32": {"batch_1": summary},
                "quantized": {"batch_1": {**summary, "p50_ms": 0.25}},
                "speedup_p50": {"batch_1": 2.0},
                "notes": [],
            }
        },
        "stage_seconds": {"calibrate": 1.5, "latency": 0.25},
        "engine": {"status": "skipped", "reason": "no CUDA", "metadata": {"flags": {"workspace_bytes": 1 << 32}}},
    }
    text = render_report(report)
    rows = [line.split() for line in text.splitlines()]
    assert ["fp32", "1", "0.5", "0.7", "1.5", "2000"] in rows
    assert ["quantized", "1", "0.25", "0.7", "1.5", "2000"] in rows
    assert "batch 1: 2.00x" in text
    assert "latency: 0.25 s" in text  # the stage keeps its name in the time-per-stage list
    assert "workspace" not in text and "engine: skipped (no CUDA)" in text
