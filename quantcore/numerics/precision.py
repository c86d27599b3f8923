"""Precisions: how many bits weights and activations get, or FP8.

A precision name is what a recipe says; ``parse_precision`` turns it into a ``Precision``::

    int8    weights 8 bit, activations 8 bit (integer)          = w8a8
    wXaY    weights X bit, activations Y bit, X, Y in [2, 8]    e.g. w4a8, w4a4, w2a4
    fp8     weights and activations FP8 E4M3 (4 exponent bits, 3 mantissa bits, max 448)
    wX      weight-only: weights X bit (X in ``WEIGHT_ONLY_BITS``), activations stay float32

Which precisions a platform accepts is the run config's data (``quantcore.config.PLATFORM_PRECISIONS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_BITS, MAX_BITS = 2, 8
FP8_EXPONENT_BITS = 4  # E4M3: what TensorRT 10 runs for FP8 Q/DQ
_PATTERN = re.compile(r"^w([0-9]+)a([0-9]+)$")
# Weight-only widths: what both of its exports store, MatMulNBits (bits 4 or 8 on the CPU EP) and
# DequantizeLinear's int4/uint4 and int8/uint8 (``quantcore.weight_only``).
WEIGHT_ONLY_BITS = (4, 8)
FLOAT_ACTIVATION_BITS = 32  # ``Precision.activation_bits`` of a weight-only precision: float32 activations


@dataclass(frozen=True)
class Precision:
    """Bit widths of weights and activations; ``floating`` means FP8 E4M3 for both; ``weight_only``: the
    activations stay float32 (``activation_bits`` is then ``FLOAT_ACTIVATION_BITS``)."""

    name: str
    weight_bits: int
    activation_bits: int
    floating: bool = False
    weight_only: bool = False

    def __post_init__(self) -> None:
        if self.weight_only:
            if self.weight_bits not in WEIGHT_ONLY_BITS or self.activation_bits != FLOAT_ACTIVATION_BITS:
                raise ValueError(f"precision {self.name!r}: weight-only takes weight_bits in {WEIGHT_ONLY_BITS}")
            return
        for field in ("weight_bits", "activation_bits"):
            bits = getattr(self, field)
            if not MIN_BITS <= bits <= MAX_BITS:
                raise ValueError(f"precision {self.name!r}: {field} must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")

    @property
    def integer(self) -> bool:
        return not self.floating


def parse_precision(name: str) -> Precision:
    """``int8`` | ``fp8`` | ``wXaY`` | ``w4`` | ``w8``; raises ValueError naming ``precision`` otherwise."""
    if name in {f"w{bits}" for bits in WEIGHT_ONLY_BITS}:
        return Precision(name, int(name[1:]), FLOAT_ACTIVATION_BITS, weight_only=True)
    if name == "int8":
        return Precision(name, 8, 8)
    if name == "fp8":
        return Precision(name, 8, 8, floating=True)
    match = _PATTERN.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"precision must be 'int8', 'fp8', 'wXaY' (X, Y bits in [2, 8]) or weight-only 'w4' / 'w8', got {name!r}"
        )
    return Precision(name, int(match.group(1)), int(match.group(2)))
