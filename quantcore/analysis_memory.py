"""What the layer-wise analysis (``quantcore.analysis``) may hold in memory.

Its models carry the weights several times over: the switchable model holds each quantized weight as
FP32, as integers and, in its session, dequantized; the gated model holds them again, and every cone's
session (``quantcore.analysis_cones``) a part of them once more. On a model whose size is its weights
that is many times the model: the stage's peak resident memory rose, over what the process held when it
began, by 19.7 times the initializers' bytes with cones and 12.6 times without, on a chain of nine
2048 x 2048 MatMuls (144 MiB of weights; a 576 MiB chain: 20.8 times with cones, 12 GB). A 2.4 GB model
would need some 31 GB even without cones.

So once the model is prepared (before the slow stages, so that a run whose accuracy target needs the
analysis fails at once), the stage's need is priced at those factors (``WITH_CONES``,
``WITHOUT_CONES``) of the model's initializer bytes against the memory the machine (or the container's
cgroup) has available then: cones only where their price fits, no analysis where even whole-model runs
do not, and then the report says so. Activations are not priced: they are held to
``quantcore.batching.EXPOSED_BYTES_PER_BATCH``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from quantcore.protobuf import initializer_bytes

WITH_CONES = 20  # measured 19.7 (module docstring), rounded up
WITHOUT_CONES = 13  # measured 12.6
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max and memory.current of this process's group


@dataclass(frozen=True)
class MemoryPlan:
    cones: bool  # whether the layer-wise runs may use cones
    skip: str | None  # why the analysis does not run at all, or None


def plan_memory(model: onnx.ModelProto, available: int | None = None) -> MemoryPlan:
    """The plan for ``model`` given ``available`` bytes (default: ``available_bytes()``; None there, an
    unknown amount, allows everything)."""
    available = available_bytes() if available is None else available
    weights = initializer_bytes(model)
    if available is None or WITH_CONES * weights <= available:
        return MemoryPlan(cones=True, skip=None)
    if WITHOUT_CONES * weights <= available:
        return MemoryPlan(cones=False, skip=None)
    return MemoryPlan(
        cones=False,
        skip=(
            f"the layer-wise analysis was skipped: with {_gib(weights)} of weights it would need about"
            f" {_gib(WITHOUT_CONES * weights)} of memory ({WITHOUT_CONES} times the weights, measured), and"
            f" {_gib(available)} is available"
        ),
    )


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, lowered to what this process's cgroup (v2) still allows; None
    where neither can be read (not Linux)."""
    limits = []
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        maximum = (CGROUP / "memory.max").read_text().strip()
        if maximum != "max":
            limits.append(int(maximum) - int((CGROUP / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB"
