"""From observed range to quantization parameters: the one function that does it, for every policy.

Symmetric linear (offset 0)::

    amax  = max(|lo|, |hi|)
    scale = amax / quant_max          # int8 TensorRT convention: amax / 127

Asymmetric linear (range widened to contain 0, so that 0 is exactly representable)::

    lo' = min(lo, 0), hi' = max(hi, 0)
    scale  = (hi' - lo') / (quant_max - quant_min)
    offset = clip(round(quant_min - lo' / scale), quant_min, quant_max)

Floating (FP8, offset 0)::

    scale = amax / quant_max          # quant_max: the format's max (448 for E4M3FN) unless lowered

POWER_OF_2: scale rounded *up* to 2^⌈log2 scale⌉ (so the range still fits), then the offset is
recomputed with that scale.

Guards: a range of width 0 (a tensor or channel that is all zeros) gets scale 1.0, as TensorRT's
pytorch-quantization does; any positive scale represents zeros exactly. Scales are floored at
``MIN_SCALE`` so that float32 never underflows to 0. Everything is computed in float64 and returned
as float32 (the precision ONNX stores), so the returned scale is exactly what gets exported.
``lo``/``hi`` may be arrays of any shape (per-channel vectors, or a batch of candidate ranges as the
threshold-search observers use); the result has their broadcast shape.
"""

from __future__ import annotations

import numpy as np

from quantcore.numerics.tqc import TensorQuantConfig

MIN_SCALE = 1e-30


def scale_offset(tqc: TensorQuantConfig, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and offset (int32) for ``tqc`` from the observed range [lo, hi].

    ``lo``/``hi`` are scalars for per-tensor configs, (C,) vectors for per-channel ones.
    Raises ValueError on non-finite bounds (the caller names the tensor).
    """
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("observed range is not finite")
    lo, hi = np.broadcast_arrays(lo, hi)
    quant_min, quant_max = float(tqc.quant_min), float(tqc.quant_max)
    if tqc.symmetric:  # FLOATING is always symmetric: quant_max is the format's (or a lowered) max
        amax = np.maximum(np.abs(lo), np.abs(hi))
        scale = np.where(amax > 0, amax / quant_max, 1.0)
    else:
        lo = np.minimum(lo, 0.0)
        hi = np.maximum(hi, 0.0)
        width = hi - lo
        scale = np.where(width > 0, width / (quant_max - quant_min), 1.0)
    scale = np.maximum(scale, MIN_SCALE)
    if tqc.power_of_2:
        scale = np.exp2(np.ceil(np.log2(scale)))
    scale = scale.astype(np.float32)
    if tqc.symmetric:
        offset = np.zeros(scale.shape, dtype=np.int32)
    else:
        # offset from the float32 scale that will be stored, so that lo' maps onto quant_min exactly
        offset = np.clip(np.round(quant_min - lo / scale.astype(np.float64)), quant_min, quant_max).astype(np.int32)
    return np.asarray(scale), np.asarray(offset)
