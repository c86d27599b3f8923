"""The recipe's deploy.cpu_objective / cpu_threads / batch_sizes / timing_share: defaults per platform, 422 cases
naming the field, and their translation into QuantizeConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.recipe import Recipe
from worker.translate import to_quantize_config


def test_latency_is_the_default_on_onnxruntime_only() -> None:
    assert Recipe(platform="onnxruntime").deploy.cpu_objective == "latency"
    assert Recipe().deploy.cpu_objective == "accuracy"  # tensorrt, the default recipe: unchanged
    assert Recipe(platform="onnxruntime-dynamic").deploy.cpu_objective == "accuracy"
    assert Recipe(platform="onnxruntime").deploy.batch_sizes == [1, 32]


@pytest.mark.parametrize(
    ("deploy", "platform", "needle"),
    [
        ({"cpu_objective": "latency"}, "tensorrt", "cpu_objective latency needs platform onnxruntime"),
        ({"cpu_objective": "fastest"}, "onnxruntime", "cpu_objective"),
        ({"cpu_threads": 0}, "onnxruntime", "cpu_threads"),
        ({"cpu_threads": 1000}, "onnxruntime", "cpu_threads"),
        ({"batch_sizes": []}, "onnxruntime", "batch_sizes"),
        ({"batch_sizes": [0]}, "onnxruntime", "batch_sizes"),
        ({"batch_sizes": [1, 5000]}, "onnxruntime", "batch_sizes"),
        ({"timing_share": 0.05}, "onnxruntime", "timing_share"),
        ({"timing_share": 101}, "onnxruntime", "timing_share"),
        ({"timing_share": "a lot"}, "onnxruntime", "timing_share"),
    ],
)
def test_invalid_deploy_settings_name_the_field(deploy: dict, platform: str, needle: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Recipe.model_validate({"platform": platform, "deploy": deploy})
    errors = raised.value.errors()
    assert any(error["loc"][0] == "deploy" for error in errors)
    assert needle in str(raised.value)


def test_deploy_settings_translate(tmp_path: Path) -> None:
    recipe = Recipe.model_validate({"platform": "onnxruntime", "deploy": {"cpu_threads": 2, "batch_sizes": [32, 1, 8]}})
    config = to_quantize_config(recipe, timing_cache=tmp_path / "timings")
    assert config.cpu_objective == "latency" and config.cpu_threads == 2
    assert config.cpu_batch_sizes == (1, 8, 32) and config.cpu_timing_cache == str(tmp_path / "timings")
    accuracy = to_quantize_config(
        Recipe.model_validate({"platform": "onnxruntime", "deploy": {"cpu_objective": "accuracy"}})
    )
    assert accuracy.cpu_objective == "accuracy" and accuracy.cpu_timing_cache is None
    assert to_quantize_config(Recipe()).cpu_objective == "accuracy"
    assert config.cpu_timing_share == 1.0
    for share in (0.1, 4.0, 100.0):  # the recipe's bounds are within the engine's
        deploy = {"timing_share": share}
        recipe = Recipe.model_validate({"platform": "onnxruntime", "deploy": deploy})
        assert to_quantize_config(recipe).cpu_timing_share == share


def test_the_onnxruntime_alternative_is_measured_only_for_an_unnamed_default_platform() -> None:
    """Whether the platform was named is recorded at submission and survives the stored recipe (every field
    filled in) being validated again on the worker."""
    unnamed = Recipe.model_validate(Recipe().model_dump(mode="json"))
    named = Recipe.model_validate(Recipe(platform="tensorrt").model_dump(mode="json"))
    assert unnamed.platform_named is False and named.platform_named is True
    assert to_quantize_config(unnamed).cpu_alternative is True
    assert to_quantize_config(named).cpu_alternative is False
    assert to_quantize_config(Recipe(platform="onnxruntime")).cpu_alternative is False
