"""Floating-point (FP8) grids and their fake-quantization kernel, in torch.

A format with E exponent bits, M mantissa bits and bias B = 2^(E-1) - 1 represents, for a value
of magnitude a in binade [2^e, 2^(e+1))::

    normal     e >= 1 - B:  a ≈ 2^e · (1 + k / 2^M)          k = 0 … 2^M - 1
    subnormal  below 2^(1-B): a ≈ 2^(1-B) · k / 2^M            (gradual underflow, step 2^(1-B-M))

so the grid step is 2^(max(e, 1-B) - M) and rounding to the format is
``round(a / step) · step`` with a power-of-two step (the division is exact). Rounding is half-even by
default, like ONNX Cast/QuantizeLinear and every FP8 hardware.

Formats (the registry ``FORMATS``, keyed by (exponent_bits, mantissa_bits)):

    E4M3FN  bias 7,  max 448 = 1.75·2^8,    min normal 2^-6,  min subnormal 2^-9,  no inf, NaN = S.1111.111
    E5M2    bias 15, max 57344 = 1.75·2^15, min normal 2^-14, min subnormal 2^-16, IEEE-like inf and NaN

Saturation (ONNX ``saturate=1``, the default): |v| > quant_max becomes ±quant_max, inf included.
Without it, a value rounding above the format's max becomes NaN (E4M3FN) or ±inf (E5M2), as in a
plain cast (ml_dtypes, torch ``.to(torch.float8_*)``). NaN is preserved in both modes.

Fake quantization with scale s: x̂ = s · fp8(clip(x / s, -quant_max, quant_max)), straight-through
for x inside the clip range, and the LSQ-style gradient for s (see ``quantcore.numerics.linear``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch

from quantcore.numerics.linear import _as_tensor, broadcast, compute_dtype, with_grad_scale
from quantcore.numerics.policy import RoundingPolicy
from quantcore.numerics.rounding import round_values, straight_through


@dataclass(frozen=True)
class FloatFormat:
    """A floating-point grid: ``name`` as ONNX spells the type suffix, exponent/mantissa widths, bias,
    the largest finite value ``max``, and whether the top exponent holds inf (IEEE style)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    has_inf: bool

    def __post_init__(self) -> None:
        if self.exponent_bits < 1 or self.mantissa_bits < 0:
            raise ValueError(f"{self.name}: exponent_bits >= 1 and mantissa_bits >= 0 required")
        if not self.representable(self.max):
            raise ValueError(f"{self.name}: max {self.max} is not on the format's grid")

    @property
    def num_bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    def step(self, a: float) -> float:
        """Grid spacing around magnitude ``a``: 2^(max(e, 1 - bias) - M) with a ∈ [2^e, 2^(e+1))."""
        e = math.frexp(a)[1] - 1 if a > 0 else 1 - self.bias
        return 2.0 ** (max(e, 1 - self.bias) - self.mantissa_bits)

    def representable(self, value: float) -> bool:
        """True when ``value`` is a finite point of the grid (within the format's range by magnitude
        only if the caller checks ``abs(value) <= max``)."""
        if not math.isfinite(value):
            return False
        a = abs(value)
        return a == 0.0 or (a / self.step(a)).is_integer()


E4M3FN = FloatFormat("float8e4m3fn", exponent_bits=4, mantissa_bits=3, bias=7, max=448.0, has_inf=False)
E5M2 = FloatFormat("float8e5m2", exponent_bits=5, mantissa_bits=2, bias=15, max=57344.0, has_inf=True)

FORMATS: dict[tuple[int, int], FloatFormat] = {
    (E4M3FN.exponent_bits, E4M3FN.mantissa_bits): E4M3FN,
    (E5M2.exponent_bits, E5M2.mantissa_bits): E5M2,
}


def float_format(exponent_bits: int, mantissa_bits: int) -> FloatFormat:
    """The registered format with these widths; ValueError naming the supported ones otherwise."""
    try:
        return FORMATS[(exponent_bits, mantissa_bits)]
    except KeyError:
        known = ", ".join(f"E{e}M{m} ({f.name})" for (e, m), f in FORMATS.items())
        raise ValueError(f"no floating format E{exponent_bits}M{mantissa_bits}; supported: {known}") from None


def round_to_format(
    v: torch.Tensor,
    fmt: FloatFormat,
    *,
    quant_max: float | None = None,
    saturate: bool = True,
    rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN,
) -> torch.Tensor:
    """The nearest point of ``fmt``'s grid to each element of ``v`` (v's dtype, not differentiable).

    ``quant_max`` (default ``fmt.max``, must be on the grid) bounds the result when ``saturate``;
    without saturation, results above ``fmt.max`` become NaN (no inf in the format) or ±inf.
    """
    limit = fmt.max if quant_max is None else float(quant_max)
    if saturate:
        v = torch.clamp(v, -limit, limit)  # NaN stays NaN; ±inf → ±limit
    _, exponent = torch.frexp(v)  # |v| = m · 2^exponent, m ∈ [0.5, 1): binade e = exponent - 1
    e = torch.clamp(exponent - 1, min=1 - fmt.bias)  # subnormals share the smallest normal binade's step
    step = torch.exp2((e - fmt.mantissa_bits).to(v.dtype))
    q = round_values(v / step, rounding) * step
    if saturate:
        return torch.clamp(q, -limit, limit)  # only reachable by CEIL/FLOOR-style modes at the edge
    overflow = torch.abs(q) > fmt.max
    if fmt.has_inf:
        return torch.where(overflow, torch.copysign(torch.full_like(q, math.inf), q), q)
    return torch.where(overflow, torch.full_like(q, math.nan), q)


def fake_quantize_float(
    x: torch.Tensor,
    scale: torch.Tensor | float,
    fmt: FloatFormat,
    axis: int | None = None,
    *,
    quant_max: float | None = None,
    rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN,
    grad_scale: float | None = None,
) -> torch.Tensor:
    """x̂ = s · round_to_format(clip(x/s, ±quant_max)), in x's dtype; scale broadcast along ``axis``.

    Gradients: 1 to x where |x/s| <= quant_max (straight-through), 0 where saturated; to s,
    fp8(v) - v inside and ±quant_max outside (LSQ-style), times ``grad_scale``.
    """
    limit = fmt.max if quant_max is None else float(quant_max)
    dtype = compute_dtype(x)
    s = broadcast(with_grad_scale(_as_tensor(scale, x, dtype), grad_scale), x.ndim, axis)
    v = torch.clamp(x.to(dtype) / s, -limit, limit)  # the saturation, differentiable (0 outside)
    q = straight_through(v, partial(round_to_format, fmt=fmt, quant_max=limit, saturate=True, rounding=rounding))
    return (q * s).to(x.dtype)
