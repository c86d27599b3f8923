"""Argument checks shared by the frozen spec dataclasses: each raises ValueError naming the field."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def require_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def require_bool(name: str, value: object) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def require_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def require_seconds(name: str, value: object) -> None:
    """None (no limit) or a finite number of seconds > 0."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    ):
        raise ValueError(f"{name} must be None or a number of seconds > 0, got {value!r}")


def string_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a tuple of strings, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise ValueError(f"{name} entries must be non-empty strings, got {item!r}")
    return tuple(value)


def require_range(name: str, value: object, lo: float, hi: float, *, integer: bool = False) -> None:
    """``lo <= value <= hi`` (an int when ``integer``), else ValueError naming the field."""
    if integer:
        require_int(name, value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
