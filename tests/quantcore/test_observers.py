"""Observers (streaming statistics) and the statistics → scale/offset function."""

from __future__ import annotations

import numpy as np
import pytest

from quantcore.observers import MinMaxObserver, PercentileObserver
from quantcore.scaling import scale_offset
from quantcore.tqc import TensorQuantConfig


def test_minmax_per_tensor_and_per_channel() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, 3, 5)).astype(np.float32) for _ in range(6)]
    whole = np.concatenate(batches)
    per_tensor, per_channel = MinMaxObserver(), MinMaxObserver(axis=1)
    for batch in batches:
        per_tensor.observe(batch)
        per_channel.observe(batch)
    lo, hi = per_tensor.bounds()
    assert lo == whole.min() and hi == whole.max()  # exact: min/max involve no arithmetic
    lo, hi = per_channel.bounds()
    np.testing.assert_array_equal(lo, whole.min(axis=(0, 2)))
    np.testing.assert_array_equal(hi, whole.max(axis=(0, 2)))


def test_percentile_matches_numpy_within_one_bin_while_the_range_grows() -> None:
    rng = np.random.default_rng(1)
    # magnitudes grow batch after batch, forcing several re-binnings of the histogram
    batches = [rng.normal(scale=1.0 + 0.7 * i, size=5000).astype(np.float32) for i in range(12)]
    observer = PercentileObserver(percentile=99.9, bins=2048)
    for batch in batches:
        observer.observe(batch)
    expected = np.percentile(np.abs(np.concatenate(batches)), 99.9)
    # The streamed estimate interpolates inside a bin of width top/bins, so it is within one bin width
    # of the exact order statistic (plus numpy's own interpolation, far smaller).
    bin_width = observer.top / observer.counts.size
    assert abs(observer.amax() - expected) <= bin_width
    assert observer.amax() <= np.abs(np.concatenate(batches)).max()
    assert observer.top >= np.abs(np.concatenate(batches)).max()


def test_rebinning_equals_a_histogram_built_at_the_final_range() -> None:
    rng = np.random.default_rng(2)
    batches = [rng.uniform(-s, s, size=3000) for s in (0.5, 1.3, 7.0, 7.5, 40.0)]
    observer = PercentileObserver(bins=256)
    for batch in batches:
        observer.observe(batch)
    direct, _ = np.histogram(np.abs(np.concatenate(batches)), bins=256, range=(0.0, observer.top))
    # Merging 2^k bins is exact arithmetic; only values within float rounding of a bin edge may
    # land in the neighbouring bin, so allow a handful of the 15000 values to differ.
    assert observer.total == 15000
    assert np.abs(observer.counts - direct).sum() <= 10


def test_percentile_100_is_the_maximum_and_zeros_are_handled() -> None:
    observer = PercentileObserver(percentile=100.0)
    observer.observe(np.zeros(10))
    assert observer.amax() == 0.0
    observer.observe(np.array([0.5, -3.0, 1.0]))
    assert observer.amax() == 3.0
    assert observer.counts[0] >= 10  # the zeros seen before the range existed stay counted


def test_observer_state_does_not_grow_with_the_number_of_batches() -> None:
    rng = np.random.default_rng(3)
    sizes = {}
    for n_batches in (2, 200):
        observers = [PercentileObserver(), MinMaxObserver(), MinMaxObserver(axis=1)]
        for _ in range(n_batches):
            batch = rng.normal(size=(8, 4, 16)).astype(np.float32)
            for observer in observers:
                observer.observe(batch)
        sizes[n_batches] = [o.state_nbytes for o in observers]
        assert observers[0].total == n_batches * 8 * 4 * 16  # every value was counted...
    assert sizes[2] == sizes[200]  # ...yet no sample was kept
    assert sizes[200][0] <= 2048 * 8 + 64  # the histogram is the whole state


def test_non_finite_values_are_counted_not_observed() -> None:
    observer = PercentileObserver()
    observer.observe(np.array([1.0, np.inf, np.nan, -2.0]))
    assert observer.nonfinite == 2 and observer.amax() <= 2.0
    minmax = MinMaxObserver()
    minmax.observe(np.array([1.0, np.inf, -2.0]))
    assert minmax.nonfinite == 1 and minmax.bounds() == (-2.0, 1.0)


def test_symmetric_scale_is_amax_over_127() -> None:
    scale, offset = scale_offset(TensorQuantConfig(), np.asarray(-2.54), np.asarray(1.0))
    assert scale.dtype == np.float32 and scale == np.float32(2.54 / 127)
    assert offset == 0


def test_zero_range_gets_scale_one() -> None:
    tqc = TensorQuantConfig(per_channel=True, channel_axis=0)
    scale, _ = scale_offset(tqc, np.array([0.0, -1.27]), np.array([0.0, 0.5]))
    np.testing.assert_array_equal(scale, np.array([1.0, 0.01], dtype=np.float32))


def test_asymmetric_range_contains_zero() -> None:
    scale, offset = scale_offset(TensorQuantConfig(symmetric=False), np.asarray(1.0), np.asarray(3.55))
    # the range widens to [0, 3.55]: scale = 3.55 / 255, and 0 maps to code 0
    assert scale == pytest.approx(3.55 / 255, rel=1e-6) and offset == 0


def test_non_finite_range_is_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        scale_offset(TensorQuantConfig(), np.asarray(-np.inf), np.asarray(1.0))
