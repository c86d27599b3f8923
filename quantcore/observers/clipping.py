"""Clip-threshold searches over a streamed |x| histogram: ``kl``, ``mse`` and ``floating`` observers.

Each reads the target grid from its ``tqc`` (bits, symmetric, linear or FP8, rounding) and picks the
threshold T that minimises a loss:

``kl`` (TensorRT entropy calibration, Migacz 2017): over candidate bin edges T_i = i · w (w = bin
width; at most ``MAX_CANDIDATES`` of them, up to the bin holding max|x|), for each i >= n (n = number
of grid levels on one side: quant_max + 1 = 128 for int8 symmetric; all levels for an asymmetric grid
on one-sided data), the reference P = counts[:i] with every count beyond bin i folded into bin i-1
(the clipped outliers; the zero bin's spike replaced by its neighbour's count), and Q = counts[:i]
merged into n equal groups and spread back uniformly over
each group's non-empty bins. T = i · w for the i minimising KL(P ‖ Q) = Σ p log(p / q) over p > 0 (q floored at 1e-12).
With n >= bins there is nothing to search (16-bit grids): T = max|x|.

``mse`` (``mse_amax``, which also reads a percentile's tail-resolved histogram): among thresholds
spread over [max|x|/64, max|x|] (refined around the best), the expected
squared error of quantizing the data on the grid of the range [-T, T] (asymmetric:
[max(min x, -T), min(max x, T)]), evaluated on the histogram, each bin's count at its centre c::

    E(T) = Σ_j counts_j · (c_j - x̂_T(c_j))² / Σ_j counts_j

where x̂_T is the engine's own fake-quant kernel with the scale ``scale_offset`` gives for that range
(power-of-two and rounding included). The error inside a bin is ignored, which is exact enough when a
bin (top/2048) is finer than a grid step; for a mixed-sign tensor on an asymmetric grid the negative
side is scored as its mirror image (an approximation). ``floating``: the same search with the FP8
kernel (E4M3FN unless the tqc says E5M2), scale = T / quant_max.

Ties go to the larger threshold (less clipping).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from quantcore.numerics.floating import fake_quantize_float
from quantcore.numerics.linear import fake_quantize
from quantcore.numerics.policy import QuantPolicy
from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.observers.histogram import HistogramObserver
from quantcore.runtime.threads import torch_threads

MAX_CANDIDATES = 256  # KL thresholds scored per search; bounds the search's time


def _candidate_bins(start: int, stop: int) -> np.ndarray:
    """Bin counts i in [start, stop], at most MAX_CANDIDATES of them, always including stop."""
    start = max(1, min(start, stop))
    stride = max(1, math.ceil((stop - start + 1) / MAX_CANDIDATES))
    return np.unique(np.append(np.arange(start, stop + 1, stride), stop))


def _pick(losses: np.ndarray, thresholds: np.ndarray) -> float:
    """The largest threshold among those with the minimal loss."""
    best = np.flatnonzero(losses <= losses.min())
    return float(thresholds[best[-1]])


class KLObserver(HistogramObserver):
    """TensorRT-style entropy calibration (see module)."""

    def levels(self) -> int:
        tqc = self.tqc
        if tqc.symmetric:
            return int(tqc.quant_max) + 1
        levels = int(tqc.quant_max - tqc.quant_min) + 1
        return levels if self.lo_seen >= 0 else levels // 2

    def amax(self) -> float:
        used = self.used_bins()
        levels = self.levels()
        if self.total == 0 or used == 0:
            return 0.0
        if levels >= used:
            return self.abs_max
        counts = self.counts.astype(np.float64)
        if len(counts) > 1:
            # The bin at zero holds every exact zero (a ReLU output is mostly zeros); left as is, that
            # spike dominates P and the search clips the real range away. Like TensorRT's entropy
            # calibrator, give it its neighbour's count instead.
            counts[0] = counts[1]
        candidates = _candidate_bins(levels, used)
        losses = np.array([self._divergence(counts, int(i), levels) for i in candidates])
        return min(self.abs_max, _pick(losses, candidates) * self.bin_width)

    @staticmethod
    def _divergence(counts: np.ndarray, i: int, levels: int) -> float:
        p = counts[:i].copy()
        p[i - 1] += counts[i:].sum()  # outliers clipped into the last bin
        kept = counts[:i]
        group = (np.arange(i) * levels) // i  # (i,) which of the `levels` groups each bin joins
        group_sum = np.bincount(group, weights=kept, minlength=levels)
        group_nonzero = np.bincount(group, weights=(kept > 0).astype(np.float64), minlength=levels)
        q = np.where(kept > 0, group_sum[group] / np.maximum(group_nonzero[group], 1.0), 0.0)
        p_sum, q_sum = p.sum(), q.sum()
        if p_sum == 0 or q_sum == 0:
            return math.inf
        p, q = p / p_sum, q / q_sum
        mask = p > 0
        return float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))


# The MSE search: COARSE thresholds evenly spaced from max|x| / 64 (or the histogram's floor) to max|x|,
# then FINE thresholds between the best one's neighbours.
FIRST_CANDIDATE_FRACTION = 1 / 64
COARSE = 64
FINE = 32
# torch threads a search's kernels run on. Its tensors are small (COARSE x 2048 values at most): on this
# 2-core machine, every search of a model on two threads took about twice the CPU time for at most 14 %
# less wall time (ocr-det 122 against 60 CPU ms, 62 against 60 wall ms; ocr-cls 78 / 44 CPU, 38 / 44
# wall), and with another process busy on a core, more of both (ocr-cls 118 / 42 CPU, 78 / 42 wall ms):
# measured by ``bench.observer_kernels``.
SEARCH_THREADS = 1


def mse_amax(histogram: HistogramObserver) -> float:
    """The threshold minimising ``histogram``'s expected quantization MSE on its tqc's grid (see module).

    Only occupied bins are scored, so a sparse histogram (a weight channel of a few hundred values) costs
    little. A histogram with a floor (a percentile's, ``quantcore.observers.histogram``) is scored on its estimated
    counts (``estimated_counts``: the tail exact, the bins below the floor as its floor sample was spread)
    and over thresholds from the floor up: a threshold lower than that would clip values it cannot see.
    """
    abs_max = histogram.abs_max
    if histogram.total == 0 or abs_max == 0.0:
        return 0.0
    counts = histogram.estimated_counts()
    occupied = np.flatnonzero(counts)
    centers = np.minimum(histogram.centers()[occupied], abs_max)  # (n,) the last bin's centre may pass max|x|
    weights = counts[occupied]
    lowest = min(max(abs_max * FIRST_CANDIDATE_FRACTION, histogram.floor * histogram.bin_width), abs_max)
    coarse = np.linspace(lowest, abs_max, COARSE)
    with torch_threads(SEARCH_THREADS):
        losses = _mse_losses(histogram, coarse, centers, weights)
        best = int(np.flatnonzero(losses <= losses.min())[-1])
        fine = np.linspace(coarse[max(best - 1, 0)], coarse[min(best + 1, len(coarse) - 1)], FINE)
        fine_losses = _mse_losses(histogram, fine, centers, weights)
    return _pick(np.concatenate([losses, fine_losses]), np.concatenate([coarse, fine]))


def _mse_losses(
    histogram: HistogramObserver, thresholds: np.ndarray, centers: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """(K,) expected squared error for each threshold, on the occupied bins' centres."""
    tqc = histogram.tqc
    if tqc.symmetric:
        lo, hi = -thresholds, thresholds
    else:
        lo = np.maximum(histogram.lo_seen, -thresholds)
        hi = np.minimum(histogram.hi_seen, thresholds)
    scale, offset = scale_offset(tqc, lo, hi)  # (K,) each, power-of-two applied when the policy says so
    rows = torch.from_numpy(centers).expand(len(thresholds), -1)  # (K, n), one candidate grid per row
    s = torch.from_numpy(scale.astype(np.float64))
    with torch.no_grad():
        if tqc.floating:
            x_hat = fake_quantize_float(rows, s, tqc.float_format, 0, quant_max=tqc.quant_max, rounding=tqc.rounding)
        else:
            o = torch.from_numpy(offset.astype(np.float64))
            x_hat = fake_quantize(rows, s, o, tqc.quant_min, tqc.quant_max, 0, rounding=tqc.rounding)
    w = torch.from_numpy(weights)
    return (((rows - x_hat) ** 2 * w).sum(dim=1) / w.sum()).numpy()


class MSEObserver(HistogramObserver):
    """Threshold minimising the histogram's expected quantization MSE on the tqc's grid (``mse_amax``)."""

    def amax(self) -> float:
        return mse_amax(self)


FP8_POLICY = QuantPolicy.PER_TENSOR | QuantPolicy.FLOATING | QuantPolicy.SYMMETRIC


class FloatingObserver(MSEObserver):
    """FP8 scale search: the MSE search on the tqc's FP8 grid (E4M3FN when the tqc is linear or None)."""

    def __init__(self, *, bins: int = 2048, tqc: TensorQuantConfig | None = None) -> None:
        if tqc is None or not tqc.floating:
            tqc = TensorQuantConfig(policy=FP8_POLICY)
        super().__init__(bins=bins, tqc=tqc)
