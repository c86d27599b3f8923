"""Range statistics of a quantized tensor against the range its calibrated config keeps.

``representable_range``: (quant_min - o)·s .. (quant_max - o)·s (FP8: ±quant_max·s), per channel when
the config is. ``RangeStats`` streams a tensor's observed min/max and the fraction of its values the
quantization saturates (none for a dynamic config, whose range is each value's own: its range is the
widest one a batch took). ``channel_range_ratio``: max_c amax_c / median_c amax_c of a weight, the
signature of an outlier channel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quantcore.numerics.tqc import TensorQuantConfig


def representable_range(tqc: TensorQuantConfig) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the values ``tqc`` keeps unclipped: (quant_min - o)·s, (quant_max - o)·s; FP8 ±quant_max·s.
    Scalars, or (C,) per channel."""
    scale = np.asarray(tqc.scale, np.float64)
    if tqc.floating:
        return -float(tqc.quant_max) * scale, float(tqc.quant_max) * scale
    offset = np.asarray(tqc.offset, np.float64)
    return (float(tqc.quant_min) - offset) * scale, (float(tqc.quant_max) - offset) * scale


def _broadcast(values: np.ndarray, tqc: TensorQuantConfig, ndim: int) -> np.ndarray:
    if values.ndim == 0 or not tqc.per_channel:
        return values
    shape = [1] * ndim
    shape[tqc.channel_axis] = -1
    return values.reshape(shape)


class RangeStats:
    """Streams min, max and the count of values the quantization saturates: linear, beyond half a step
    outside the representable range (nearer values round onto the end of the grid anyway); FP8, beyond
    ±quant_max·s."""

    def __init__(self, tqc: TensorQuantConfig) -> None:
        self.tqc = tqc
        if tqc.dynamic:  # DynamicQuantizeLinear's range [min(x, 0), max(x, 0)] holds every value
            self.lo = self.hi = self.saturate_lo = self.saturate_hi = None
        else:
            self.lo, self.hi = representable_range(tqc)
            half_step = 0.0 if tqc.floating else 0.5 * np.asarray(tqc.scale, np.float64)
            self.saturate_lo, self.saturate_hi = self.lo - half_step, self.hi + half_step
        self.minimum, self.maximum = math.inf, -math.inf
        self.clipped = 0
        self.total = 0

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        clipped = 0
        if not self.tqc.dynamic:
            lo = _broadcast(self.saturate_lo, self.tqc, x.ndim)
            hi = _broadcast(self.saturate_hi, self.tqc, x.ndim)
            clipped = int(np.count_nonzero((x < lo) | (x > hi)))
        self.add(float(x.min()), float(x.max()), clipped, x.size)

    def add(self, minimum: float, maximum: float, clipped: int, total: int) -> None:
        """A batch already reduced: its min and max, how many of its ``total`` values saturate."""
        if not total:
            return
        self.minimum = min(self.minimum, minimum)
        self.maximum = max(self.maximum, maximum)
        self.clipped += clipped
        self.total += total

    def result(self) -> dict[str, Any]:
        if self.tqc.dynamic:
            lo, hi = min(self.minimum, 0.0), max(self.maximum, 0.0)
        else:
            lo, hi = float(np.min(self.lo)), float(np.max(self.hi))
        return {
            "observed_min": self.minimum if self.total else None,
            "observed_max": self.maximum if self.total else None,
            "range_min": lo,
            "range_max": hi,
            "clipped_fraction": self.clipped / self.total if self.total else None,
        }


def channel_range_ratio(weight: np.ndarray, tqc: TensorQuantConfig) -> float | None:
    """max_c amax_c / median_c amax_c over the output channels (the tqc's channel axis, else axis 0)."""
    if weight.ndim < 2:
        return None
    axis = tqc.channel_axis if tqc.per_channel else 0
    amax = np.abs(np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)).max(axis=1)  # (C,)
    median = float(np.median(amax))
    return float(amax.max()) / median if median > 0 else None
