"""Accuracy-target mode on the planted-outlier CNN: full INT8 misses the target, the search keeps the
planted layer in float and the model it returns meets the target when run in ONNX Runtime; an
impossible target ends with ``met`` false and the best model kept."""

from __future__ import annotations

import html.parser
import json
from html import escape

import numpy as np
import onnxruntime as ort
import pytest

from quantcore import InvalidDataError, QuantizeConfig, quantize
from quantcore.config import AccuracyTarget
from quantcore.report.html import render_html
from tests.quantcore.models import planted_outlier, save

DATA = np.random.default_rng(1).normal(size=(96, 3, 8, 8)).astype(np.float32)
CALIBRATION, EVALUATION = {"input": DATA[:64]}, {"input": DATA[64:]}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save(planted_outlier(), tmp_path_factory.mktemp("planted") / "planted.onnx")


def run(model_path: str, out, target: AccuracyTarget, **kwargs):
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False, target=target)
    return quantize(model_path, CALIBRATION, EVALUATION, config, out, **kwargs)


def cosine_in_onnxruntime(fp32_path, qdq_path) -> float:
    """The kept model as a user would run it (ONNX Runtime, default optimizations) vs the FP32 model."""
    fp32 = ort.InferenceSession(str(fp32_path), providers=["CPUExecutionProvider"])
    qdq = ort.InferenceSession(str(qdq_path), providers=["CPUExecutionProvider"])
    x = fp32.run(None, EVALUATION)[0].astype(np.float64).ravel()
    y = qdq.run(None, EVALUATION)[0].astype(np.float64).ravel()
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


def test_target_met_by_keeping_the_planted_layer_in_float(model_path, tmp_path) -> None:
    result = run(model_path, tmp_path, AccuracyTarget("cosine", 0.999))
    target = result.report["target"]
    steps = target["steps"]
    assert steps[0]["float_layers"] == [] and steps[0]["value"] < 0.999  # full INT8 misses (measured 0.64)
    assert target["met"] is True and target["float_layers"] == ["conv3"]
    assert "met" in target["verdict"] and "NOT" not in target["verdict"]
    assert steps[target["chosen_step"]]["float_layers"] == ["conv3"]
    assert steps[1]["calibration"] == "reused"  # conv3 excluded: every other tensor keeps its observer
    assert result.report["config"]["exclude_node_patterns"] == ["conv3"]
    assert result.report["evaluation"]["qdq_deployed"]["outputs"]["logits"]["cosine"] >= 0.999
    # Independently of quantcore's evaluation: the file it left behind meets the target in ONNX Runtime
    # (cosine is deterministic on these 32 samples; the engine measured 0.99989, the same session kind).
    assert cosine_in_onnxruntime(model_path, result.model_path) >= 0.999
    assert result.report["evaluation"]["model"]["qdq_bytes"] > steps[0]["qdq_bytes"]  # conv3's weights in float


def test_impossible_target_fails_with_the_best_model_kept(model_path, tmp_path) -> None:
    target = AccuracyTarget("cosine", 0.9999999, max_float_layers=2)
    result = run(model_path, tmp_path, target)
    outcome = result.report["target"]
    assert outcome["met"] is False and "NOT met" in outcome["verdict"]
    values = [step["value"] for step in outcome["steps"]]
    best = outcome["steps"][outcome["chosen_step"]]
    assert best["value"] == max(values) and len(best["float_layers"]) <= 2
    assert all(len(step["float_layers"]) <= 2 for step in outcome["steps"])
    # The model on disk is the best step's: its cosine in ONNX Runtime is that step's value (1e-6: the
    # same deployed session kind on the same samples; only float summation order may differ).
    assert cosine_in_onnxruntime(model_path, result.model_path) == pytest.approx(best["value"], abs=1e-6)
    assert json.loads(result.report_path.read_text())["target"]["met"] is False


def test_top1_drop_needs_labels(model_path, tmp_path) -> None:
    with pytest.raises(InvalidDataError, match="top1_drop needs labels"):
        run(model_path, tmp_path, AccuracyTarget("top1_drop", 0.5))


def test_top1_drop_target_with_labels(model_path, tmp_path) -> None:
    # Labels = the FP32 model's own predictions, so FP32 top-1 is 1.0 and the drop is the flip rate.
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    labels = session.run(None, EVALUATION)[0].argmax(axis=1)
    result = run(model_path, tmp_path, AccuracyTarget("top1_drop", 0.0), labels=labels)
    target = result.report["target"]
    evaluation = result.report["evaluation"]
    assert evaluation["fp32"]["top1"] == 1.0 and evaluation["fp32"]["task_metrics"]["top5"] == 1.0
    assert target["met"] is True and evaluation["qdq_deployed"]["top1"] == 1.0
    assert target["steps"][0]["value"] > 50  # full INT8 flips most predictions (measured 97 points)


class _Parser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        self.tags.append(tag)
        self.urls += [value for key, value in attrs if key in ("src", "href") and value]


def test_html_report_is_standalone_with_the_layer_chart(model_path, tmp_path) -> None:
    result = run(model_path, tmp_path, AccuracyTarget("cosine", 0.999))
    page = (tmp_path / "report.html").read_text()
    assert page == render_html(result.report)
    parser = _Parser()
    parser.feed(page)
    assert "script" not in parser.tags and "link" not in parser.tags and parser.urls == []  # no external assets
    assert parser.tags.count("svg") == 1 and parser.tags.count("rect") == 4  # one bar per layer
    assert "conv3" in page and "cosine &gt;= 0.999" in page
    assert "<h2>Deployment</h2>" in page and escape(result.report["parity"]["reason"]) in page
    assert "Run it as measured" not in page  # nothing to change in how it runs
    rewrites_off = {**result.report, "config": {**result.report["config"], "disabled_optimizers": ["NchwcTransformer"]}}
    call = "onnxruntime.InferenceSession(path, disabled_optimizers=['NchwcTransformer'])"
    assert f"Run it as measured: <code>{escape(call)}</code>" in render_html(rewrites_off)
    hostile = {**result.report, "warnings": ["<script>alert(1)</script>"]}
    assert "<script>alert" not in render_html(hostile)  # report values are escaped
