"""Linear (integer-grid) quantization kernels in torch: the one implementation the engine uses.

    q  = clip(round(x / s) + o, quant_min, quant_max)      round: a ``RoundingPolicy``, default half-even
    x̂  = (q - o) · s                                      (ONNX QuantizeLinear / DequantizeLinear)

``fake_quantize`` is differentiable:

* d x̂/dx = 1 where quant_min <= round(x/s) + o <= quant_max, else 0 (straight-through estimator);
* d x̂/ds = round(x/s) - x/s inside the range and (q - o) where clipped: the LSQ gradient
  (Esser et al. 2020), obtained by letting autograd differentiate the expression above with the STE.
  ``grad_scale`` g multiplies the scale's gradient without changing the forward value (LSQ uses
  g = 1/sqrt(numel · quant_max)).

Per-channel scale/offset are (C,) vectors broadcast along ``axis``. Arithmetic is float32 (float64 if x
is float64), the precision of ONNX Runtime's kernels, so codes equal what QuantizeLinear produces.
Tensors stay on x's device.
"""

from __future__ import annotations

import torch

from quantcore.numerics.policy import RoundingPolicy
from quantcore.numerics.rounding import round_ste, round_values


def broadcast(param: torch.Tensor, ndim: int, axis: int | None) -> torch.Tensor:
    """Reshape a (C,) parameter to broadcast along ``axis`` of an ``ndim``-D tensor; scalars unchanged."""
    if axis is None or param.ndim == 0:
        return param
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return param.reshape(shape)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 input: half-precision inputs are quantized in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def with_grad_scale(scale: torch.Tensor, grad_scale: float | None) -> torch.Tensor:
    """``scale`` forward; its gradient multiplied by ``grad_scale`` backward (LSQ's g)."""
    if grad_scale is None:
        return scale
    scaled = scale * grad_scale
    return scaled + (scale - scaled).detach()


def _as_tensor(value: torch.Tensor | float | int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=dtype)
    return torch.as_tensor(value, device=like.device, dtype=dtype)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    quant_min: int,
    quant_max: int,
    axis: int | None = None,
    *,
    rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN,
) -> torch.Tensor:
    """Integer codes q (int32 tensor) of ``x``; not differentiable. NaN maps to the offset (code of 0)."""
    dtype = compute_dtype(x)
    s = broadcast(_as_tensor(scale, x, dtype), x.ndim, axis)
    o = broadcast(_as_tensor(offset, x, dtype), x.ndim, axis)
    q = torch.clamp(round_values(x.to(dtype) / s, rounding) + o, quant_min, quant_max)
    q = torch.where(torch.isnan(q), o.expand_as(q), q)
    return q.to(torch.int32)


def dequantize(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Float32 values (q - o) · s."""
    s = broadcast(_as_tensor(scale, q, torch.float32), q.ndim, axis)
    o = broadcast(_as_tensor(offset, q, torch.int32), q.ndim, axis)
    return (q.to(torch.int32) - o).to(torch.float32) * s


def fake_quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    quant_min: int,
    quant_max: int,
    axis: int | None = None,
    *,
    rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN,
    grad_scale: float | None = None,
) -> torch.Tensor:
    """x̂ = (clip(round(x/s) + o, quant_min, quant_max) - o) · s, in x's dtype, STE gradients (see module).

    NaN stays NaN; ±inf saturates to the end of the grid.
    """
    dtype = compute_dtype(x)
    s = broadcast(with_grad_scale(_as_tensor(scale, x, dtype), grad_scale), x.ndim, axis)
    o = broadcast(_as_tensor(offset, x, dtype).detach(), x.ndim, axis)
    q = torch.clamp(round_ste(x.to(dtype) / s, rounding) + o, quant_min, quant_max)
    return ((q - o) * s).to(x.dtype)
