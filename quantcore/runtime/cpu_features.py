"""What the x86 CPU that runs ONNX Runtime's integer kernels can do, and what that means for weights.

ONNX Runtime's CPU EP multiplies uint8 activations by int8 weights (u8s8). Without VNNI it uses
``pmaddubsw``, which adds two u8·s8 products into a *16-bit* signed intermediate with saturation:
255 · 127 · 2 = 64770 > 32767, so large activations meeting large weights saturate and the deployed
model silently departs from its exact Q/DQ arithmetic. CPUs with VNNI (``avx512_vnni`` or ``avx_vnni``
in /proc/cpuinfo flags) accumulate in 32 bits directly (``vpdpbusd``), and ARM/other CPUs use other
kernels: full 8-bit weights are exact there. Two exact answers without VNNI:

- 7-bit weights, q_w ∈ [-64, 63]: 255 · 64 · 2 = 32640 ≤ 32767, the sum never saturates (ONNX
  Runtime's ``reduce_range``). Fast u8s8 kernels, one bit of weight precision lost.
- the full int8 grid stored as uint8 with its zero point moved by 128 (q_u8 = q_s8 + 128: the same
  dequantized values): ONNX Runtime then runs its u8u8 kernels, which do not add u8·s8 pairs in 16
  bits (measured: deployed agrees with exact Q/DQ, tests/quantcore/test_parity.py). Full precision;
  those kernels are slower (``bench.quality --latency``).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})
REDUCED_WEIGHT_BITS = 7  # symmetric [-64, 63]: 2 · 255 · 64 fits the 16-bit pmaddubsw intermediate
REDUCE_RANGE_CHOICES = ("auto", "on", "off")  # QuantizeConfig.reduce_range


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in a /proc/cpuinfo text (empty if there is none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This machine's CPU flags, None when they cannot be read (not Linux)."""
    try:
        return parse_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def parse_model_name(cpuinfo: str) -> str | None:
    """The ``model name`` of the first processor in a /proc/cpuinfo text (None if there is none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None


@functools.cache
def cpu_model() -> str:
    """This machine's CPU model name (/proc/cpuinfo), else ``platform.processor()`` or the architecture."""
    try:
        name = parse_model_name(Path("/proc/cpuinfo").read_text())
    except OSError:
        name = None
    return name or platform.processor() or platform.machine()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def saturates_u8s8(flags: frozenset[str] | None, *, x86: bool) -> bool:
    """True when u8s8 integer kernels may saturate: an x86 CPU whose flags lack VNNI. Unknown flags on
    x86 count as saturating (the safe answer costs one bit of weight precision)."""
    if not x86:
        return False
    return flags is None or not (flags & VNNI_FLAGS)


@dataclass(frozen=True)
class WeightRange:
    """The weight grid chosen for ONNX Runtime's integer kernels on this CPU.

    reduced: 7-bit weights [-64, 63] instead of int8's [-128, 127]. unsigned_storage: int8 codes are
    stored as uint8 with zero point + 128 (the same grid, read by u8u8 kernels). reason: for the report.
    """

    reduced: bool
    unsigned_storage: bool
    reason: str


def this_cpu_saturates_u8s8() -> bool:
    """``saturates_u8s8`` for the CPU this process runs on."""
    return saturates_u8s8(cpu_flags(), x86=is_x86())


def weight_range(mode: str) -> WeightRange:
    """The weight grid for ``QuantizeConfig.reduce_range`` ``mode`` on this CPU: ``on`` 7-bit; ``off``
    the full int8 grid, stored as uint8 where u8s8 kernels would saturate; ``auto`` 7-bit where they
    would saturate (ONNX Runtime's recommendation: the fast kernels stay exact), full int8 elsewhere."""
    if mode == "on":
        return WeightRange(True, False, "weights use the 7-bit range [-64, 63] (reduce_range=on)")
    if this_cpu_saturates_u8s8():
        if mode == "off":
            return WeightRange(
                False,
                True,
                (
                    "weights use the full int8 range, stored as uint8 with zero point 128 (reduce_range=off): this "
                    "x86 CPU lacks VNNI, where ONNX Runtime's u8s8 kernels would saturate; its u8u8 kernels are "
                    "exact but slower"
                ),
            )
        return WeightRange(
            True,
            False,
            (
                "weights use the 7-bit range [-64, 63]: this x86 CPU lacks VNNI, and ONNX Runtime's u8s8 "
                "kernels (pmaddubsw, 16-bit intermediate) would saturate with full int8 weights; "
                "reduce_range=off keeps the full int8 grid as uint8 weights (exact, slower u8u8 kernels)"
            ),
        )
    if mode == "off":
        return WeightRange(False, False, "weights use the full int8 range (reduce_range=off)")
    found = sorted((cpu_flags() or frozenset()) & VNNI_FLAGS)
    reason = f"this CPU has {', '.join(found)}" if found else "not an x86 CPU"
    return WeightRange(
        False,
        False,
        f"weights use the full int8 range: {reason}, so ONNX Runtime's integer kernels do not saturate",
    )
