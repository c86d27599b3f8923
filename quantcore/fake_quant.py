"""Numeric kernels of linear quantization, in torch (the one implementation the engine uses).

    q  = clip(round(x / s) + o, quant_min, quant_max)      round = half to even, as ONNX QuantizeLinear
    x̂  = (q - o) · s

``fake_quantize`` is differentiable with the straight-through estimator: d round(v)/dv := 1, and the
gradient is 0 where the clip saturates. Per-channel scales broadcast along ``axis``. Arithmetic is
float32 like ONNX Runtime's kernels, so exported int8 weights equal what QuantizeLinear would produce.
"""

from __future__ import annotations

import numpy as np
import torch

from quantcore.tqc import TensorQuantConfig


def _broadcast(param: torch.Tensor, ndim: int, axis: int | None) -> torch.Tensor:
    """Reshape a (C,) parameter to broadcast along ``axis`` of an ``ndim``-D tensor; scalars unchanged."""
    if axis is None or param.ndim == 0:
        return param
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return param.reshape(shape)


def quantize(
    x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, quant_min: int, quant_max: int, axis: int | None = None
) -> torch.Tensor:
    """Integer codes q (int32 tensor) of ``x``; not differentiable."""
    s = _broadcast(scale.to(torch.float32), x.ndim, axis)
    o = _broadcast(offset.to(torch.int32), x.ndim, axis)
    q = torch.round(x.to(torch.float32) / s).to(torch.int32) + o
    return torch.clamp(q, quant_min, quant_max)


def dequantize(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Float32 values (q - o) · s."""
    s = _broadcast(scale.to(torch.float32), q.ndim, axis)
    o = _broadcast(offset.to(torch.int32), q.ndim, axis)
    return (q.to(torch.int32) - o).to(torch.float32) * s


def fake_quantize(
    x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, quant_min: int, quant_max: int, axis: int | None = None
) -> torch.Tensor:
    """x̂ = dequantize(quantize(x)), with straight-through gradients for x inside the range."""
    s = _broadcast(scale.to(x.dtype), x.ndim, axis)
    o = _broadcast(offset.to(x.dtype), x.ndim, axis)
    v = x / s
    rounded = v + (torch.round(v) - v).detach()  # STE: forward round, backward identity
    q = torch.clamp(rounded + o, quant_min, quant_max)
    return (q - o) * s


def quantize_array(x: np.ndarray, tqc: TensorQuantConfig) -> np.ndarray:
    """Integer codes of a numpy array under a calibrated ``tqc``, as int8 (signed) or uint8."""
    if tqc.scale is None:
        raise ValueError("quantize_array needs a calibrated config (scale is None)")
    q = quantize(
        torch.tensor(np.asarray(x), dtype=torch.float32),
        torch.tensor(tqc.scale),
        torch.tensor(tqc.offset),
        tqc.quant_min,
        tqc.quant_max,
        tqc.channel_axis,
    )
    dtype = np.int8 if tqc.quant_min < 0 else np.uint8
    return q.numpy().astype(dtype)
