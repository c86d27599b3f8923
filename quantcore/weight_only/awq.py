"""AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration", section 3.2): scale up the weight rows that multiply large input channels before
rounding, so that those rows lose less to the block grid, and divide the input by the same factors.

A group (``quantcore.graph.channel_scaling.Group``) is the MatMul/Gemm layers that read one activation X;
they share one scale s (K,), since X ÷ s is folded once, into X's producer or an inserted Mul. With
m_j = mean |x_j| over the calibration rows, each alpha of ``ALPHAS`` gives a candidate

    s = max(m, 1e-4)^alpha,   s ← s / sqrt(max(s) · min(s))     (the reference's normalisation)
    Ŵ(s) = diag(1/s) · Q(diag(s) · W)                Q: round-to-nearest, with or without the clip search
    E(s) = Σ over the group's quantized layers ‖X·W - X·Ŵ(s)‖²_F / n     (from XᵀX, ``Gram``)

The reference measures E on the output of the whole module the group feeds (an attention or MLP block);
here it is the sum of the group's own layer outputs, which XᵀX gives without running the model again.

The clip search: each block column of diag(s)·W gets a clip ratio r from ``CLIP_RATIOS``, its range
shrunk by r before its scale is taken (``quantize_rtn``'s ``clip``), r chosen to minimise that block
column's share of the output error, Δ_bᵀ·G_bb·Δ_b with G_bb the block's diagonal part of XᵀX/n of X ÷ s
(the reference measures each block's partial product alone too); the clipped weight is kept when its
whole-layer error is below the unclipped one's.

The search over s runs in two stages, as the reference's (which searches s with plain rounding, then the
clip for that s): every alpha is ranked by E with plain round-to-nearest, then the ``FINALISTS`` alphas
of least such E (the best one), and alpha 0 (s = 1), are ranked again by E with the clip search, and the
least wins: 20 plain E and at most 2 clip searches (2 E each) per layer instead of 20 of both. The clip
search is the costly part (ten roundings of the weight and a block-diagonal product each: 6.7 times one E
on a (2048, 8192) layer, 1.4 times on a (8192, 2048) one). Alpha 0 among the finalists keeps E at most
clipping alone's on the calibration data, and so at most round-to-nearest's, as the exhaustive search had
it. Measured against the exhaustive search (every alpha clip-searched), w4 at blocks 32 and 128: held-out
logits SQNR -0.1 to +0.3 dB on the bench's text decoder, -0.2 to +0.4 dB on its Markov decoder and -0.7
to +0.1 dB on the tests' outlier MLP and MatMul chains; calibration E, summed over the groups, 0.1-1.6 %
higher on the decoders and the MLP, up to 13 % on the chains, where the first layer's E depends on the
second group's s.

A layer whose output is the input of a later group that folds its ÷ s' into this layer's weight (a
MatMul feeding a MatMul directly, or through a constant bias Add) stores Q(diag(s)·W·diag(1/s')): its
error is measured on what it computes in the unscaled graph, diag(1/s)·Q(…)·diag(s'), and the later
group is searched first (``quantcore.weight_only.awq_plan`` searches a segment's groups downstream first).

The exported model is the FP32 model with each chosen group's weights multiplied by s and X ÷ s folded
(``scale_channels``): the same function before rounding, to float32 rounding. A layer in no group (its
weight also read by another node) keeps s = 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gram import Gram

ALPHAS = tuple(i / 20 for i in range(20))  # the reference's grid of 20
FINALISTS = 1  # alphas of least plain round-to-nearest E that get the clip search (module docstring)
MEAN_FLOOR = 1e-4  # m_j below it (a channel that is almost always 0) counts as it, as in the reference
CLIP_RATIOS = np.array([1 - i / 20 for i in range(10)])  # 1 down to 0.55: the reference's shrink of at most 0.5
CLIP_ELEMENTS = 1 << 20  # weight elements the clip search takes at once: 8 MB float64 temporaries, not (K, N)


@dataclass(frozen=True)
class ChannelScale:
    """A group's choice: alpha and s (K,) float64."""

    alpha: float
    scale: np.ndarray


@dataclass(frozen=True)
class LayerChoice:
    """What one layer's codes are made of: its group's s (None: s = 1), the s' of the later group that
    folds ÷ s' into its output columns (None: none) and the clip ratio of each block column, as indices
    into ``CLIP_RATIOS`` (blocks, N) uint8 (None: unclipped). ``quantize_chosen`` remakes the codes from
    it and the weight alone."""

    scale: ChannelScale | None
    out_scale: np.ndarray | None
    clip: np.ndarray | None


def candidate_scale(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """(K,) s of one alpha (module docstring)."""
    scale = np.maximum(mean_abs, MEAN_FLOOR) ** alpha
    return scale / np.sqrt(scale.max() * scale.min())


def _stored(weight: np.ndarray, scale: np.ndarray, out_scale: np.ndarray | None) -> np.ndarray:
    """diag(s)·W·diag(1/s') in float32, the weight that is rounded and stored."""
    scaled = np.asarray(weight, dtype=np.float32) * scale[:, None].astype(np.float32)
    return scaled if out_scale is None else scaled / out_scale[None, :].astype(np.float32)


def _computed(stored: BlockwiseWeight, scale: np.ndarray, out_scale: np.ndarray | None) -> np.ndarray:
    """diag(1/s)·Q(…)·diag(s') (K, N) float64: what the layer computes with in the unscaled graph."""
    computed = stored.dequantize().astype(np.float64)
    computed /= scale[:, None]  # in place: one (K, N) float64 array
    if out_scale is not None:
        computed *= out_scale[None, :]
    return computed


def _dequantized(blocks: np.ndarray, ratio: float, grid: BlockGrid) -> np.ndarray:
    """ŵ (float32) of (B, rows, N) blocks, each rounded with its range shrunk by ``ratio``:
    ``quantize_rtn``'s steps for each block, with its float32 scales and codes."""
    count, rows, columns = blocks.shape
    side = blocks.transpose(1, 0, 2).reshape(rows, count * columns)  # every block column side by side
    scale, zero = grid.params(side.astype(np.float64) * ratio)
    dequantized = (grid.codes(side, scale, zero).astype(np.float32) - zero.astype(np.float32)) * scale
    return dequantized.reshape(rows, count, columns).transpose(1, 0, 2)


def _runs(k: int, size: int, columns: int) -> Iterator[tuple[list[int], int]]:
    """(first rows, rows) of runs of whole blocks of ``size`` rows out of k, as many as hold
    ``CLIP_ELEMENTS`` of a weight of ``columns`` columns (one at least), then of the last, shorter block
    alone when size does not divide k."""
    whole = list(range(0, k - k % size, size))
    count = max(1, CLIP_ELEMENTS // (size * columns))
    for first in range(0, len(whole), count):
        yield whole[first : first + count], size
    if k % size:
        yield [k - k % size], k % size


def clip_ratios(weight: np.ndarray, gram: Gram, scale: np.ndarray, grid: BlockGrid) -> np.ndarray:
    """(blocks, N) uint8: for each block column of ``weight`` (K, N float32, already diag(s)·W), the index
    in ``CLIP_RATIOS`` of least block error Δ_bᵀ·G_bb·Δ_b (module docstring), G_bb the diagonal block of
    diag(1/s)·XᵀX·diag(1/s) / n; ``gram``: the statistics of the input before ÷ s. A run of blocks at a
    time (``_runs``): no (K, K) or (K, N) temporary."""
    inverse, count = 1.0 / scale, max(gram.rows, 1)
    chosen = []
    for starts, rows in _runs(weight.shape[0], grid.block_size, weight.shape[1]):
        blocks = np.stack([weight[s : s + rows] for s in starts])  # (B, rows, N)
        parts = [slice(s, s + rows) for s in starts]
        covariance = np.stack([gram.xtx[p, p] * np.outer(inverse[p], inverse[p]) for p in parts]) / count
        errors = []
        for ratio in CLIP_RATIOS:
            delta = blocks - _dequantized(blocks, ratio, grid).astype(np.float64)
            errors.append(np.sum(delta * (covariance @ delta), axis=1))  # (B, N)
        chosen.append(np.argmin(np.stack(errors), axis=0))  # ties: the first, the least clipped
    return np.concatenate(chosen).astype(np.uint8)


def quantize_chosen(weight: np.ndarray, choice: LayerChoice, grid: BlockGrid) -> tuple[BlockwiseWeight, np.ndarray]:
    """(the stored codes, the weight the layer computes with in the unscaled graph (K, N) float64) of
    ``weight`` (K, N) as ``choice`` says."""
    scale = np.ones(weight.shape[0]) if choice.scale is None else choice.scale.scale
    clip = None if choice.clip is None else CLIP_RATIOS[choice.clip]
    stored = quantize_rtn(_stored(weight, scale, choice.out_scale), grid, clip)
    return stored, _computed(stored, scale, choice.out_scale)


def quantize_layer(
    weight: np.ndarray, gram: Gram, scale: ChannelScale | None, out_scale: np.ndarray | None, grid: BlockGrid
) -> tuple[LayerChoice, BlockwiseWeight, np.ndarray, float]:
    """One (K, N) layer quantized with its group's s, then the clip search; returns the choice, what
    ``quantize_chosen`` returns for it and its output error ‖X·W - X·Ŵ‖²_F / n. ``gram``: the statistics
    of the layer's original input."""
    s = np.ones(weight.shape[0]) if scale is None else scale.scale
    best = None
    for clip in (clip_ratios(_stored(weight, s, out_scale), gram, s, grid), None):
        choice = LayerChoice(scale, out_scale, clip)
        stored, computed = quantize_chosen(weight, choice, grid)
        error = gram.output_error(weight, minus=computed)
        if best is None or error < best[3]:  # ties: the clipped weight, tried first
            best = (choice, stored, computed, error)
    assert best is not None
    return best


def _plain_error(
    weights: Sequence[tuple[np.ndarray, np.ndarray | None]], gram: Gram, scale: ChannelScale, grid: BlockGrid
) -> float:
    """E of one s with round-to-nearest alone (no clip search): the first stage's ranking. One member's
    codes at a time."""
    return sum(gram.output_error(w, minus=quantize_chosen(w, LayerChoice(scale, o, None), grid)[1]) for w, o in weights)


def _joint(
    weights: Sequence[tuple[np.ndarray, np.ndarray | None]], gram: Gram, scale: ChannelScale, grid: BlockGrid
) -> list[tuple[LayerChoice, float]]:
    """Each member's choice and error with ``scale`` and its clip search (``quantize_layer``), holding no
    member's codes beyond its own turn."""
    return [(choice, error) for choice, _, _, error in (quantize_layer(w, gram, scale, o, grid) for w, o in weights)]


def search(
    weights: Sequence[tuple[np.ndarray, np.ndarray | None]], gram: Gram, grid: BlockGrid
) -> tuple[ChannelScale, list[tuple[LayerChoice, float]]]:
    """A group's s (module docstring: the ``FINALISTS`` alphas of least round-to-nearest E and alpha 0,
    ranked again with the clip search) and, for each of ``weights``, its ``LayerChoice`` and output error
    with it. ``weights``: each quantized member's W (K, N) and the s' folded into its output columns (or
    None); ``gram``: the statistics of the group's input."""
    mean_abs = gram.mean_abs()
    candidates = {alpha: ChannelScale(alpha, candidate_scale(mean_abs, alpha)) for alpha in ALPHAS}
    plain = {alpha: _plain_error(weights, gram, scale, grid) for alpha, scale in candidates.items()}
    finalists = sorted(ALPHAS, key=lambda a: (plain[a], a))[:FINALISTS]
    best = None
    for alpha in sorted({*finalists, 0.0}):
        scale = candidates[alpha]
        members = _joint(weights, gram, scale, grid)
        error = sum(e for _, e in members)
        if best is None or error < best[0]:  # ties: the smaller alpha (taken first), nearer round-to-nearest
            best = (error, scale, members)
    assert best is not None
    return best[1], best[2]
