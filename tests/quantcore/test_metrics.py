"""Evaluation metrics and the JSON report conversion."""

from __future__ import annotations

import json
import math

import numpy as np
import onnxruntime as ort
import pytest

from quantcore import QuantizeConfig, evaluate
from quantcore.jsonable import jsonable
from quantcore.numerics.metrics import TASK_METRICS, OutputAgreement, TopKAccuracy, as_array, register_task_metric
from quantcore.runtime.batching import output_batch_axes
from samples.tiny import stateful_data, stateful_model
from tests.quantcore.models import conv_relu_gemm, save


def test_metrics_match_their_formulas_across_batches() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 6))
    y = x + rng.normal(scale=0.1, size=x.shape)
    y[0] = x[0][::-1]  # make at least one argmax disagree
    metric = OutputAgreement()
    for start in range(0, 10, 3):
        metric.update(x[start : start + 3], y[start : start + 3])
    result = metric.result()
    e = x - y
    assert result["sqnr_db"] == pytest.approx(10 * math.log10((x**2).sum() / (e**2).sum()), rel=1e-12)
    assert result["cosine"] == pytest.approx((x * y).sum() / math.sqrt((x**2).sum() * (y**2).sum()), rel=1e-12)
    assert result["max_abs_error"] == pytest.approx(np.abs(e).max())
    assert result["mean_abs_error"] == pytest.approx(np.abs(e).mean())
    assert result["argmax_agreement"] == pytest.approx((x.argmax(1) == y.argmax(1)).mean())


def test_perfect_match_has_undefined_sqnr_and_rank_one_has_no_argmax() -> None:
    metric = OutputAgreement()
    metric.update(np.arange(5.0), np.arange(5.0))
    result = metric.result()
    assert result["sqnr_db"] is None  # infinite: reported as null, never a stand-in number
    assert result["cosine"] == pytest.approx(1.0) and result["argmax_agreement"] is None


def test_top_one() -> None:
    accuracy = TopKAccuracy(1)
    accuracy.update(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), np.array([1, 1, 1]))
    assert accuracy.result() == pytest.approx(2 / 3)


def test_top_five_and_its_undefined_case() -> None:
    scores = np.tile(np.arange(10.0), (3, 1))  # every row ranks class 9 first, class 0 last
    accuracy = TopKAccuracy(5)
    accuracy.update(scores, np.array([5, 4, 9]))  # 5 and 9 are among the top five (5..9), 4 is not
    assert accuracy.result() == pytest.approx(2 / 3)
    few = TopKAccuracy(5)
    few.update(np.ones((2, 5)), np.array([0, 1]))
    assert few.result() is None  # five classes: top-5 would be trivially 1


def test_non_finite_values_fp32_has_too_agree_and_stay_out_of_the_sums() -> None:
    # a log of 0 (-inf) and a sqrt of a negative (NaN) in FP32, reproduced by the quantized model
    x = np.array([[1.0, 2.0, np.nan, -np.inf, 3.0]])
    agree = OutputAgreement()
    agree.update(x, np.array([[1.1, 2.0, np.nan, -np.inf, 3.0]]))
    result = agree.result()
    assert result["nonfinite"] == 0
    assert result["sqnr_db"] == pytest.approx(10 * math.log10((1 + 4 + 9) / 0.1**2), rel=1e-9)
    assert result["max_abs_error"] == pytest.approx(0.1)
    assert result["mean_abs_error"] == pytest.approx(0.1 / 3)  # over the three finite pairs
    assert result["exact_match"] == pytest.approx(4 / 5)  # NaN = NaN and -inf = -inf count as equal
    assert result["comparison"] == "numeric"
    # non-finite where FP32 is finite, a finite value where FP32 is not, and the other infinity
    for candidate in (
        [[1.0, np.inf, np.nan, -np.inf, 3.0]],
        [[1.0, 2.0, 0.0, -np.inf, 3.0]],
        [[1, 2, np.nan, np.inf, 3]],
    ):
        disagree = OutputAgreement()
        disagree.update(x, np.array(candidate, dtype=np.float64))
        assert disagree.result()["nonfinite"] == 1
        assert disagree.result()["sqnr_db"] is None and disagree.result()["cosine"] is None


def test_outputs_that_are_not_float_tensors() -> None:
    # integer class ids and string labels: compared for equality only
    for reference, candidate in (
        (np.array([3, 1, 4, 1]), np.array([3, 1, 5, 1])),
        (np.array(["cat", "dog", "cat", "owl"], dtype=object), np.array(["cat", "dog", "owl", "owl"], dtype=object)),
    ):
        metric = OutputAgreement()
        metric.update(reference, candidate)
        result = metric.result()
        assert result["comparison"] == "equality" and result["exact_match"] == pytest.approx(3 / 4)
        assert result["sqnr_db"] is None and result["argmax_agreement"] is None and result["nonfinite"] == 0
        assert metric.elements == 0  # nothing numeric: no SQNR for the clip search or the analysis to rank by
    # a ZipMap (a list of {class: probability}) is the (samples, classes) array of its probabilities
    zipmap = [{0: 0.7, 1: 0.2, 2: 0.1}, {0: 0.1, 1: 0.3, 2: 0.6}]
    assert as_array(zipmap).tolist() == [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]
    metric = OutputAgreement()
    metric.update(zipmap, [{0: 0.6, 1: 0.3, 2: 0.1}, {0: 0.1, 1: 0.3, 2: 0.6}])
    result = metric.result()
    assert result["comparison"] == "numeric" and result["argmax_agreement"] == 1.0
    assert result["sqnr_db"] == pytest.approx(10 * math.log10(sum(v * v for d in zipmap for v in d.values()) / 0.02))
    # a sequence of equal-shaped tensors is stacked; a ragged one is compared item by item
    assert as_array([np.zeros(2), np.ones(2)]).shape == (2, 2)
    ragged = [np.zeros(2), np.ones(3)]
    assert as_array(ragged) is None
    metric = OutputAgreement()
    metric.update(ragged, [np.zeros(2), np.full(3, 2.0)])
    assert metric.result()["exact_match"] == pytest.approx(1 / 2)


def test_relative_error_percentiles_are_over_samples() -> None:
    metric = OutputAgreement()
    reference = np.ones((100, 4))
    candidate = reference * (1 + np.arange(100)[:, None] / 1000)  # sample i off by exactly i/1000 relatively
    metric.update(reference[:50], candidate[:50])
    metric.update(reference[50:], candidate[50:])  # streamed in two batches
    result = metric.result()
    # numpy's linear-interpolation percentiles of 0, 0.001, ..., 0.099 (float rounding only)
    assert result["relative_error_p50"] == pytest.approx(0.0495, abs=1e-9)
    assert result["relative_error_p90"] == pytest.approx(0.0891, abs=1e-9)
    assert result["relative_error_p99"] == pytest.approx(0.09801, abs=1e-9)


def test_relative_error_percentiles_follow_the_sample_axis() -> None:
    # the same samples as above, laid out as a recurrent state (2, samples, 4): sample i on axis 1
    reference = np.ones((2, 100, 4))
    candidate = reference * (1 + np.arange(100)[None, :, None] / 1000)
    on_axis_1 = OutputAgreement(sample_axis=1)
    on_axis_1.update(reference[:, :50], candidate[:, :50])
    on_axis_1.update(reference[:, 50:], candidate[:, 50:])
    assert on_axis_1.result()["relative_error_p50"] == pytest.approx(0.0495, abs=1e-9)
    assert on_axis_1.result()["relative_error_p99"] == pytest.approx(0.09801, abs=1e-9)
    on_axis_0 = OutputAgreement()  # two "samples" that mix all 100: both off by the same mean
    on_axis_0.update(reference, candidate)
    assert on_axis_0.result()["relative_error_p50"] == pytest.approx(on_axis_0.result()["relative_error_p99"])


def test_evaluation_slices_labels_and_samples_whatever_the_input_order(tmp_path) -> None:
    # the scalar sr first and the state (samples on axis 1) second: neither gives the batch's size
    model = stateful_model()
    inputs = list(model.graph.input)
    del model.graph.input[:]
    model.graph.input.extend([inputs[2], inputs[1], inputs[0]])
    assert output_batch_axes(model) == {"y": 0, "state_out": 1}
    path = save(model, tmp_path / "stateful.onnx")
    data = stateful_data(12, seed=2)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    labels = session.run(["y"], data)[0].argmax(axis=-1)  # the FP32 model's own answers
    result = evaluate(path, path, data, QuantizeConfig(batch_size=5), labels=labels)
    # exact: labels misaligned with their samples (batches of 5, 5, 2) would score below 1
    assert result["fp32"]["top1"] == 1.0
    assert result["num_samples"] == 12


def test_task_metrics_are_pluggable(tmp_path) -> None:
    class MeanScore:
        def __init__(self) -> None:
            self.values: list[float] = []

        def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
            self.values.append(float(logits.mean()))

        def result(self) -> float | None:
            return float(np.mean(self.values)) if self.values else None

    register_task_metric("mean_score", MeanScore)
    try:
        path = save(conv_relu_gemm(), tmp_path / "m.onnx")
        inputs = np.random.default_rng(0).normal(size=(8, 2, 6, 6)).astype(np.float32)
        # The FP32 model stands in for the quantized one: evaluate only needs two runnable models.
        report = evaluate(path, path, {"input": inputs}, QuantizeConfig(), labels=np.zeros(8, np.int64))
        for mode in ("fp32", "qdq_exact", "qdq_deployed"):
            assert set(report[mode]["task_metrics"]) == {"top1", "top5", "mean_score"}
        # the same model under two optimization levels: equal up to float32 rounding of fused kernels
        fp32, exact = report["fp32"]["task_metrics"]["mean_score"], report["qdq_exact"]["task_metrics"]["mean_score"]
        assert exact == pytest.approx(fp32, rel=1e-5)
        with pytest.raises(ValueError, match="already registered"):
            register_task_metric("top1", MeanScore)
    finally:
        del TASK_METRICS["mean_score"]


def test_jsonable_turns_numpy_and_non_finite_values_into_plain_json() -> None:
    converted = jsonable(
        {"a": np.float32(1.5), "b": np.int64(3), "c": float("nan"), "d": (np.inf, np.arange(2)), "e": np.bool_(True)}
    )
    assert converted == {"a": 1.5, "b": 3, "c": None, "d": [None, [0, 1]], "e": True}
    json.dumps(converted, allow_nan=False)
