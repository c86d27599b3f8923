"""The report summary (`cli.report_text`) on real reports written by quantcore, and recipe overrides,
without a server."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli.quantctl import main
from cli.recipe import RecipeError, apply_override, build_recipe
from cli.report_text import render_report
from jobs.recipe import Recipe
from quantcore import AccuracyTarget, QuantizeConfig, quantize
from tests.quantcore.models import planted_outlier, save


def two_classes() -> Any:
    """input (N, 16) → Gemm → logits (N, 2)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (2, 16)).astype(np.float32), "fc.w")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "fc.w"], ["logits"], name="fc", transB=1)],
        "two_classes",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def run_quantcore(tmp: Path, model: Any, shape: tuple[int, ...], config: QuantizeConfig, labels: bool) -> dict:
    """A real report: 96 calibration samples (the clip search needs 64) and 32 evaluation ones, labelled
    with FP32's own argmax when `labels`."""
    path = save(model, tmp / "model.onnx")
    data = np.random.default_rng(1).normal(size=(128, *shape)).astype(np.float32)
    evaluation = {"input": data[96:]}
    truth = None
    if labels:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        truth = session.run(None, evaluation)[0].argmax(1)
    return quantize(path, {"input": data[:96]}, evaluation, config, tmp / "out", labels=truth).report


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """target: planted_outlier with labels and a cosine target (analysis, clip search, target steps);
    plain: the same model without target nor labels (conv3 ruins its accuracy); binary: 2 classes."""
    made = {}
    for name, model, shape, config, labels in [
        ("target", planted_outlier(), (3, 8, 8), QuantizeConfig(target=AccuracyTarget("cosine", 0.999)), True),
        ("plain", planted_outlier(), (3, 8, 8), QuantizeConfig(), False),
        ("binary", two_classes(), (16,), QuantizeConfig(cpu_latency=False), True),
    ]:
        made[name] = run_quantcore(tmp_path_factory.mktemp(name), model, shape, config, labels)
    return made


def section(text: str, title: str) -> list[str]:
    """The lines of the blank-line-separated section starting with `title`."""
    return next(block for block in text.split("\n\n") if block.startswith(title)).splitlines()


def test_layers_are_named_and_listed_in_the_reports_rank_order(reports) -> None:
    report = reports["target"]
    lines = section(render_report(report), "layers ranked by harm")
    ranked = sorted(report["analysis"]["layers"], key=lambda layer: layer["rank"])
    assert [line.split()[:2] for line in lines[2:]] == [[str(layer["rank"]), layer["node"]] for layer in ranked]
    assert lines[2].split()[1] == "conv3"  # the planted bad layer
    # the order is the report's rank, not one of the summary's making
    flipped = copy.deepcopy(report)
    for layer in flipped["analysis"]["layers"]:
        layer["rank"] = len(ranked) + 1 - layer["rank"]
    lines = section(render_report(flipped), "layers ranked by harm")
    assert [line.split()[1] for line in lines[2:]] == [layer["node"] for layer in reversed(ranked)]


def test_only_model_outputs_are_in_the_per_output_table(reports) -> None:
    report = reports["target"]
    text = render_report(report)
    rows = [re.split(r"\s{2,}", line)[:2] for line in section(text, "per-output error")[2:]]
    assert rows == [["exact QDQ", "logits"], ["deployed", "logits"]]
    assert "candidates" not in text and "deployed_vs_exact" not in text and "target/steps" not in text
    fp32, exact, deployed = (report["evaluation"][mode]["top1"] for mode in ("fp32", "qdq_exact", "qdq_deployed"))
    assert f"top-1 on logits: FP32 {fp32:.4g}, exact QDQ {exact:.4g}, deployed {deployed:.4g}" in text


def test_verdicts_clip_search_and_target_steps_are_shown(reports) -> None:
    report = reports["target"]
    text = render_report(report)
    assert f"deployment: {report['parity']['reason']}" in text
    assert f"accuracy target: {report['target']['verdict']}" in text
    search = report["calibration"]["percentile_search"]
    clip = section(text, "clip search")
    assert clip[0] == f"clip search on {search['samples']} samples kept p{search['chosen']:g}"
    assert "p99.999" in clip[1] and "mse" in clip[1]  # every candidate by its own name
    steps = section(text, "accuracy target steps")[2:]
    assert [line.split()[:2] for line in steps] == [["0", "none"], ["1", "conv3"]]
    assert "much less accurate" not in text  # the target was met


def test_without_labels_top1_says_so_and_two_classes_have_no_top5(reports) -> None:
    text = render_report(reports["plain"])
    assert "top-1: not measured (the evaluation data has no labels)" in text
    assert "FP32 -" not in text
    binary = render_report(reports["binary"])
    assert re.search(r"^top-1 on logits: FP32 1, exact QDQ [\d.]+, deployed [\d.]+$", binary, re.MULTILINE)
    assert "top-5" not in binary  # undefined with 2 classes (null in the report)


def suggested_recipes(text: str) -> list[dict]:
    """Each 'what to try' line's --set options, applied as quantctl applies them."""
    lines = text.split("what to try", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    recipes = []
    for line in lines:
        words = shlex.split(line.split(": ", 1)[1])
        recipes.append(build_recipe(None, [words[i + 1] for i, word in enumerate(words) if word == "--set"]))
    return recipes


def test_a_much_less_accurate_model_gets_recipe_changes_the_service_accepts(reports) -> None:
    report = reports["plain"]
    text = render_report(report)
    cosine = report["evaluation"]["qdq_exact"]["outputs"]["logits"]["cosine"]
    assert cosine < 0.99  # conv3 alone ruins it
    assert f"much less accurate than FP32: cosine {cosine:.4g} on logits (exact QDQ; below 0.99), SQNR " in text
    recipes = suggested_recipes(text)
    for recipe in recipes:
        Recipe.model_validate(recipe)  # the API accepts every suggestion
    assert {"exclude": {"node_patterns": ["conv3"]}} in recipes  # the worst-ranked layer, by name
    assert {"target": {"metric": "cosine", "threshold": 0.99}} in recipes  # no labels: not top1_drop
    assert {"calibration": {"observer": "mse"}} in recipes
    assert {"reconstruction": {"method": "qdrop"}} in recipes
    assert {"strategy": "auto"} in recipes  # the search, for a recipe with no target


def test_a_slower_model_is_told_so_with_another_platform(reports) -> None:
    report = copy.deepcopy(reports["target"])
    # the measured speed-up varies with the machine's load: the figures are pinned
    report["latency"]["cpu"]["speedup_p50"] = {"batch_1": 0.55, "batch_32": 1.2}
    text = render_report(report)
    assert "slower than FP32 on the CPU: 0.55x at batch 1 (p50 speed-up)" in text
    assert "much less accurate" not in text
    recipes = suggested_recipes(text)
    assert {"platform": "onnxruntime"} in recipes
    for recipe in recipes:
        Recipe.model_validate(recipe)
    report["latency"]["cpu"]["speedup_p50"] = {"batch_1": 1.5, "batch_32": 2.0}
    assert "attention" not in render_report(report)


def test_cpu_benchmark_sizes_and_stage_times(reports) -> None:
    report = reports["plain"]
    text = render_report(report)
    rows = [line.split()[:2] for line in section(text, "CPU latency")[2:6]]
    assert rows == [["fp32", "1"], ["fp32", "32"], ["quantized", "1"], ["quantized", "32"]]
    assert "speed-up of the quantized model at p50: batch 1: " in text
    assert re.search(r"^model size: FP32 [\d.]+ KiB, QDQ [\d.]+ KiB \(\d+% of FP32\)$", text, re.MULTILINE)
    assert section(text, "time per stage: prepare ")
    assert "CPU latency" not in render_report(reports["binary"])  # not measured there


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"evaluation": {}},
        {"evaluation": "pending", "analysis": [], "target": {"steps": "x"}},
        {"evaluation": {"qdq_exact": {"outputs": {"y": {"sqnr_db": None, "cosine": "n/a"}}}}},
        {"analysis": {"layers": [1, None, {"node": "n", "rank": "first"}]}, "warnings": "not a list", "engine": 3},
        {"calibration": {"percentile_search": {"candidates": [None, {"percentile": "x"}]}}, "latency": {"cpu": []}},
        {"evaluation": {"fp32": {"top1": True}, "model": {"fp32_bytes": 0, "qdq_bytes": 0}}, "parity": {"reason": 3}},
        [],
        None,
    ],
)
def test_report_never_crashes_on_odd_shapes(report) -> None:
    assert isinstance(render_report(report), str)


def test_report_command_prints_summary_or_raw_json(api, capsys) -> None:
    api.add_job("job-1", "succeeded")
    assert main(["jobs", "report", "job-1"]) == 0
    out = capsys.readouterr().out
    assert "per-output error" in out and "deployment: the deployed model" in out
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


def test_a_job_without_engine_or_named_platform_is_recommended_onnxruntime_with_both_figures(tmp_path) -> None:
    """A real report (the engine stage skips: no TensorRT here); the figures printed are the measured ones."""
    config = QuantizeConfig(tensorrt_engine=True, cpu_alternative=True, cpu_latency=False, cpu_batch_sizes=(1, 4))
    report = run_quantcore(tmp_path, two_classes(), (16,), config, labels=False)
    measured = report["latency"]["cpu_alternative"]
    lines = section(render_report(report), "recommended: platform onnxruntime")
    assert "no TensorRT engine was built (" in lines[0] and "the recipe named no platform" in lines[0]
    for label, line in (("default", lines[2]), ("onnxruntime", lines[3])):
        speed = measured["speedup_p50"][label]
        assert f"{speed['batch_1']:.2f}x at batch 1, {speed['batch_4']:.2f}x at batch 4" in line
        assert f"cosine {measured['cosine'][label]:.5g}" in line
    assert "output logits" in lines[1] and "tensorrt rules" in lines[2]
    assert lines[-1].startswith("  quantize again with: ")
    words = shlex.split(lines[-1].split(": ", 1)[1])
    assert build_recipe(None, [words[i + 1] for i, word in enumerate(words) if word == "--set"]) == {
        "platform": "onnxruntime"
    }
    del report["latency"]["cpu_alternative"]
    assert "recommended:" not in render_report(report)
