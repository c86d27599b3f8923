"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"), one layer at a time, on the grid of ``quantcore.weight_only.blocks``.

A layer computes Y = X·W, X (n, K) its input rows on the calibration data, W (K, N). GPTQ minimises
‖XW - XŴ‖²_F row of W by row of W (K index, the reference's "columns" of W^T), with

    H = 2·XᵀX / n + λ·I,      λ = damping · mean(diag(2·XᵀX / n))

and U the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU). Visiting k = 0..K-1: ŵ_k = Q(w_k), e = (w_k - ŵ_k) / U_kk,
and the rows still to come take the error: w_j -= U_kj · e for j > k. The update is applied lazily: within
a batch of ``LAZY_ROWS`` rows at once, to the rows after the batch by one matrix product (the reference's
"lazy batch"). Block scales are computed as each block's first row is reached, from the rows as updated
so far (the reference's ``find_params`` at ``i % groupsize == 0``; here from the batch's updated copy,
which the reference reads stale when its group is shorter than its batch). With ``act_order`` the rows
are visited by decreasing diag(H) and every block's scale is computed from the original W first (the
reference's ``static_groups``), so that blocks stay contiguous rows of W, the layout both exports store.

Rows whose input is always zero (diag(H) = 0) get H_kk = 1 and w_k = 0, as in the reference. When the
damped H is still not positive definite (rank-deficient inputs in float64 rounding), λ is multiplied by
10, up to ``MAX_DAMPING_TRIES`` times, and the layer's report says by how much.

Memory: H times a constant c leaves every update unchanged (U scales by 1/√c, e by √c), so U is
computed from XᵀX + λ'·I, λ' = damping · mean(diag XᵀX), in place (LAPACK's potrf, potri, potrf) in the
upper triangle of the Gram's own XᵀX, whose lower triangle keeps XᵀX; the upper one is mirrored back
afterwards. One (K, K) float64 array per layer (537 MB at K = 8192) instead of five.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import lapack

from quantcore.errors import UnsupportedModelError
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, assemble
from quantcore.weight_only.gram import Gram

LAZY_ROWS = 128  # rows per lazy batch: a power of two, so it is a multiple of every block_size up to 128
MAX_DAMPING_TRIES = 4
MIRROR_ROWS = 256  # rows per block when a triangle is copied onto the other


@dataclass(frozen=True)
class GptqResult:
    weight: BlockwiseWeight
    damping: float  # the λ factor used (``damping`` times the 10s that made H positive definite)


def _mirror(work: np.ndarray, diagonal: np.ndarray) -> None:
    """Sets the upper triangle of the symmetric ``work`` (K, K) from its strictly lower one, and its
    diagonal to ``diagonal`` (K,), a block of ``MIRROR_ROWS`` rows at a time (no (K, K) temporary)."""
    k = work.shape[0]
    for start in range(0, k, MIRROR_ROWS):
        stop = min(start + MIRROR_ROWS, k)
        work[start:stop, stop:] = work[stop:, start:stop].T
        lower = np.tril(work[start:stop, start:stop], -1)
        work[start:stop, start:stop] = lower + lower.T + np.diag(diagonal[start:stop])


def _upper_inverse_factor(work: np.ndarray, diagonal: np.ndarray, damping: float, layer: str) -> float:
    """Writes U into the upper triangle of ``work`` (K, K) float64 C-ordered, the diagonal included, with
    (A + λI)⁻¹ = UᵀU, A the symmetric matrix that ``work``'s strictly lower triangle and ``diagonal``
    hold, λ = damping·mean(diagonal); the strictly lower triangle is left as it was. Returns the damping
    used. LAPACK works column-major, on ``work.T``: its lower triangle is ``work``'s upper one."""
    mean_diagonal = float(np.mean(diagonal))
    column_major = work.T
    for _ in range(MAX_DAMPING_TRIES):
        _mirror(work, diagonal + damping * mean_diagonal)
        factor, info = lapack.dpotrf(column_major, lower=1, clean=0, overwrite_a=1)  # A + λI = LLᵀ
        if info == 0:
            inverse, info = lapack.dpotri(factor, lower=1, overwrite_c=1)  # (A + λI)⁻¹ from L
            if info == 0:
                factor, info = lapack.dpotrf(inverse, lower=1, clean=0, overwrite_a=1)  # = L'L'ᵀ, U = L'ᵀ
                if info == 0:
                    assert np.shares_memory(factor, work)  # LAPACK worked in place, so ``work`` holds U
                    return damping
        damping *= 10.0
    raise UnsupportedModelError(f"GPTQ: the Hessian of layer {layer} is not positive definite even damped")


def quantize_gptq(
    weight: np.ndarray, gram: Gram, grid: BlockGrid, *, damping: float, act_order: bool, layer: str
) -> GptqResult:
    """GPTQ of a (K, N) ``weight`` with its input's ``gram`` (module docstring); ``layer`` names it in
    errors. Without ``act_order``, the upper triangle of ``gram.xtx`` is the working storage of U and is
    restored before this returns, so no other (K, K) array is made; with it, a permuted copy is."""
    w = torch.tensor(np.asarray(weight), dtype=torch.float64)
    k = w.shape[0]
    xtx_diagonal = np.diag(gram.xtx).copy()
    dead = xtx_diagonal == 0
    diagonal = np.where(dead, max(gram.rows, 1) / 2.0, xtx_diagonal)  # the reference's H_kk = 1 (H = 2·XᵀX/n)
    w[torch.from_numpy(dead), :] = 0.0
    order = np.argsort(-diagonal, kind="stable") if act_order else np.arange(k)
    block_of = order // grid.block_size  # the block each visited row belongs to, in W's own row order
    static = (
        [grid.params(w[s : s + grid.block_size].numpy()) for s in range(0, k, grid.block_size)] if act_order else []
    )
    work = gram.xtx
    if act_order:
        w, work, diagonal = w[order], gram.xtx[np.ix_(order, order)], diagonal[order]
    try:
        used = _upper_inverse_factor(work, diagonal, damping, layer)
        upper = torch.from_numpy(work)  # U in the upper triangle; only that triangle is read below

        params: dict[int, tuple[np.ndarray, np.ndarray]] = dict(enumerate(static))
        codes = torch.zeros(w.shape, dtype=torch.uint8)
        lazy = max(LAZY_ROWS, grid.block_size)
        for start in range(0, k, lazy):
            stop = min(start + lazy, k)
            rows = w[start:stop].clone()  # (B, N), updated as the batch goes
            errors = torch.zeros_like(rows)
            for i in range(stop - start):
                block = int(block_of[start + i])
                if block not in params:  # no act_order: the block starts here, its rows as updated so far
                    params[block] = grid.params(rows[i : i + grid.block_size].numpy())
                scale, zero = params[block]
                row = rows[i]
                q = torch.from_numpy(grid.codes(row.numpy(), scale, zero))
                codes[start + i] = q
                rounded = (q - torch.from_numpy(zero)) * torch.from_numpy(scale.astype(np.float64))
                error = (row - rounded) / upper[start + i, start + i]
                rows[i:] -= torch.outer(upper[start + i, start + i : stop], error)
                errors[i] = error
            w[stop:].addmm_(upper[start:stop, stop:].T, errors, alpha=-1.0)  # in place: no (K, N) temporary
    finally:
        if not act_order:
            _mirror(work, xtx_diagonal)  # XᵀX again, from its lower triangle
    scales, zeros = zip(*(params[b] for b in sorted(params)), strict=True)
    stored = assemble(grid, codes[np.argsort(order)].numpy(), list(scales), list(zeros))
    return GptqResult(stored, used)
