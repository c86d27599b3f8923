"""A job recipe from the command line: an optional JSON file, then `--set a.b=value` overrides.

Values are parsed as JSON when they are valid JSON (`seed=3`, `calibration.percentile=99.9`,
`exclude.op_types=["Gemm"]`, `flag=true`) and kept as strings otherwise (`calibration.observer=minmax`).
The client validates nothing else: the API checks the recipe and names the offending field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class RecipeError(ValueError):
    """A recipe file or a `--set` override that cannot be read (a usage error, exit code 2)."""


def build_recipe(path: Path | None, overrides: Iterable[str]) -> dict[str, Any]:
    recipe = load_recipe(path) if path else {}
    for override in overrides:
        apply_override(recipe, override)
    return recipe


def load_recipe(path: Path) -> dict[str, Any]:
    try:
        recipe = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise RecipeError(f"recipe {path} is not valid JSON: {exc}") from exc
    if not isinstance(recipe, dict):
        raise RecipeError(f"recipe {path} must hold a JSON object, not {type(recipe).__name__}")
    return recipe


def apply_override(recipe: dict[str, Any], override: str) -> None:
    """`calibration.observer=minmax` → recipe["calibration"]["observer"] = "minmax" (in place)."""
    key, sep, raw = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise RecipeError(f"--set expects KEY.PATH=VALUE, got {override!r}")
    node = recipe
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(f"--set {override!r}: {part!r} is not an object in the recipe")
        node = child
    node[parts[-1]] = _parse_value(raw)


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
