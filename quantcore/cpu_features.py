"""What the x86 CPU that runs ONNX Runtime's integer kernels can do, and what that means for weights.

ONNX Runtime's CPU EP multiplies uint8 activations by int8 weights (u8s8). Without VNNI it uses
``pmaddubsw``, which adds two u8·s8 products into a *16-bit* signed intermediate with saturation:
255 · 127 · 2 = 64770 > 32767, so large activations meeting large weights saturate and the deployed
model silently departs from its exact Q/DQ arithmetic. With 7-bit weights, q_w ∈ [-64, 63],
255 · 64 · 2 = 32640 ≤ 32767 and the sum never saturates (ONNX Runtime's ``reduce_range``). CPUs with
VNNI (``avx512_vnni`` or ``avx_vnni`` in /proc/cpuinfo flags) accumulate in 32 bits directly
(``vpdpbusd``), and ARM/other CPUs use other kernels: full 8-bit weights are exact there.
"""

from __future__ import annotations

import functools
import platform
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


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def saturates_u8s8(flags: frozenset[str] | None, *, x86: bool) -> bool:
    """True when u8s8 integer kernels may saturate: an x86 CPU whose flags lack VNNI. Unknown flags on
    x86 count as saturating (the safe answer costs one bit of weight precision)."""
    if not x86:
        return False
    return flags is None or not (flags & VNNI_FLAGS)


def reduced_weight_range(mode: str) -> tuple[bool, str]:
    """(use 7-bit weights?, the reason, for the report) for ``QuantizeConfig.reduce_range`` ``mode``."""
    if mode == "on":
        return True, "weights use the 7-bit range [-64, 63] (reduce_range=on)"
    if mode == "off":
        return False, "weights use the full int8 range (reduce_range=off)"
    flags = cpu_flags()
    if saturates_u8s8(flags, x86=is_x86()):
        return True, (
            "weights use the 7-bit range [-64, 63]: this x86 CPU lacks VNNI, and ONNX Runtime's u8s8 "
            "kernels (pmaddubsw, 16-bit intermediate) would saturate with full int8 weights"
        )
    found = sorted((flags or frozenset()) & VNNI_FLAGS)
    reason = f"this CPU has {', '.join(found)}" if found else "not an x86 CPU"
    return False, f"weights use the full int8 range: {reason}, so ONNX Runtime's integer kernels do not saturate"
