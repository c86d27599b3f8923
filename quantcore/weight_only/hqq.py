"""HQQ (Badri & Shaji 2023, "Half-Quadratic Quantization of Large Machine Learning Models"), data-free: each
block's grid is fitted to the weights alone by alternating minimisation, starting from round-to-nearest's
(``quantcore.weight_only.blocks``).

HQQ splits the rounding error into a sparse outlier part W_e, which an l_p "norm" (p < 1) lets be large on
few weights, and the rest, which the grid must fit. Per block (rows of W along K, one column n at a time),
from RTN's scale s and zero point z, ``ITERATIONS`` times:

    q   = clip(round(w / s) + z, 0, 2^b - 1),   ŵ = (q - z)·s
    W_e = shrink_p(w - ŵ, β),  shrink_p(x, β) = sign(x)·max(|x| - |x|^(p-1) / β, 0)
    s   = Σ (w - W_e)(q - z) / Σ (q - z)²                  the least-squares scale for the codes q
    z   = clip(round(mean(q - (w - W_e) / s)), 0, 2^b - 1)   asymmetric only
    β  ← κ·β

The reference optimises a float zero point with the scale fixed; both formats here store an integer zero
point (MatMulNBits' uint4 and DequantizeLinear's), or none (symmetric: z = 2^(b-1)), so the scale is the
continuous parameter and z is rounded. Like the reference, which stops when its error stops falling, each
(block, column) keeps the iterate of least ‖w - ŵ‖² seen, round-to-nearest's included: the weight error
never exceeds RTN's. Scales are rounded to float32 before the codes are computed, as ``blocks`` stores them.
"""

from __future__ import annotations

import numpy as np

from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight

ITERATIONS = 20
NORM_P = 0.7  # the reference's l_p, p < 1: outliers cost less than in l_2
BETA, KAPPA = 10.0, 1.01  # the reference's initial β and its growth per iteration
# columns fitted together: a (8192, 128) slice's float64 temporaries are 8 MB each, about fifteen live at once
COLUMNS = 128


def _shrink(x: np.ndarray, beta: float) -> np.ndarray:
    """The proximal operator of |x|^p (generalised soft threshold), element-wise."""
    magnitude = np.abs(x)
    with np.errstate(divide="ignore"):
        threshold = np.where(magnitude > 0, magnitude ** (NORM_P - 1.0), np.inf) / beta
    return np.sign(x) * np.maximum(magnitude - threshold, 0.0)


def quantize_hqq(weight: np.ndarray, grid: BlockGrid) -> BlockwiseWeight:
    """HQQ of a (K, N) weight on ``grid`` (module docstring), ``COLUMNS`` columns at a time: every
    (block, column) is fitted on its own, and the fit's float64 temporaries (about fifteen of the slice's
    size) stay bounded whatever N is."""
    parts = [_fitted(weight[:, start : start + COLUMNS], grid) for start in range(0, weight.shape[1], COLUMNS)]
    return BlockwiseWeight(
        grid,
        np.concatenate([p.codes for p in parts], axis=1),
        np.concatenate([p.scales for p in parts], axis=1),
        np.concatenate([p.zero_points for p in parts], axis=1),
    )


def _fitted(weight: np.ndarray, grid: BlockGrid) -> BlockwiseWeight:
    """HQQ of a (K, n) slice of columns."""
    weight = np.asarray(weight, dtype=np.float64)
    k, n = weight.shape
    blocks, size = grid.num_blocks(k), grid.block_size
    w = np.zeros((blocks * size, n))
    w[:k] = weight
    w = w.reshape(blocks, size, n)  # the last block padded with zeros, masked out of every sum
    mask = (np.arange(blocks * size) < k).reshape(blocks, size, 1)
    rows = mask.sum(axis=1)  # (blocks, 1) rows per block

    params = [grid.params(weight[b * size : (b + 1) * size]) for b in range(blocks)]
    scale = np.stack([p[0] for p in params]).astype(np.float64)  # (blocks, N)
    zero = np.stack([p[1] for p in params])

    def fit(scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes, ŵ, ‖w - ŵ‖² per (block, column)) of one grid."""
        codes = np.clip(np.round(w / scale[:, None]) + zero[:, None], 0, grid.quant_max)
        rounded = (codes - zero[:, None]) * scale[:, None]
        return codes, rounded, np.sum(mask * (w - rounded) ** 2, axis=1)

    codes, rounded, best = fit(scale, zero)
    kept_scale, kept_zero = scale.copy(), zero.copy()
    beta = BETA
    for _ in range(ITERATIONS):
        target = w - _shrink(w - rounded, beta)
        steps = mask * (codes - zero[:, None])  # (blocks, size, N) q - z
        power = np.sum(steps**2, axis=1)
        fitted = np.sum(target * steps, axis=1) / np.where(power > 0, power, 1.0)
        scale = np.where((power > 0) & (fitted * scale > 0), fitted, scale).astype(np.float32).astype(np.float64)
        if not grid.symmetric:
            offset = np.sum(mask * (codes - target / scale[:, None]), axis=1) / rows
            zero = np.clip(np.round(offset), 0, grid.quant_max)
        codes, rounded, error = fit(scale, zero)
        better = error < best
        kept_scale, kept_zero, best = (
            np.where(better, scale, kept_scale),
            np.where(better, zero, kept_zero),
            np.minimum(error, best),
        )
        beta *= KAPPA
    codes = np.clip(np.round(w / kept_scale[:, None]) + kept_zero[:, None], 0, grid.quant_max)
    return BlockwiseWeight(
        grid,
        codes.reshape(blocks * size, n)[:k].astype(np.uint8),
        kept_scale.astype(np.float32),
        kept_zero.astype(np.uint8),
    )
