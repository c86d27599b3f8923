"""AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration", section 3.2): scale up the weight rows that multiply large input channels before
rounding, so that those rows lose less to the block grid, and divide the input by the same factors.

A group (``quantcore.graph.channel_scaling.Group``) is the MatMul/Gemm layers that read one activation X;
they share one scale s (K,), since X ÷ s is folded once, into X's producer or an inserted Mul. With
m_j = mean |x_j| over the calibration rows, for each alpha of ``ALPHAS``:

    s = max(m, 1e-4)^alpha,   s ← s / sqrt(max(s) · min(s))     (the reference's normalisation)
    Ŵ(s) = diag(1/s) · Q(diag(s) · W)                Q: round-to-nearest, with the clip search below
    E(s) = Σ over the group's quantized layers ‖X·W - X·Ŵ(s)‖²_F / n     (from XᵀX, ``Gram``)

and the s of least E is kept. alpha = 0 is s = 1, round-to-nearest with clipping, so on the calibration
data E never exceeds round-to-nearest's. The reference measures E on the output of the whole module the group
feeds (an attention or MLP block); here it is the sum of the group's own layer outputs, which XᵀX gives
without running the model again.

Within each candidate, as the reference's second search, each block column of diag(s)·W gets a clip ratio
r from
``CLIP_RATIOS``: its range shrunk by r before its scale is taken (``quantize_rtn``'s ``clip``), r chosen to
minimise that block column's share of the output error, Δ_bᵀ·G_bb·Δ_b with G_bb the block's diagonal
part of XᵀX/n of X ÷ s (the reference measures each block's partial product alone too). The clipped weight
is kept when its whole-layer error is below the unclipped one's. The reference searches s with plain
rounding and clips after; searching s with the clip inside measured better here (on a layer with outlier
channels, s chosen without it and clipped after lost to clipping alone).

The exported model is the FP32 model with each chosen group's weights multiplied by s and X ÷ s folded
(``scale_channels``): the same function before rounding, to float32 rounding. A layer in no group (its
weight also read by another node) keeps s = 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from quantcore.graph.channel_scaling import Group
from quantcore.progress import Monitor
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gram import Gram
from quantcore.weight_only.layers import WeightLayer

STAGE = "calibrate"
ALPHAS = tuple(i / 20 for i in range(20))  # the reference's grid of 20
MEAN_FLOOR = 1e-4  # m_j below it (a channel that is almost always 0) counts as it, as in the reference
CLIP_RATIOS = tuple(1 - i / 20 for i in range(10))  # 1 down to 0.55: the reference's shrink of at most 0.5


@dataclass(frozen=True)
class ChannelScale:
    """A group's choice: alpha and s (K,) float64."""

    alpha: float
    scale: np.ndarray


def candidate_scale(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """(K,) s of one alpha (module docstring)."""
    scale = np.maximum(mean_abs, MEAN_FLOOR) ** alpha
    return scale / np.sqrt(scale.max() * scale.min())


def _scaled(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """diag(s)·W in float32, the weight that is rounded and stored."""
    return np.asarray(weight, dtype=np.float32) * scale[:, None].astype(np.float32)


def quantize_scaled(
    weight: np.ndarray, scale: np.ndarray, grid: BlockGrid, clip: np.ndarray | None = None
) -> tuple[BlockwiseWeight, np.ndarray]:
    """(Q(diag(s)·W) as stored, Ŵ = diag(1/s)·Q(diag(s)·W) (K, N) float64, the weight the layer computes
    with); ``clip``: ``quantize_rtn``'s."""
    stored = quantize_rtn(_scaled(weight, scale), grid, clip)
    return stored, stored.dequantize().astype(np.float64) / scale[:, None]


def _block_errors(delta: np.ndarray, covariance: np.ndarray, size: int) -> np.ndarray:
    """(blocks, N) Δ_bᵀ·G_bb·Δ_b of each block of rows of Δ (K, N) with the matching diagonal block of G (K, K)."""
    errors = []
    for start in range(0, delta.shape[0], size):
        part = delta[start : start + size]
        errors.append(np.sum(part * (covariance[start : start + size, start : start + size] @ part), axis=0))
    return np.stack(errors)


def clip_ratios(weight: np.ndarray, gram: Gram, grid: BlockGrid) -> np.ndarray:
    """(blocks, N) the clip ratio of each block column of ``weight`` (K, N) of least block error
    (module docstring); ``gram``: the statistics of the input ``weight`` multiplies."""
    covariance = gram.xtx / max(gram.rows, 1)
    shape = (grid.num_blocks(weight.shape[0]), weight.shape[1])
    best, chosen = np.full(shape, np.inf), np.ones(shape)
    for ratio in CLIP_RATIOS:
        delta = weight - quantize_rtn(weight, grid, np.full(shape, ratio)).dequantize().astype(np.float64)
        error = _block_errors(delta, covariance, grid.block_size)
        better = error < best
        best, chosen = np.where(better, error, best), np.where(better, ratio, chosen)
    return chosen


def quantize_layer(
    weight: np.ndarray, gram: Gram, scale: np.ndarray, grid: BlockGrid
) -> tuple[BlockwiseWeight, np.ndarray]:
    """One (K, N) layer quantized with channel scales s (K,), then the clip search; returns what
    ``quantize_scaled`` returns. ``gram``: the statistics of the layer's original input."""
    unclipped = quantize_scaled(weight, scale, grid)
    clipped = quantize_scaled(weight, scale, grid, clip_ratios(_scaled(weight, scale), gram.divided(scale), grid))
    return min((clipped, unclipped), key=lambda result: gram.output_error(weight - result[1]))


def search(
    groups: list[Group], layers: list[WeightLayer], grams: Mapping[str, Gram], grid: BlockGrid, monitor: Monitor
) -> dict[str, ChannelScale]:
    """Group input → its ``ChannelScale``, for each group with a quantized layer (module docstring)."""
    by_node = {layer.node: layer for layer in layers}
    chosen: dict[str, ChannelScale] = {}
    searched = [g for g in groups if any(n in by_node for n in g.layers)]
    for done, group in enumerate(searched, start=1):
        monitor.check(STAGE)
        members = [by_node[n] for n in group.layers if n in by_node]
        gram = grams[group.input]
        weights = [layer.read() for layer in members]  # the group's W (K, N), read once for every alpha
        errors = {}
        for alpha in ALPHAS:
            scale = candidate_scale(gram.mean_abs(), alpha)
            errors[alpha] = sum(gram.output_error(w - quantize_layer(w, gram, scale, grid)[1]) for w in weights)
        best = min(ALPHAS, key=lambda a: (errors[a], a))  # ties: the smaller alpha, nearer round-to-nearest
        chosen[group.input] = ChannelScale(best, candidate_scale(gram.mean_abs(), best))
        monitor.report(STAGE, done / (len(searched) + 1), f"awq: group {done}/{len(searched)}, alpha {best:g}")
    return chosen


def layer_scales(groups: list[Group], chosen: Mapping[str, ChannelScale]) -> dict[str, ChannelScale]:
    """Layer node → its group's ``ChannelScale`` (layers of groups not in ``chosen`` are absent)."""
    return {node: chosen[g.input] for g in groups if g.input in chosen for node in g.layers}
