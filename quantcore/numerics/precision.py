"""Precisions: how many bits weights and activations get, or FP8.

A precision name is what a recipe says; ``parse_precision`` turns it into a ``Precision``::

    int8    weights 8 bit, activations 8 bit (integer)          = w8a8
    wXaY    weights X bit, activations Y bit, X, Y in [2, 8]    e.g. w4a8, w4a4, w2a4
    fp8     weights and activations FP8 E4M3 (4 exponent bits, 3 mantissa bits, max 448)

Which precisions a platform accepts is the run config's data (``quantcore.config.PLATFORM_PRECISIONS``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_BITS, MAX_BITS = 2, 8
FP8_EXPONENT_BITS = 4  # E4M3: what TensorRT 10 runs for FP8 Q/DQ
_PATTERN = re.compile(r"^w([0-9]+)a([0-9]+)$")


@dataclass(frozen=True)
class Precision:
    """Bit widths of weights and activations; ``floating`` means FP8 E4M3 for both."""

    name: str
    weight_bits: int
    activation_bits: int
    floating: bool = False

    def __post_init__(self) -> None:
        for field in ("weight_bits", "activation_bits"):
            bits = getattr(self, field)
            if not MIN_BITS <= bits <= MAX_BITS:
                raise ValueError(f"precision {self.name!r}: {field} must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")

    @property
    def integer(self) -> bool:
        return not self.floating


def parse_precision(name: str) -> Precision:
    """``int8`` | ``fp8`` | ``wXaY``; raises ValueError naming ``precision`` otherwise."""
    if name == "int8":
        return Precision(name, 8, 8)
    if name == "fp8":
        return Precision(name, 8, 8, floating=True)
    match = _PATTERN.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"precision must be 'int8', 'fp8' or 'wXaY' (X, Y bits in [2, 8]), got {name!r}")
    return Precision(name, int(match.group(1)), int(match.group(2)))
