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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quantcore.errors import UnsupportedModelError
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, assemble
from quantcore.weight_only.gram import Gram

LAZY_ROWS = 128  # rows per lazy batch: a power of two, so it is a multiple of every block_size up to 128
MAX_DAMPING_TRIES = 4


@dataclass(frozen=True)
class GptqResult:
    weight: BlockwiseWeight
    damping: float  # the λ factor used (``damping`` times the 10s that made H positive definite)


def _upper_inverse_factor(hessian: torch.Tensor, damping: float, layer: str) -> tuple[torch.Tensor, float]:
    """(U, damping used): U upper triangular with (H + λI)⁻¹ = UᵀU."""
    mean_diagonal = float(torch.mean(torch.diag(hessian)))
    for _ in range(MAX_DAMPING_TRIES):
        damped = hessian.clone()  # (K, K) float64: each one is K²·8 bytes (537 MB at K = 8192), so no eye
        damped.diagonal().add_(damping * mean_diagonal)
        factor, info = torch.linalg.cholesky_ex(damped)
        del damped
        if int(info) == 0:
            inverse = torch.cholesky_inverse(factor)
            del factor
            upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
            if int(info) == 0:
                return upper, damping
        damping *= 10.0
    raise UnsupportedModelError(f"GPTQ: the Hessian of layer {layer} is not positive definite even damped")


def quantize_gptq(
    weight: np.ndarray, gram: Gram, grid: BlockGrid, *, damping: float, act_order: bool, layer: str
) -> GptqResult:
    """GPTQ of a (K, N) ``weight`` with its input's ``gram`` (module docstring); ``layer`` names it in errors."""
    w = torch.tensor(np.asarray(weight), dtype=torch.float64)
    k = w.shape[0]
    hessian = torch.from_numpy(gram.hessian())  # a new float64 array: taken, not copied
    dead = torch.diag(hessian) == 0
    hessian[dead, dead] = 1.0
    w[dead, :] = 0.0
    order = torch.argsort(torch.diag(hessian), descending=True) if act_order else torch.arange(k)
    block_of = order // grid.block_size  # the block each visited row belongs to, in W's own row order
    static = (
        [grid.params(w[s : s + grid.block_size].numpy()) for s in range(0, k, grid.block_size)] if act_order else []
    )
    if act_order:
        w, hessian = w[order], hessian[order][:, order]
    upper, used = _upper_inverse_factor(hessian, damping, layer)

    params: dict[int, tuple[np.ndarray, np.ndarray]] = dict(enumerate(static))
    codes = torch.zeros_like(w)
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
        w[stop:] -= upper[start:stop, stop:].T @ errors
    inverse = torch.argsort(order)
    blocks = sorted(params)
    stored = assemble(grid, codes[inverse].numpy(), [params[b][0] for b in blocks], [params[b][1] for b in blocks])
    return GptqResult(stored, used)
