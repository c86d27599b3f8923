"""A streamed histogram of |x| and the observers that read a clip threshold from it.

``HistogramObserver`` keeps ``bins`` equal bins over [0, top] and nothing else of the samples. ``top``
starts at the first non-zero batch's max|x|; when a batch exceeds it, ``top`` grows by the smallest
power of two 2^k that covers the new max and every 2^k adjacent bins merge into one (exact
re-binning: memory is ``bins`` counters whatever the number of batches). The signed extremes seen are
kept too, so that an asymmetric config gets a one-sided range for a one-sided tensor.

Bins below ``floor`` may be left unresolved: their total count is kept in bin ``floor - 1`` and the
bins under it stay empty, so cumulative counts from bin ``floor - 1`` upwards are exact. A batch then
costs one comparison per value and a ``np.bincount`` of the values at or above the floor only, instead
of a bincount of every value (the bincount is most of an observer's time: some 1.1 ns of the 2.3 ns per
float32 value on ocr-rec's activations). Merging 2^k bins keeps the property, the floor becoming
ceil(floor / 2^k). The base class and the KL/MSE searches resolve every bin (floor 0); the percentile
needs only the tail above its bin (``PercentileObserver``).

Once a floor is in force, a float batch of ``SKIP_MIN_VALUES`` values or more (a multiple of ``ROWS``)
is read as ``ROWS`` rows, column j holding one position of each sample of a batch of 8: the min and
max of every column replace the two global reductions, and only the columns whose extremes reach the
floor are binned; the others hold no value at or above it and go to bin ``floor - 1`` uncounted.
Large activations tend to sit at the same positions in every sample: on ocr-rec's first batch 1.2 %
of the values are at or above the floor, in 5.3 % of the columns (in contiguous blocks of 1024 values
they would be spread over 37 % of the blocks). Counts are the same as binning every value.

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


ROWS = 8  # a batch of 8 (16, 32...) samples read as 8 rows: column j is one position in each sample
SKIP_MIN_VALUES = 1 << 16  # smaller batches bin every value: the per-row passes would cost more in calls
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # binned in their own type (others: float32 copies)


def column_extremes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) of each column of ``values`` (size a multiple of ROWS) read as (ROWS, size / ROWS), in
    ROWS - 1 elementwise passes each (numpy's reduce over axis 0 makes the same passes, 1.7x slower)."""
    rows = values.reshape(ROWS, -1)
    lo, hi = np.minimum(rows[0], rows[1]), np.maximum(rows[0], rows[1])
    for row in rows[2:]:
        np.minimum(lo, row, out=lo)
        np.maximum(hi, row, out=hi)
    return lo, hi


def bin_multiplier(values: np.ndarray, bins: int, top: float) -> tuple[np.ndarray, float]:
    """(values', m) with values' · m = x · bins / top in x's float type (float32 or float64).

    m = bins / top, values' = x, unless m overflows that type (top below bins / its largest finite
    value: about 6e-36 in float32, 1e-305 in float64; subnormals included): then values' = x · 2^k
    (exact: scaling up by a power of two loses no bit) and m = bins / (top · 2^k), top · 2^k in
    [0.5, 1). The product is then x · bins / top rounded once, as it would be with no overflow."""
    multiplier = bins / top  # Python float: inf when it overflows float64 too
    if multiplier <= float(np.finfo(values.dtype).max):
        return values, multiplier
    mantissa, exponent = math.frexp(top)  # top = mantissa · 2^exponent
    return np.ldexp(values, -exponent), bins / mantissa


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
        self.floor = 0  # bins below it unresolved, their count in bin floor - 1 (see module)

    @property
    def complete(self) -> bool:
        """Whether the statistics determine ``amax()``: always, when every bin is resolved."""
        return self.floor == 0

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
        ``np.bincount`` (i = bins, i.e. |x| = top, counts in the last bin) of the indices >= ``floor``
        (all of them at floor 0, see module); a batch holding NaN/inf takes a slower path that drops
        them first. Once a floor is in force, a large float batch is read as ``ROWS`` rows: the two
        reductions run per column, and only the columns whose extremes reach the floor are binned."""
        values = np.asarray(x).ravel()  # a view for the contiguous arrays ONNX Runtime returns; 0-d → (1,)
        if values.size == 0:
            return
        columns = None
        if self.floor and values.size >= SKIP_MIN_VALUES and values.size % ROWS == 0 and values.dtype in FLOATS:
            columns = column_extremes(values)  # (n / ROWS,) min and max per column
            lo, hi = float(columns[0].min()), float(columns[1].max())
        else:
            lo, hi = float(values.min()), float(values.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates through min/max, ±inf shows
            values, bad = finite_values(values)
            self.nonfinite += bad
            if values.size == 0:
                return
            lo, hi = float(values.min()), float(values.max())
            columns = None
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
        size = values.size
        values, multiplier = bin_multiplier(values, bins, self.top)
        if columns is not None and self.floor:  # (growing top may have merged the floor away)
            values = self._reaching_columns(values, columns, multiplier)
        scaled = np.multiply(values, multiplier)  # one temporary of x's size, reused in place
        np.abs(scaled, out=scaled)
        if not self.floor:
            self._raise_floor(self.choose_floor(scaled))
        resolved = scaled if self.floor == 0 else scaled[scaled >= self.floor]  # trunc(i) >= floor <=> i >= floor
        counts = np.bincount(resolved.astype(np.intp), minlength=bins + 1)
        counts[bins - 1] += counts[bins]  # |x| = top lands on index bins: the last bin is closed
        if self.floor:
            counts[self.floor - 1] += size - resolved.size
        self.counts += counts[:bins]

    def _reaching_columns(
        self, values: np.ndarray, columns: tuple[np.ndarray, np.ndarray], multiplier: float
    ) -> np.ndarray:
        """The (ROWS, k) columns of ``values`` (already through ``bin_multiplier``) where some |x| reaches
        the floor, or all of ``values`` when that is more than half of them (the copy would cost more
        than it saves). Exact: |x| · bins / top rounds monotonically in |x|, so a column whose extremes
        stay below the floor holds no value at or above it (and rounding to nearest is symmetric, so
        lo · m <= -floor tests |lo| · m >= floor); bin_multiplier scales the extremes as it scaled the
        values."""
        lo, hi = (bin_multiplier(extremes, self.counts.size, self.top)[0] for extremes in columns)
        reach = (np.multiply(lo, multiplier) <= -self.floor) | (np.multiply(hi, multiplier) >= self.floor)
        if 2 * np.count_nonzero(reach) > reach.size:
            return values
        return np.compress(reach, values.reshape(ROWS, -1), axis=1)

    def choose_floor(self, scaled: np.ndarray) -> int:
        """The floor wanted before binning ``scaled`` (|x| · bins / top), asked while none is in force:
        0, every bin resolved."""
        return 0

    def _raise_floor(self, floor: int) -> None:
        """Leave bins below ``floor`` unresolved from now on (a lower floor is kept: lost bins stay lost)."""
        if floor <= max(self.floor, 1):  # floor 1: bin 0 holds only its own count
            return
        self.counts[floor - 1] = self.counts[:floor].sum()
        self.counts[: floor - 1] = 0
        self.floor = floor

    def _grow(self, new_max: float) -> None:
        if self.top == 0.0:
            self.top = new_max  # zeros counted so far sit in bin 0 for any range
            return
        bins = self.counts.size
        mantissa, exponent = math.frexp(self.top)  # exact, with no overflow of new_max / top
        new_mantissa, new_exponent = math.frexp(new_max)
        k = new_exponent - exponent + (new_mantissa > mantissa)  # the smallest k with top · 2^k >= new_max
        factor = 2**k
        merged = np.zeros_like(self.counts)
        if factor >= bins:
            merged[0] = self.counts.sum()
        else:
            merged[: bins // factor] = self.counts.reshape(bins // factor, factor).sum(axis=1)
        self.counts = merged
        self.top = math.ldexp(self.top, k)
        floor = -(-self.floor // factor)  # ceil: the merged bin holding floor - 1 holds all below it
        self.floor = floor if floor > 1 else 0

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


def _prime_at_least(n: int) -> int:
    """The smallest prime >= n (n >= 2; trial division, n is at most a few thousand here)."""
    while any(n % d == 0 for d in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


class PercentileObserver(HistogramObserver):
    """amax = the ``percentile``-th percentile of |x|, from the streamed histogram.

    The percentile is interpolated linearly inside its bin, so its error is at most one bin width,
    top / bins, and the result never exceeds the largest |x| seen.

    Only the cumulative count below the percentile's bin and the counts from that bin up enter the
    result, so the bins far below it are left unresolved (``floor``, see module), which makes
    ``amax()`` bit-identical to a fully resolved histogram's at a fraction of the cost. The floor is
    set once, on the first binned batch large enough to place it, at the bin of the (1 - f) quantile
    of some ``FLOOR_SAMPLE`` values of that batch, f = ``TAIL_MARGIN`` · (1 - percentile / 100): 64
    times more values resolved than the percentile needs (99.99: the top 0.64 %). The sample takes
    every p-th value, p a prime of at least 11 (a stride sharing a factor with a row length samples
    the same columns again and again: stride 20 on ocr-det's rows of 160 put the quantile 3.5 times
    too high). ``complete`` tells whether the data kept the percentile above the floor; when it did
    not (later batches far lighter-tailed than the first), ``amax()`` raises and the caller observes
    again with ``resolve_all=True``.
    """

    TAIL_MARGIN = 64
    FLOOR_SAMPLE = 1 << 14
    MIN_TAIL_SAMPLE = 64  # sampled values above the floor, at least: fewer leave the quantile too noisy

    def __init__(
        self,
        percentile: float = 99.99,
        bins: int = 2048,
        *,
        tqc: TensorQuantConfig | None = None,
        resolve_all: bool = False,
    ) -> None:
        if not 0.0 < percentile <= 100.0:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        super().__init__(bins=bins, tqc=tqc)
        self.percentile = float(percentile)
        self.floor_chosen = resolve_all  # resolve_all: never a floor

    def choose_floor(self, scaled: np.ndarray) -> int:
        if self.floor_chosen:
            return 0
        tail = self.TAIL_MARGIN * (1.0 - self.percentile / 100.0)  # fraction of values resolved
        stride = 1
        if scaled.size > 4 * self.FLOOR_SAMPLE:
            stride = _prime_at_least(max(11, scaled.size // self.FLOOR_SAMPLE))
        sample = scaled[::stride]
        kept = int(sample.size * tail)
        if tail >= 1.0 or kept < self.MIN_TAIL_SAMPLE:
            return 0  # nothing to save, or too few values to place the floor: resolve this batch fully
        self.floor_chosen = True
        bins = self.counts.size
        # from_top[j]: sampled values in bins >= bins - j
        from_top = np.cumsum(np.bincount(sample.astype(np.intp), minlength=bins + 1)[::-1])
        floor = bins - int(np.searchsorted(from_top, kept))  # the bin of the kept-th largest sampled value
        return min(floor, bins - 1)  # below the last bin, which also takes |x| = top

    @property
    def complete(self) -> bool:
        if self.floor == 0 or self.percentile >= 100.0:
            return True
        unresolved = int(self.counts[: self.floor].sum())
        return unresolved < self.percentile / 100.0 * self.total  # the percentile's bin is >= floor

    def amax(self) -> float:
        total = self.total
        if total == 0 or self.top == 0.0:
            return 0.0
        if self.percentile >= 100.0:
            return self.abs_max
        if not self.complete:
            raise ValueError("the percentile fell below the histogram's floor: observe again with resolve_all=True")
        target = self.percentile / 100.0 * total
        cumulative = np.cumsum(self.counts)
        i = int(np.searchsorted(cumulative, target, side="left"))
        i = min(i, self.counts.size - 1)
        before = float(cumulative[i - 1]) if i > 0 else 0.0
        inside = (target - before) / float(self.counts[i]) if self.counts[i] else 1.0
        return min(self.abs_max, (i + inside) * self.bin_width)
