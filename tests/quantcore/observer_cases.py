"""What the observers' tests share: data shaped like the activations observers meet, and the quantization
error a threshold gives on it."""

from __future__ import annotations

import numpy as np

from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.tqc import TensorQuantConfig
from tests.quantcore.reference import float_round_reference, linear_reference


def heavy_tailed(rng: np.random.Generator, size: int) -> np.ndarray:
    """Gaussian bulk with rare large outliers: where clipping pays off."""
    x = rng.normal(size=size)
    outliers = rng.random(size) < 1e-3
    return np.where(outliers, rng.normal(scale=40.0, size=size), x).astype(np.float32)


def true_mse(x: np.ndarray, tqc: TensorQuantConfig, amax: float) -> float:
    """Quantization MSE of the samples themselves at threshold ``amax`` (numpy reference)."""
    scale, offset = scale_offset(tqc, np.asarray(-amax), np.asarray(amax))
    if tqc.floating:
        v = x / scale
        x_hat = float_round_reference(v, 4, 3, finite_only_top=True, quant_max=tqc.quant_max) * float(scale)
    else:
        _, x_hat = linear_reference(x, scale, offset, tqc.quant_min, tqc.quant_max, None)
    return float(np.mean((x.astype(np.float64) - x_hat) ** 2))
