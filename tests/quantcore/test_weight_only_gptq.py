"""GPTQ's layer algorithm (``quantcore.weight_only.gptq``) against a plain numpy reference written from the
paper's update rule, and its use of the Gram's own XᵀX as working storage (restored after)."""

from __future__ import annotations

import numpy as np
import pytest

from quantcore.weight_only.blocks import BlockGrid, quantize_rtn
from quantcore.weight_only.gptq import quantize_gptq
from quantcore.weight_only.gram import Gram, GramSum

K, N, ROWS = 192, 24, 400
DEAD = 7  # an input channel that is always 0


def reference_gptq(weight: np.ndarray, gram: Gram, grid: BlockGrid, damping: float) -> np.ndarray:
    """Codes of GPTQ without act_order, row by row with no lazy batches: H = 2·XᵀX/n (H_kk = 1 where it is
    0) + λI, λ = damping·mean(diag H); U upper with H⁻¹ = UᵀU; each block's scale from its rows as updated
    when its first row is reached; e = (w_k - ŵ_k) / U_kk, w_j -= U_kj·e for j > k."""
    h = 2.0 * gram.xtx / gram.rows
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h += damping * np.mean(np.diag(h)) * np.eye(len(h))
    upper = np.linalg.cholesky(np.linalg.inv(h)).T
    w = weight.astype(np.float64)
    w[dead] = 0.0
    codes = np.zeros(w.shape)
    for k in range(len(w)):
        if k % grid.block_size == 0:
            scale, zero = grid.params(w[k : k + grid.block_size])
        codes[k] = grid.codes(w[k], scale, zero)
        error = (w[k] - (codes[k] - zero) * scale.astype(np.float64)) / upper[k, k]
        w[k + 1 :] -= np.outer(upper[k, k + 1 :], error)
    return codes


def _layer(seed: int) -> tuple[np.ndarray, Gram]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, K)) * rng.uniform(0.1, 3.0, K)  # channels of unequal scale
    x[:, DEAD] = 0.0
    total = GramSum(K)
    total.add(x)
    return (rng.standard_normal((K, N)) / 10).astype(np.float32), total.gram()


@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_matches_the_row_by_row_reference_and_restores_the_gram(symmetric: bool) -> None:
    weight, gram = _layer(0)
    grid = BlockGrid(4, 32, symmetric)
    xtx = gram.xtx.copy()
    result = quantize_gptq(weight, gram, grid, damping=0.01, act_order=False, layer="l")
    np.testing.assert_array_equal(gram.xtx, xtx)  # the working storage is mirrored back exactly
    expected = reference_gptq(weight, gram, grid, 0.01)
    # lazy batches and LAPACK's in-place factor sum in another order than the reference: a code may flip
    # where w / s falls within float64 rounding of a half step; none did here, allow 1 in 1000
    assert np.mean(result.weight.codes != expected) <= 1e-3
    assert np.all(result.weight.codes[DEAD] == result.weight.zero_points[DEAD // 32])  # ŵ = 0 where x is 0


def test_act_order_leaves_the_gram_as_it_was_and_both_orders_beat_round_to_nearest() -> None:
    weight, gram = _layer(1)
    grid = BlockGrid(4, 32, True)
    xtx = gram.xtx.copy()
    ordered = quantize_gptq(weight, gram, grid, damping=0.01, act_order=True, layer="l")
    np.testing.assert_array_equal(gram.xtx, xtx)  # act_order factors a permuted copy
    plain = quantize_gptq(weight, gram, grid, damping=0.01, act_order=False, layer="l")
    rtn = gram.output_error(weight - quantize_rtn(weight, grid).dequantize())
    for result in (ordered, plain):  # GPTQ's objective, ‖XΔ‖²/n on the data it saw
        assert gram.output_error(weight - result.weight.dequantize()) < rtn
