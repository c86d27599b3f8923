"""The calibration statistics of one layer input X (n rows of K channels, the tensor reshaped to (-1, K)),
streamed batch by batch (``quantcore.weight_only.layers.collect_grams``): XᵀX for GPTQ's Hessian and for
every layer's output error, and Σ|x_j| for AWQ's channel scales."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gram:
    """XᵀX (K, K) float64 of one tensor over the calibration data, Σ|x| (K,) per channel, and n, the rows
    summed."""

    xtx: np.ndarray
    abs_sum: np.ndarray
    rows: int

    def hessian(self) -> np.ndarray:
        """2·XᵀX / n (GPTQ's H before damping)."""
        return 2.0 * self.xtx / max(self.rows, 1)

    def mean_abs(self) -> np.ndarray:
        """(K,) mean |x_j| over the rows."""
        return self.abs_sum / max(self.rows, 1)

    def output_error(self, delta: np.ndarray) -> float:
        """‖X·Δ‖²_F / n for a (K, N) weight change Δ: tr(Δᵀ XᵀX Δ) / n."""
        delta = np.asarray(delta, dtype=np.float64)
        return float(np.sum(delta * (self.xtx @ delta)) / max(self.rows, 1))

    def divided(self, scale: np.ndarray) -> Gram:
        """The statistics of X ÷ s (s (K,) per channel): diag(1/s)·XᵀX·diag(1/s) and Σ|x_j| / s_j."""
        inverse = 1.0 / np.asarray(scale, dtype=np.float64)
        return Gram(self.xtx * np.outer(inverse, inverse), self.abs_sum * inverse, self.rows)
