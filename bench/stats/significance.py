"""How far a held-out SQNR can be trusted: bootstrap intervals over the held-out samples.

The bench's SQNR of a method is 10·log10(Σ y² / Σ (y - ŷ)²) over every held-out sample's first output. With
8 held-out samples (the test zoo's) or a score near zero on most samples (a wake-word classifier on speech
that is not its word), a few samples decide it, and a difference of some tenths of a dB between two
methods may say nothing. Each sample's signal energy s_i = Σ y² and noise energy n_i = Σ (y - ŷ)² are
kept; resampling the samples with replacement (``DRAWS`` times, seeded) gives the spread of the SQNR, and
resampling them *paired* (the same draw for both methods: their errors on one sample are correlated)
gives that of the difference between two methods. The intervals are the draws' 2.5th and 97.5th
percentiles (95 %, percentile bootstrap; the nearest draws, so that a draw of exact samples, +inf dB,
is a bound rather than an interpolation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DRAWS = 2000
SEED = 0


def sample_energies(
    reference: list[np.ndarray], quantized: list[np.ndarray], samples: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(signal, noise), one entry per held-out sample: Σ y² and Σ (y - ŷ)² of its first output.

    ``reference`` and ``quantized`` hold one array per batch; ``samples`` the number of samples in each batch.
    A batch's output is split on its first axis when that axis has one entry per sample; otherwise (an
    output that is not batched on its first axis, such as a recurrent model's (T, N, C) logits at N = 1)
    the batch counts as one sample."""
    signal, noise = [], []
    for y, y_hat, n in zip(reference, quantized, samples, strict=True):
        y, y_hat = np.asarray(y, np.float64), np.asarray(y_hat, np.float64)
        units = n if y.ndim >= 1 and y.shape[0] == n else 1
        y, error = y.reshape(units, -1), (y - y_hat).reshape(units, -1)
        signal.append((y**2).sum(axis=1))
        noise.append((error**2).sum(axis=1))
    return np.concatenate(signal), np.concatenate(noise)


def _draws(count: int) -> np.ndarray:
    """(DRAWS, count) sample indices, the same for every call with the same count."""
    return np.random.default_rng(SEED).integers(0, count, size=(DRAWS, count))


def _sqnr(signal: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """dB along the last axis; +inf where the noise is zero."""
    with np.errstate(divide="ignore"):
        return 10 * np.log10(signal.sum(axis=-1) / noise.sum(axis=-1))


@dataclass(frozen=True)
class Interval:
    """A value and its 95 % bootstrap interval (dB)."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:+.1f} [{self.low:+.1f}, {self.high:+.1f}]"

    @property
    def verdict(self) -> str:
        """For a difference a - b: "ahead" or "behind" when the interval excludes 0, else "within noise"."""
        if self.low > 0:
            return "ahead"
        if self.high < 0:
            return "behind"
        return "within noise"


def sqnr_interval(signal: np.ndarray, noise: np.ndarray) -> Interval:
    index = _draws(len(signal))
    draws = _sqnr(signal[index], noise[index])
    low, high = np.percentile(draws, [2.5, 97.5], method="nearest")
    return Interval(float(_sqnr(signal, noise)), float(low), float(high))


def difference_interval(signal: np.ndarray, noise_a: np.ndarray, noise_b: np.ndarray) -> Interval:
    """SQNR of a minus SQNR of b (dB), both measured against the same reference on the same samples."""
    index = _draws(len(signal))
    with np.errstate(invalid="ignore"):  # inf - inf: both exact on a draw, no difference (0 dB)
        draws = _sqnr(signal[index], noise_a[index]) - _sqnr(signal[index], noise_b[index])
        value = float(_sqnr(signal, noise_a) - _sqnr(signal, noise_b))
    draws[np.isnan(draws)] = 0.0
    value = 0.0 if np.isnan(value) else value
    low, high = np.percentile(draws, [2.5, 97.5], method="nearest")
    return Interval(value, float(low), float(high))
