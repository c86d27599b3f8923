"""Rounding a real tensor to integers under each ``RoundingPolicy`` (torch, any device).

With f = ⌊v⌋ and the fractional part r = v - f (exact in floating point: f is within one unit of v),
the nearest-integer modes differ only on ties r = ½::

    HALF_UP             f + [r >= ½]
    HALF_DOWN           f + [r >  ½]
    HALF_EVEN           torch.round (IEEE round-half-even)
    HALF_AWAY_FROM_ZERO sign(v) · HALF_UP(|v|)
    HALF_TOWARDS_ZERO   sign(v) · HALF_DOWN(|v|)

Computing r rather than ⌊v + ½⌋ avoids the float32 error of v + ½ (0.49999997 + 0.5 rounds to 1.0).
``round_ste`` is the straight-through version: forward rounds, backward passes the gradient unchanged.
NaN stays NaN and ±inf stays ±inf in every mode.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from quantcore.numerics.policy import RoundingPolicy


def _half_up(v: torch.Tensor) -> torch.Tensor:
    f = torch.floor(v)
    return torch.where(v - f >= 0.5, f + 1, f)


def _half_down(v: torch.Tensor) -> torch.Tensor:
    f = torch.floor(v)
    return torch.where(v - f > 0.5, f + 1, f)


def _half_away_from_zero(v: torch.Tensor) -> torch.Tensor:
    return torch.sign(v) * _half_up(torch.abs(v))


def _half_towards_zero(v: torch.Tensor) -> torch.Tensor:
    return torch.sign(v) * _half_down(torch.abs(v))


ROUNDERS: dict[RoundingPolicy, Callable[[torch.Tensor], torch.Tensor]] = {
    RoundingPolicy.HALF_EVEN: torch.round,
    RoundingPolicy.HALF_UP: _half_up,
    RoundingPolicy.HALF_DOWN: _half_down,
    RoundingPolicy.HALF_TOWARDS_ZERO: _half_towards_zero,
    RoundingPolicy.HALF_AWAY_FROM_ZERO: _half_away_from_zero,
    RoundingPolicy.CEIL: torch.ceil,
    RoundingPolicy.FLOOR: torch.floor,
}


def round_values(v: torch.Tensor, rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN) -> torch.Tensor:
    """Integers (in v's floating dtype) nearest to ``v`` under ``rounding``; not differentiable.

    Infinite values pass through (the sign trick would turn inf - inf into NaN otherwise).
    """
    rounded = ROUNDERS[rounding](v)
    return torch.where(torch.isinf(v), v, rounded)


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return fn(v)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def straight_through(v: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """fn(v) forward; d/dv = 1 backward (the straight-through estimator) for any grid projection ``fn``.

    An autograd Function rather than ``v + (fn(v) - v).detach()``, which turns v = ±inf into NaN.
    """
    return _StraightThrough.apply(v, fn)


def round_ste(v: torch.Tensor, rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN) -> torch.Tensor:
    """round_values(v) forward; d/dv = 1 backward."""
    return straight_through(v, partial(round_values, rounding=rounding))
