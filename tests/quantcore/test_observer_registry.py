"""The observer registry: every observer, streamed and with bounded memory."""

from __future__ import annotations

import tracemalloc
from typing import get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.numerics.policy import QuantPolicy, make_policy
from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.tqc import ObserverName, QuantState, TensorQuantConfig
from quantcore.observers.registry import (
    OBSERVERS,
    EMAMinMaxObserver,
    ObserverSettings,
    make_observer,
)
from tests.quantcore.observer_cases import heavy_tailed, true_mse

FP8 = make_policy(floating=True)


def test_registry_names_and_signature() -> None:
    assert set(OBSERVERS) == {"minmax", "ema_minmax", "percentile", "kl", "mse", "floating", "constant"}
    for name in OBSERVERS:
        tqc = TensorQuantConfig(observer=name, constant_range=(-1.0, 1.0) if name == "constant" else None)
        observer = OBSERVERS[name](ObserverSettings(percentile=99.9, tqc=tqc))
        observer.observe(np.linspace(-2, 2, 101, dtype=np.float32))
        lo, hi = observer.bounds()
        assert -2.0 <= lo <= 0.0 <= hi <= 2.0, name


def test_every_registered_observer_is_a_name_a_tqc_accepts() -> None:
    """TensorQuantConfig checks ``observer`` against the ``ObserverName`` Literal, not the registry (the
    registry builds on TQCs): an observer registered without being named there fails here."""
    assert set(get_args(ObserverName)) == set(OBSERVERS)


def test_ema_minmax_follows_the_moving_average() -> None:
    observer = EMAMinMaxObserver(momentum=0.75)
    for lo, hi in [(-1.0, 1.0), (-3.0, 5.0)]:
        observer.observe(np.array([lo, hi]))
    lo, hi = observer.bounds()
    assert (lo, hi) == (0.75 * -1 + 0.25 * -3, 0.75 * 1 + 0.25 * 5)  # exact in binary fractions
    per_channel = OBSERVERS["ema_minmax"](ObserverSettings(axis=0, momentum=0.5))
    per_channel.observe(np.array([[1.0, 2.0], [-4.0, 0.0]]))
    per_channel.observe(np.array([[3.0, 4.0], [-2.0, 0.0]]))
    np.testing.assert_array_equal(per_channel.bounds()[0], [2.0, -3.0])  # channel mins (1, 3) and (-4, -2)


def test_constant_observer_reports_the_configured_range() -> None:
    tqc = TensorQuantConfig(observer="constant", constant_range=(-0.5, 6.0), per_channel=True, channel_axis=0)
    observer = make_observer(tqc)
    observer.observe(np.full((3, 4), 100.0))
    lo, hi = observer.bounds()
    np.testing.assert_array_equal(lo, [-0.5] * 3)
    np.testing.assert_array_equal(hi, [6.0] * 3)


@pytest.mark.parametrize(
    "tqc",
    [
        TensorQuantConfig(num_bits=4, observer="mse"),
        TensorQuantConfig(num_bits=8, observer="mse"),
        TensorQuantConfig(policy=FP8, observer="floating"),
    ],
    ids=["int4", "int8", "fp8"],
)
def test_mse_search_finds_a_threshold_as_good_as_brute_force_on_the_samples(tqc: TensorQuantConfig) -> None:
    rng = np.random.default_rng(7)
    batches = [heavy_tailed(rng, 20_000) for _ in range(5)]
    observer = make_observer(tqc)
    for batch in batches:
        observer.observe(batch)
    chosen = float(observer.bounds()[1])
    data = np.concatenate(batches)
    abs_max = float(np.abs(data).max())
    grid = np.geomspace(abs_max / 256, abs_max, 200)
    best = min(true_mse(data, tqc, float(t)) for t in grid)
    # The search scores bin centres of a 2048-bin histogram instead of the samples, and its candidate
    # thresholds are bin edges: allow 10% above the brute-force optimum over 200 thresholds.
    assert true_mse(data, tqc, chosen) <= 1.10 * best
    assert chosen < abs_max or tqc.floating  # the outliers are clipped for integer grids


def test_kl_clips_heavy_tails_and_keeps_uniform_ranges() -> None:
    rng = np.random.default_rng(8)
    tailed = make_observer(TensorQuantConfig(observer="kl"))
    uniform = make_observer(TensorQuantConfig(observer="kl"))
    for _ in range(4):
        tailed.observe(heavy_tailed(rng, 50_000))
        uniform.observe(rng.uniform(-3, 3, size=50_000).astype(np.float32))
    # Gaussian bulk of std 1: TensorRT's entropy threshold for int8 lands a few std out, far below the
    # outliers (max ≈ 150), and a uniform distribution is kept (almost) whole.
    assert 2.0 < float(tailed.bounds()[1]) < 20.0 < tailed.abs_max
    assert float(uniform.bounds()[1]) > 0.9 * uniform.abs_max


def test_kl_is_not_captured_by_the_zero_spike_of_a_relu_output() -> None:
    """Half the values of a ReLU output are exactly 0. Without discounting that spike the search
    clipped at 2.17 sigma here (and cost 27 dB of SQNR on the digits CNN); TensorRT's entropy
    calibrator gives the zero bin its neighbour's count, which keeps 3.9 sigma."""
    rng = np.random.default_rng(0)
    observer = OBSERVERS["kl"](ObserverSettings(tqc=TensorQuantConfig(observer="kl")))
    for _ in range(10):
        observer.observe(np.maximum(rng.normal(size=10_000), 0).astype(np.float32))
    lo, hi = observer.bounds()
    # max of 50k half-normal samples is ~4.3 sigma; clipping the top 0.01 % (3.7 sigma) is what KL may do
    assert 3.5 <= float(hi) <= 4.5 and float(lo) == -float(hi)


def test_kl_on_a_16_bit_grid_has_nothing_to_clip() -> None:
    observer = make_observer(TensorQuantConfig(num_bits=16, observer="kl"))
    observer.observe(np.array([0.1, -7.0, 3.0]))
    assert float(observer.bounds()[1]) == 7.0


def test_histogram_observers_give_one_sided_ranges_to_asymmetric_grids() -> None:
    relu = np.abs(np.random.default_rng(9).normal(size=10_000)).astype(np.float32)
    for name in ("percentile", "kl", "mse"):
        observer = make_observer(TensorQuantConfig(symmetric=False, observer=name))
        observer.observe(relu)
        lo, hi = observer.bounds()
        assert lo == relu.min() and 0 < hi <= relu.max(), name


def test_per_channel_histogram_observers() -> None:
    rng = np.random.default_rng(10)
    w = rng.normal(size=(4, 8, 3, 3)).astype(np.float32) * np.array([1, 2, 4, 8], dtype=np.float32)[:, None, None, None]
    tqc = TensorQuantConfig(per_channel=True, channel_axis=0, observer="mse")
    observer = make_observer(tqc)
    observer.observe(w)
    lo, hi = observer.bounds()
    assert hi.shape == (4,) and np.all(np.diff(hi) > 0)  # ranges follow each channel's spread
    scale, _ = scale_offset(tqc, lo, hi)
    assert tqc.with_scale(scale).state is QuantState.ACTIVATED


@pytest.mark.parametrize("name", ["minmax", "ema_minmax", "percentile", "kl", "mse", "floating"])
def test_peak_memory_does_not_grow_with_the_number_of_batches(name: str) -> None:
    tqc = TensorQuantConfig(policy=FP8 if name == "floating" else make_policy(), observer=name)

    def peak(n_batches: int) -> int:
        rng = np.random.default_rng(11)
        observer = make_observer(tqc)
        tracemalloc.start()
        try:
            for _ in range(n_batches):
                observer.observe(rng.normal(size=(16, 1024)).astype(np.float32))  # 64 KiB a batch
            observer.bounds()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    few, many = peak(10), peak(100)
    # Ten times the batches, the same peak: one batch and its temporaries plus the fixed state (the
    # 2048-bin histogram; the threshold search's (512, 2048) float64 candidate grid is freed after
    # use). 64 KiB of slack for allocator and interpreter noise, well below one extra batch per step.
    assert many <= few + 64 * 1024, (few, many)


def test_floating_observer_defaults_to_e4m3_on_a_linear_config() -> None:
    observer = OBSERVERS["floating"](ObserverSettings(tqc=TensorQuantConfig()))
    assert observer.tqc.policy & QuantPolicy.FLOATING and observer.tqc.quant_max == 448.0


@settings(max_examples=60, deadline=None)
@given(
    scales=st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=6),
    name=st.sampled_from(["percentile", "kl", "mse"]),
)
def test_histogram_observers_count_everything_and_stay_within_the_data(scales: list[float], name: str) -> None:
    rng = np.random.default_rng(12)
    observer = make_observer(TensorQuantConfig(observer=name))
    seen = []
    for s in scales:  # ranges that grow and shrink: re-binning by powers of two
        batch = rng.normal(scale=s, size=500).astype(np.float32)
        observer.observe(batch)
        seen.append(batch)
    data = np.abs(np.concatenate(seen))
    assert observer.total == data.size  # re-binning never loses a count
    assert observer.top >= data.max()
    lo, hi = observer.bounds()
    assert 0.0 < float(hi) <= data.max() and float(lo) == -float(hi)


