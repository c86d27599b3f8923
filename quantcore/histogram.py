"""A streamed histogram of |x| and the observers that read a clip threshold from it.

``HistogramObserver`` keeps ``bins`` equal bins over [0, top] and nothing else of the samples. ``top``
starts at the first non-zero batch's max|x|; when a batch exceeds it, ``top`` grows by the smallest
power of two 2^k that covers the new max and every 2^k adjacent bins merge into one (exact
re-binning: memory is ``bins`` counters whatever the number of batches). The signed extremes seen are
kept too, so that an asymmetric config gets a one-sided range for a one-sided tensor.

Subclasses choose the threshold T (``amax()``); ``bounds()`` is (-T, T), or for an asymmetric target
grid (max(min x, -T), min(max x, T)). ``PercentileObserver`` here; KL, MSE and FP8 searches in
``quantcore.clipping``.
"""

from __future__ import annotations

import math

import numpy as np

from quantcore.tqc import TensorQuantConfig


def finite_values(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(x or its finite values, count of non-finite values). The check costs one pass over the batch."""
    finite = np.isfinite(x)
    if finite.all():
        return x, 0
    return x[finite], int(x.size - finite.sum())


class HistogramObserver:
    """Streamed histogram of |x| (see module). Base of the threshold observers; ``amax()`` = max|x|."""

    def __init__(self, *, bins: int = 2048, tqc: TensorQuantConfig | None = None) -> None:
        if bins < 2 or bins & (bins - 1):
            raise ValueError(f"bins must be a power of two >= 2, got {bins}")
        self.tqc = TensorQuantConfig() if tqc is None else tqc  # the target grid (int8 symmetric by default)
        self.counts = np.zeros(bins, dtype=np.int64)  # (bins,) counts of |x| per bin
        self.top = 0.0  # upper edge of the last bin
        self.abs_max = 0.0
        self.lo_seen = math.inf  # signed extremes, for asymmetric grids
        self.hi_seen = -math.inf
        self.nonfinite = 0

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def bin_width(self) -> float:
        return self.top / self.counts.size

    def centers(self) -> np.ndarray:
        """(bins,) bin centres, float64."""
        return (np.arange(self.counts.size) + 0.5) * self.bin_width

    def observe(self, x: np.ndarray) -> None:
        """Fold one batch in. Cost: two reductions (min, max) that also detect NaN/inf, then one pass
        computing bin indices i = floor(|x| · bins / top) in x's float type (float32 at least) and one
        ``np.bincount`` (i = bins, i.e. |x| = top, counts in the last bin); a batch holding NaN/inf
        takes a slower path that drops them first."""
        values = np.asarray(x).ravel()  # a view for the contiguous arrays ONNX Runtime returns; 0-d → (1,)
        if values.size == 0:
            return
        lo, hi = float(values.min()), float(values.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates through min/max, ±inf shows
            values, bad = finite_values(values)
            self.nonfinite += bad
            if values.size == 0:
                return
            lo, hi = float(values.min()), float(values.max())
        self.lo_seen = min(self.lo_seen, lo)
        self.hi_seen = max(self.hi_seen, hi)
        batch_max = max(-lo, hi)
        self.abs_max = max(self.abs_max, batch_max)
        if batch_max > self.top:
            self._grow(batch_max)
        bins = self.counts.size
        if self.top == 0.0:  # everything seen so far is exactly zero
            self.counts[0] += values.size
            return
        if values.dtype.kind != "f" or values.itemsize < 4:  # float16 indices would round past bins
            values = values.astype(np.float32)
        scaled = np.multiply(values, bins / self.top)  # one temporary of x's size, reused in place
        np.abs(scaled, out=scaled)
        counts = np.bincount(scaled.astype(np.intp), minlength=bins + 1)
        counts[bins - 1] += counts[bins]  # |x| = top lands on index bins: the last bin is closed
        self.counts += counts[:bins]

    def _grow(self, new_max: float) -> None:
        if self.top == 0.0:
            self.top = new_max  # zeros counted so far sit in bin 0 for any range
            return
        bins = self.counts.size
        k = math.ceil(math.log2(new_max / self.top))
        while self.top * 2.0**k < new_max:  # guard float rounding in log2
            k += 1
        factor = 2**k
        merged = np.zeros_like(self.counts)
        if factor >= bins:
            merged[0] = self.counts.sum()
        else:
            merged[: bins // factor] = self.counts.reshape(bins // factor, factor).sum(axis=1)
        self.counts = merged
        self.top *= float(factor)

    def used_bins(self) -> int:
        """Bins up to the one holding abs_max: candidate thresholds beyond it clip nothing."""
        if self.top == 0.0:
            return 0
        return min(self.counts.size, max(1, math.ceil(self.abs_max / self.bin_width)))

    def amax(self) -> float:
        return self.abs_max

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        amax = self.amax() if self.total else 0.0
        if self.tqc.symmetric or self.total == 0:
            return np.asarray(-amax), np.asarray(amax)
        return np.asarray(max(self.lo_seen, -amax)), np.asarray(min(self.hi_seen, amax))

    @property
    def state_nbytes(self) -> int:
        return self.counts.nbytes + 5 * 8


class PercentileObserver(HistogramObserver):
    """amax = the ``percentile``-th percentile of |x|, from the streamed histogram.

    The percentile is interpolated linearly inside its bin, so its error is at most one bin width,
    top / bins, and the result never exceeds the largest |x| seen.
    """

    def __init__(self, percentile: float = 99.99, bins: int = 2048, *, tqc: TensorQuantConfig | None = None) -> None:
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        super().__init__(bins=bins, tqc=tqc)
        self.percentile = float(percentile)

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
        inside = (target - before) / float(self.counts[i]) if self.counts[i] else 1.0
        return min(self.abs_max, (i + inside) * self.bin_width)
