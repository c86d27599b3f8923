"""bench.stats.significance: the bootstrap intervals the quality bench prints beside each SQNR."""

from __future__ import annotations

import numpy as np

from bench.stats.significance import difference_interval, sample_energies, sqnr_interval


def outputs(rng: np.random.Generator, noise: float, batches: int = 4, batch: int = 8) -> tuple[list, list]:
    reference = [rng.standard_normal((batch, 10)) for _ in range(batches)]
    return reference, [y + rng.normal(scale=noise, size=y.shape) for y in reference]


def test_energies_are_split_per_sample_where_the_first_axis_is_the_batch() -> None:
    y = [np.arange(12.0).reshape(3, 4), np.ones((5, 1, 2))]  # 3 samples; a (T, N=1, C) output: one
    y_hat = [y[0] + 1.0, y[1]]
    signal, noise = sample_energies(y, y_hat, [3, 1])
    assert signal.tolist() == [14.0, 126.0, 366.0, 10.0]  # Σ y² of rows 0-3, 4-7, 8-11; ten ones
    assert noise.tolist() == [4.0, 4.0, 4.0, 0.0]


def test_the_interval_holds_the_sqnr_and_shrinks_with_more_samples() -> None:
    rng = np.random.default_rng(0)
    few = sqnr_interval(*sample_energies(*outputs(rng, 0.01, batches=1), [8]))
    many = sqnr_interval(*sample_energies(*outputs(rng, 0.01, batches=32), [8] * 32))
    for interval in (few, many):
        assert interval.low <= interval.value <= interval.high
        assert abs(interval.value - 40.0) < 1.5  # noise 1 % of a unit signal: 40 dB, give or take the draw
    assert many.high - many.low < few.high - few.low


def test_a_fourfold_noise_is_a_difference_and_the_same_model_is_none() -> None:
    rng = np.random.default_rng(1)
    reference, quantized = outputs(rng, 0.01)
    noisier = [y + 2 * (q - y) for y, q in zip(reference, quantized, strict=True)]  # error doubled: -6.02 dB
    signal, noise = sample_energies(reference, quantized, [8] * 4)
    _, doubled = sample_energies(reference, noisier, [8] * 4)
    better = difference_interval(signal, noise, doubled)
    assert abs(better.value - 20 * np.log10(2)) < 1e-9  # paired: the same samples, exactly 6.02 dB
    assert better.verdict == "ahead"
    assert difference_interval(signal, doubled, noise).verdict == "behind"
    same = difference_interval(signal, noise, noise)
    assert (same.value, same.low, same.high, same.verdict) == (0.0, 0.0, 0.0, "within noise")
    exact = difference_interval(signal, np.zeros_like(noise), np.zeros_like(noise))  # inf - inf on every draw
    assert exact.verdict == "within noise"


def test_an_exact_method_is_infinitely_ahead_not_a_huge_number() -> None:
    rng = np.random.default_rng(2)
    reference, quantized = outputs(rng, 0.01)
    signal, noise = sample_energies(reference, quantized, [8] * 4)
    exact = difference_interval(signal, np.zeros_like(noise), noise)
    assert (exact.value, exact.low, exact.high, exact.verdict) == (np.inf, np.inf, np.inf, "ahead")
    assert str(exact) == "+inf [+inf, +inf]"
