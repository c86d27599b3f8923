"""The calibration statistics of one layer input X (n rows of K channels, the tensor reshaped to (-1, K)),
summed batch by batch (``GramSum``): XᵀX for GPTQ's Hessian and for every layer's output error, and
Σ|x_j| for AWQ's channel scales."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ERROR_COLUMNS = 256  # (K, 256) float64 temporaries per product instead of (K, N) ones (134 MB at K = 8192, N = 2048)


@dataclass(frozen=True)
class Gram:
    """XᵀX (K, K) float64 of one tensor over the calibration data, Σ|x| (K,) per channel, and n, the rows
    summed. ``quantize_gptq`` borrows the upper triangle of ``xtx`` as working storage and restores it."""

    xtx: np.ndarray
    abs_sum: np.ndarray
    rows: int

    def mean_abs(self) -> np.ndarray:
        """(K,) mean |x_j| over the rows."""
        return self.abs_sum / max(self.rows, 1)

    def output_error(self, delta: np.ndarray, minus: np.ndarray | None = None) -> float:
        """‖X·Δ‖²_F / n for a (K, N) weight change Δ: tr(Δᵀ XᵀX Δ) / n, summed over ``ERROR_COLUMNS``
        columns of Δ at a time; with ``minus``, Δ = delta - minus, taken in float64 a block of columns at a
        time (no (K, N) difference array)."""
        total = 0.0
        for start in range(0, delta.shape[1], ERROR_COLUMNS):
            columns = slice(start, start + ERROR_COLUMNS)
            part = np.asarray(delta[:, columns], dtype=np.float64)
            part = part if minus is None else part - minus[:, columns]
            total += float(np.sum(part * (self.xtx @ part)))
        return total / max(self.rows, 1)


class GramSum:
    """XᵀX, Σ|x| and n of one tensor of K channels, summed batch by batch in float64."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.xtx = np.zeros((width, width))  # (K, K) float64
        self.abs_sum = np.zeros(width)
        self.rows = 0

    def add(self, value: np.ndarray) -> None:
        """One batch of the tensor (any shape whose last axis is K)."""
        x = np.asarray(value, dtype=np.float64).reshape(-1, self.width)
        torch.from_numpy(self.xtx).addmm_(torch.from_numpy(x).T, torch.from_numpy(x))  # in place: no (K, K) temporary
        self.abs_sum += np.abs(x).sum(axis=0)
        self.rows += x.shape[0]

    def gram(self) -> Gram:
        return Gram(self.xtx, self.abs_sum, self.rows)
