"""Scores over resamples of the samples they were measured on, and the paired difference of two of them.

One score over a few samples (8 to 32: a selection split, calibration samples held out of a search) hides
how much another draw of the same kind of samples would move it: two candidates that differ in the fourth
decimal of a cosine, or by 2 dB of SQNR where a few samples carry most of the noise, may well swap on the
next draw. So each candidate's outputs are kept per sample as sums (``SampleSums``, built batch by batch
with ``SumsBuilder``), from which the metric over any resample of the samples follows exactly as over all
of them (as ``quantcore.analysis.accuracy_target.measure`` computes it):

    cosine   min over float outputs o of  Σ_i xy_io / sqrt(Σ_i xx_io · Σ_i yy_io)
    sqnr     min over float outputs o of  10 · log10(Σ_i xx_io / Σ_i ee_io)      (+inf: ee = 0)
    top1     100 · (1 - mean_i agree_i)  (agreement of argmax with the FP32 model's, ``top1_drop``)

where x is FP32's output and y the candidate's, i a sample (a batch where an output has no axis of one
entry per sample). ``difference`` resamples the samples with replacement ``DRAWS`` times (seeded), the
same draws for both candidates (their errors on one sample are correlated, which pairing cancels), and
gives the 95 % percentile interval of their score difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantcore.numerics.metrics import as_array

DRAWS = 1000
SEED = 0
LEVEL = 95.0  # % interval


@dataclass(frozen=True)
class SampleSums:
    """One candidate's outputs against FP32's on some samples, per sample (see module): for
    cosine/SQNR, output name -> (n, 4) columns Σxy, Σxx, Σyy, Σee; for top-1, ``"top1"`` -> (n, 1)
    agreement (0 or 1). ``defined`` False: an output was non-finite where FP32's was not (no score)."""

    metric: str
    sums: dict[str, np.ndarray]
    defined: bool = True

    @property
    def samples(self) -> int:
        return len(next(iter(self.sums.values()))) if self.sums else 0

    def scores(self, index: np.ndarray) -> np.ndarray:
        """(...,) the metric over each resample; ``index`` (..., n) sample indices."""
        if not self.defined or not self.sums:
            return np.full(index.shape[:-1], np.nan)
        if self.metric == "top1_drop":
            return 100.0 * (1.0 - self.sums["top1"][index, 0].mean(axis=-1))
        values = []
        for columns in self.sums.values():
            xy, xx, yy, ee = (columns[index, k].sum(axis=-1) for k in range(4))
            with np.errstate(divide="ignore", invalid="ignore"):
                if self.metric == "cosine":
                    values.append(xy / np.sqrt(xx * yy))
                else:
                    values.append(np.where(ee == 0, np.inf, 10.0 * np.log10(xx / ee)))
        return np.min(values, axis=0)


@dataclass(frozen=True)
class Difference:
    """Score of a minus score of b in the objective's better direction (> 0: a is better), and its
    paired interval; ``beyond``: the interval excludes 0 on a's side."""

    value: float
    low: float
    high: float

    @property
    def beyond(self) -> bool:
        return self.low > 0

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def difference(a: SampleSums, b: SampleSums, higher_is_better: bool) -> Difference:
    """a against b on the same samples (see module). An undefined score is the worst (-inf in the better
    direction); two undefined ones, or two infinite SQNRs, differ by 0."""
    n = a.samples or b.samples
    draws = _draws(n)
    every = np.arange(n)
    sign = 1.0 if higher_is_better else -1.0

    def oriented(sums: SampleSums, index: np.ndarray) -> np.ndarray:
        scores = sign * sums.scores(index)
        return np.where(np.isnan(scores), -np.inf, scores)

    with np.errstate(invalid="ignore"):
        spread = oriented(a, draws) - oriented(b, draws)
        value = float(oriented(a, every) - oriented(b, every))
    spread = np.where(np.isnan(spread), 0.0, spread)
    low, high = np.percentile(spread, [(100 - LEVEL) / 2, (100 + LEVEL) / 2], method="nearest")
    return Difference(0.0 if math.isnan(value) else value, float(low), float(high))


def worse_end(sums: SampleSums, higher_is_better: bool) -> float:
    """The score at the worse end of its 95 % interval over resamples of the samples (``difference``'s draws):
    what another draw of the same kind of samples could read. NaN where the score is undefined."""
    scores = sums.scores(_draws(sums.samples))
    if np.isnan(scores).any():
        return math.nan
    worse = (100 - LEVEL) / 2 if higher_is_better else (100 + LEVEL) / 2
    return float(np.percentile(scores, worse, method="nearest"))


def _draws(n: int) -> np.ndarray:
    """(DRAWS, n) sample indices drawn with replacement, seeded: the same for every candidate."""
    return np.random.default_rng(SEED).integers(0, n, size=(DRAWS, n))


class SumsBuilder:
    """``SampleSums`` of cosine or SQNR, one batch at a time: ``add`` each float output of each batch, then
    ``result``."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.rows: dict[str, list[np.ndarray]] = {}  # output -> per batch (units, 4)
        self.defined = True

    def add(self, name: str, x: object, y: object, axis: int, count: int) -> None:
        """One batch of output ``name``: FP32's ``x``, the candidate's ``y``, ``count`` samples along ``axis``
        (or the batch as one unit). Outputs that are not float arrays (integers, strings, sequences) are left
        out: they derive from the float outputs the metric is measured on."""
        x, y = as_array(x), as_array(y)
        if x is None or y is None or not np.issubdtype(x.dtype, np.floating):
            return
        self.defined &= _add_sums(self.rows.setdefault(name, []), x, y, axis, count)

    def result(self) -> SampleSums:
        rows = self.rows
        if len({sum(len(part) for part in parts) for parts in rows.values()}) > 1:
            # an output without one entry per sample: every output's units become whole batches
            rows = {name: [part.sum(axis=0, keepdims=True) for part in parts] for name, parts in rows.items()}
        return SampleSums(self.metric, {name: np.concatenate(parts) for name, parts in rows.items()}, self.defined)


def _add_sums(parts: list[np.ndarray], x: np.ndarray, y: np.ndarray, axis: int, count: int) -> bool:
    """Append one batch's (units, 4) sums of a float output (FP32 ``x``, candidate ``y``; units: its ``count``
    samples along ``axis``, or the batch as one); False when ``y`` is non-finite where ``x`` is not."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    agreeing = (x == y) | (np.isnan(x) & np.isnan(y))
    x, y = np.where(finite, x, 0.0), np.where(finite, y, 0.0)  # agreeing non-finite values: out of the sums
    units = count if x.ndim > axis and x.shape[axis] == count else 1
    x, y = (np.moveaxis(v, axis, 0).reshape(units, -1) if units > 1 else v.reshape(1, -1) for v in (x, y))
    e = x - y
    parts.append(np.stack([np.einsum("ij,ij->i", p, q) for p, q in ((x, y), (x, x), (y, y), (e, e))], axis=1))
    return bool((finite | agreeing).all())
