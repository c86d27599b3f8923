"""Observers: streaming statistics of a tensor's values, one batch at a time.

Observers only observe: ``observe(x)`` folds one batch into a bounded state, ``bounds()`` returns
the range (lo, hi) the statistics support. Turning a range into scale and offset is
``quantcore.scaling.scale_offset``, the single place where that happens. State never grows with the
number of batches (``state_nbytes`` lets tests check it).

Registry: ``OBSERVERS[name](axis=..., percentile=...)`` builds an observer; ``TensorQuantConfig.observer``
holds one of these names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np


class Observer(Protocol):
    nonfinite: int  # count of NaN/inf values seen (ignored by the statistics)

    def observe(self, x: np.ndarray) -> None: ...

    def bounds(self) -> tuple[np.ndarray, np.ndarray]: ...

    @property
    def state_nbytes(self) -> int: ...


def _finite_values(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(x or its finite values, count of non-finite values). The check costs one pass over the batch."""
    finite = np.isfinite(x)
    if finite.all():
        return x, 0
    return x[finite], int(x.size - finite.sum())


class MinMaxObserver:
    """Running minimum and maximum: lo = min over all batches of x, hi = max of x.

    Per-tensor (``axis=None``): scalars. Per-channel: vectors of length C = x.shape[axis], each
    reduced over every other axis.
    """

    def __init__(self, axis: int | None = None) -> None:
        self.axis = axis
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        self.nonfinite = 0

    def observe(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0:
            return
        if self.axis is None:
            values, bad = _finite_values(x)
            self.nonfinite += bad
            if values.size == 0:
                return
            lo, hi = np.asarray(values.min(), np.float64), np.asarray(values.max(), np.float64)
        else:
            channels = np.moveaxis(x, self.axis, 0).reshape(x.shape[self.axis], -1)  # (C, rest)
            finite = np.isfinite(channels)
            bad = int(channels.size - finite.sum())
            self.nonfinite += bad
            if bad:
                lo = np.where(finite, channels, np.inf).min(axis=1).astype(np.float64)
                hi = np.where(finite, channels, -np.inf).max(axis=1).astype(np.float64)
            else:
                lo, hi = channels.min(axis=1).astype(np.float64), channels.max(axis=1).astype(np.float64)
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if self.lo is None or self.hi is None:
            return np.asarray(0.0), np.asarray(0.0)
        # A channel that only ever saw non-finite values keeps ±inf; report it as empty (0, 0).
        lo = np.where(np.isfinite(self.lo), self.lo, 0.0)
        hi = np.where(np.isfinite(self.hi), self.hi, 0.0)
        return lo, hi

    @property
    def state_nbytes(self) -> int:
        return sum(a.nbytes for a in (self.lo, self.hi) if a is not None)


class PercentileObserver:
    """Streaming histogram of |x|; amax = the ``percentile``-th percentile of |x|, bounds (-amax, amax).

    The histogram has ``bins`` equal bins over [0, top]. ``top`` starts at the first non-zero batch's
    max|x|; when a batch exceeds it, ``top`` grows by the smallest power of two 2^k that covers the new
    max and every 2^k adjacent bins merge into one (exact re-binning, no samples kept). The percentile
    is interpolated linearly inside its bin, so its error is at most one bin width, top / bins, and
    the result never exceeds the largest |x| seen.
    """

    def __init__(self, percentile: float = 99.99, bins: int = 2048) -> None:
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two >= 2, got {bins}")
        self.percentile = float(percentile)
        self.counts = np.zeros(bins, dtype=np.int64)  # (bins,) counts of |x| per bin
        self.top = 0.0  # upper edge of the last bin
        self.abs_max = 0.0
        self.nonfinite = 0

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def observe(self, x: np.ndarray) -> None:
        values, bad = _finite_values(np.asarray(x))
        self.nonfinite += bad
        if values.size == 0:
            return
        magnitudes = np.abs(values).ravel()
        batch_max = float(magnitudes.max())
        self.abs_max = max(self.abs_max, batch_max)
        if batch_max > self.top:
            self._grow(batch_max)
        bins = self.counts.size
        if self.top == 0.0:  # everything seen so far is exactly zero
            self.counts[0] += magnitudes.size
            return
        index = np.minimum((magnitudes * (bins / self.top)).astype(np.int64), bins - 1)
        self.counts += np.bincount(index, minlength=bins)

    def _grow(self, new_max: float) -> None:
        if self.top == 0.0:
            self.top = new_max  # zeros counted so far sit in bin 0 for any range
            return
        bins = self.counts.size
        k = math.ceil(math.log2(new_max / self.top))
        while self.top * 2.0**k < new_max:  # guard float rounding in log2
            k += 1
        factor = 2**k
        if factor >= bins:
            merged = np.zeros_like(self.counts)
            merged[0] = self.counts.sum()
        else:
            merged = np.zeros_like(self.counts)
            merged[: bins // factor] = self.counts.reshape(bins // factor, factor).sum(axis=1)
        self.counts = merged
        self.top *= float(factor)

    def amax(self) -> float:
        total = self.total
        if total == 0 or self.top == 0.0:
            return 0.0
        if self.percentile >= 100.0:
            return self.abs_max
        target = self.percentile / 100.0 * total
        cumulative = np.cumsum(self.counts)
        i = int(np.searchsorted(cumulative, target, side="left"))
        i = min(i, self.counts.size - 1)
        before = float(cumulative[i - 1]) if i > 0 else 0.0
        width = self.top / self.counts.size
        inside = (target - before) / float(self.counts[i]) if self.counts[i] else 1.0
        return min(self.abs_max, (i + inside) * width)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        amax = self.amax()
        return np.asarray(-amax), np.asarray(amax)

    @property
    def state_nbytes(self) -> int:
        return self.counts.nbytes + 3 * 8


def _minmax(*, axis: int | None, percentile: float) -> Observer:
    return MinMaxObserver(axis=axis)


def _percentile(*, axis: int | None, percentile: float) -> Observer:
    if axis is not None:
        raise ValueError("the percentile observer is per-tensor only")
    return PercentileObserver(percentile=percentile)


OBSERVERS: dict[str, Callable[..., Observer]] = {
    "minmax": _minmax,
    "percentile": _percentile,
}
ACTIVATION_OBSERVERS = ("minmax", "percentile")  # the choices QuantizeConfig.observer offers
