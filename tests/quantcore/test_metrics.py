"""Evaluation metrics and the JSON report conversion."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantcore.metrics import OutputAgreement, TopKAccuracy
from quantcore.report import jsonable


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


def test_jsonable_turns_numpy_and_non_finite_values_into_plain_json() -> None:
    converted = jsonable(
        {"a": np.float32(1.5), "b": np.int64(3), "c": float("nan"), "d": (np.inf, np.arange(2)), "e": np.bool_(True)}
    )
    assert converted == {"a": 1.5, "b": 3, "c": None, "d": [None, [0, 1]], "e": True}
    json.dumps(converted, allow_nan=False)
