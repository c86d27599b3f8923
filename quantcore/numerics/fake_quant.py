"""Fake quantization under a `TensorQuantConfig`: the entry point calibration, reconstruction and
evaluation use. The arithmetic lives in two kernels, one per grid:

    LINEAR    x̂ = (clip(round(x / s) + o, quant_min, quant_max) - o) · s     ``quantcore.numerics.linear``
    FLOATING  x̂ = s · fp8(clip(x / s, -quant_max, quant_max))                 ``quantcore.numerics.floating``

Both are differentiable with the straight-through estimator (gradient 1 to x inside the range, 0
where clipped; LSQ-style gradient to a scale tensor that requires grad). The config adds:

* rounding: ``tqc.rounding`` (seven modes) for x/s, and for the FP8 mantissa;
* POWER_OF_2: a learned ``scale`` tensor is used as 2^⌈log2 s⌉ (straight-through); a config's own
  scale is a power of two already (``TensorQuantConfig`` refuses others);
* DYNAMIC: the scale comes from the value itself, lo/hi = min/max of x (per channel along
  ``channel_axis``), turned into scale/offset by ``quantcore.numerics.scaling.scale_offset``; no gradient to it.

Tensors stay on x's device (CPU or CUDA). ``fake_quantize_numpy`` and ``quantize_array`` are the
numpy-facing forms.
"""

from __future__ import annotations

import numpy as np
import torch

from quantcore.numerics.floating import fake_quantize_float, round_to_format
from quantcore.numerics.linear import broadcast, dequantize, fake_quantize, quantize
from quantcore.numerics.rounding import straight_through
from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.storage_type import storage_type
from quantcore.numerics.tqc import QuantState, TensorQuantConfig

__all__ = [
    "dequantize",
    "fake_quantize",
    "fake_quantize_numpy",
    "fake_quantize_tensor",
    "quantize",
    "quantize_array",
]


def _power_of_2(scale: torch.Tensor) -> torch.Tensor:
    return straight_through(scale, lambda s: torch.exp2(torch.ceil(torch.log2(s))))


def _dynamic_scale(x: torch.Tensor, tqc: TensorQuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """scale/offset of x's own range (per channel along ``channel_axis`` when per-channel)."""
    values = x.detach()
    if tqc.per_channel:
        values = values.movedim(tqc.channel_axis, 0).reshape(values.shape[tqc.channel_axis], -1)  # (C, rest)
        lo, hi = values.amin(dim=1), values.amax(dim=1)
    else:
        lo, hi = values.amin(), values.amax()
    scale, offset = scale_offset(tqc, lo.double().cpu().numpy(), hi.double().cpu().numpy())
    return torch.from_numpy(scale).to(x.device), torch.from_numpy(offset).to(x.device)


def _parameters(
    x: torch.Tensor, tqc: TensorQuantConfig, scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if tqc.dynamic:
        return _dynamic_scale(x, tqc)
    if scale is None:
        if tqc.scale is None:
            raise ValueError(f"fake quantization needs a calibrated config (state {tqc.state.value}, scale None)")
        scale = torch.tensor(np.asarray(tqc.scale)).to(x.device)
    offset = torch.zeros(()) if tqc.offset is None else torch.tensor(np.asarray(tqc.offset))
    if tqc.power_of_2:
        scale = _power_of_2(scale)
    return scale, offset.to(x.device)


def fake_quantize_tensor(
    x: torch.Tensor,
    tqc: TensorQuantConfig,
    *,
    scale: torch.Tensor | None = None,
    grad_scale: float | None = None,
) -> torch.Tensor:
    """x̂ of ``x`` under ``tqc`` (x's dtype and device). FP32 and OVERLAPPED configs return x unchanged.

    ``scale``: a tensor to use instead of ``tqc.scale`` (e.g. a learnable ``nn.Parameter`` for LSQ);
    ``grad_scale`` multiplies its gradient. Raises ValueError for an uncalibrated static config.
    """
    if tqc.state in (QuantState.FP32, QuantState.OVERLAPPED):
        return x
    s, o = _parameters(x, tqc, scale)
    axis = tqc.channel_axis if tqc.per_channel else None
    if tqc.floating:
        return fake_quantize_float(
            x, s, tqc.float_format, axis, quant_max=tqc.quant_max, rounding=tqc.rounding, grad_scale=grad_scale
        )
    return fake_quantize(x, s, o, tqc.quant_min, tqc.quant_max, axis, rounding=tqc.rounding, grad_scale=grad_scale)


def fake_quantize_numpy(x: np.ndarray, tqc: TensorQuantConfig) -> np.ndarray:
    """x̂ of a numpy array under ``tqc``, as float32 (float64 stays float64)."""
    array = np.asarray(x)
    dtype = np.float64 if array.dtype == np.float64 else np.float32
    with torch.no_grad():
        return fake_quantize_tensor(torch.tensor(np.asarray(array, dtype=dtype)), tqc).numpy()


def quantize_array(x: np.ndarray, tqc: TensorQuantConfig) -> np.ndarray:
    """The stored form of ``x`` under a calibrated ``tqc`` (what an initializer of the Q output holds).

    Linear: integer codes q in the numpy type of ``storage_type(tqc, widen=True)``: int8/uint8,
    int16/uint16; int4/uint4 codes come in int8/uint8 (numpy has no 4-bit type; the exporter packs them).
    Floating: float32 values x/s already on the FP8 grid and saturated, so a cast to the ONNX float8
    type is exact.
    """
    if tqc.scale is None:
        raise ValueError("quantize_array needs a calibrated config (scale is None)")
    tensor = torch.tensor(np.asarray(x, dtype=np.float32))
    axis = tqc.channel_axis if tqc.per_channel else None
    scale = torch.tensor(np.asarray(tqc.scale))  # a POWER_OF_2 config's scale is already 2^k
    if tqc.floating:
        v = tensor / broadcast(scale, tensor.ndim, axis)
        return round_to_format(v, tqc.float_format, quant_max=tqc.quant_max, rounding=tqc.rounding).numpy()
    q = quantize(
        tensor, scale, torch.tensor(np.asarray(tqc.offset)), tqc.quant_min, tqc.quant_max, axis, rounding=tqc.rounding
    )
    bits = storage_type(tqc, widen=True).bits
    signed = tqc.quant_min < 0
    dtype = {8: (np.uint8, np.int8), 16: (np.uint16, np.int16)}[max(bits, 8)][signed]
    return q.numpy().astype(dtype)
