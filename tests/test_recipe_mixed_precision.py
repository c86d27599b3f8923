"""The recipe's mixed_precision option: its bounds and refusals name the field, and it translates to
quantcore's ``MixedPrecisionConfig`` (the search itself: tests/quantcore/test_mixed_precision.py)."""

from __future__ import annotations

import pytest

from jobs.recipe import Recipe
from quantcore.config import AccuracyTarget, MixedPrecisionConfig
from tests.test_recipe import error_of
from worker.translate import to_quantize_config


@pytest.mark.parametrize(
    ("recipe", "field", "needle"),
    [
        ({"mixed_precision": {"max_fraction": 0}}, "mixed_precision.max_fraction", "greater than 0"),
        ({"mixed_precision": {"max_fraction": 0.6}}, "mixed_precision.max_fraction", "less than or equal to 0.5"),
        ({"mixed_precision": {"metric": "top1_drop"}}, "mixed_precision.metric", "'cosine' or 'sqnr'"),
        ({"mixed_precision": {"threshold": 1.5}}, "mixed_precision.threshold", "[-1, 1]"),
        ({"mixed_precision": {"bits": 16}}, "mixed_precision.bits", "Extra inputs"),
        (
            {"target": {"metric": "sqnr", "threshold": 30}, "mixed_precision": {}},
            "mixed_precision",
            "cannot be combined with a target",
        ),
        ({"reconstruction": {"method": "adaround"}, "mixed_precision": {}}, "mixed_precision", "a reconstruction"),
        ({"bias_correction": True, "mixed_precision": {}}, "mixed_precision", "bias_correction"),
        ({"platform": "onnxruntime-weight-only", "mixed_precision": {}}, "", "mixed_precision do not apply"),
    ],
)
def test_bad_mixed_precision_names_the_field(recipe: dict, field: str, needle: str) -> None:
    location, message = error_of(recipe)
    assert location == field and needle in message, (location, message)


def test_mixed_precision_translates_off_by_default() -> None:
    assert to_quantize_config(Recipe.model_validate({})).mixed_precision is None
    recipe = {"platform": "onnxruntime", "mixed_precision": {"max_fraction": 0.1, "metric": "sqnr", "threshold": 35}}
    config = to_quantize_config(Recipe.model_validate(recipe))
    assert config.mixed_precision == MixedPrecisionConfig(0.1, AccuracyTarget("sqnr", 35.0))
    default = to_quantize_config(Recipe.model_validate({"mixed_precision": {}})).mixed_precision
    assert default == MixedPrecisionConfig()  # the recipe's defaults are quantcore's
