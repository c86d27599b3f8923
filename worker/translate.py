"""The one place where the user-facing recipe becomes quantcore's own configuration."""

from __future__ import annotations

from typing import Any

from jobs.recipe import Recipe
from quantcore import QuantizeConfig


def to_quantize_config(recipe: Recipe, *, device: str = "cpu") -> QuantizeConfig:
    return QuantizeConfig(
        platform=recipe.platform,
        precision=recipe.precision,
        observer=recipe.calibration.observer,
        percentile=recipe.calibration.percentile,
        batch_size=recipe.calibration.batch_size,
        exclude_op_types=tuple(recipe.exclude.op_types),
        exclude_node_patterns=tuple(recipe.exclude.node_patterns),
        device=device,
    )


def parse_recipe(stored: dict[str, Any]) -> Recipe:
    return Recipe.model_validate(stored)
