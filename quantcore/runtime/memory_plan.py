"""What a run may hold in memory, priced once the model is prepared, before the slow stages.

**The run.** On a model whose size is its weights, a run's resident memory peaks at about four times
them: 10 050 MiB for 2 304 MiB of weights, a chain of nine 8192 x 8192 MatMuls (``bench.quality
--large``; 4.36 times, 4.25 counting only what the run added to the process), and 8 720 MiB for a
2 062 MiB embedding table (``tests/quantcore/test_large_models.py``, the whole pytest process: 4.23).
The loaded model, its sessions' copies and the evaluation's three sessions at once make it so. A run
whose ``RUN_FACTOR`` times the weights exceed what the process holds plus what is available is refused
at once, with both figures: killed by the kernel halfway, it would tell nobody why.

**The layer-wise analysis** carries the weights several times over: the switchable model holds each
quantized weight as FP32, as integers and, in its session, dequantized; the gated model holds them
again, and every cone's session (``quantcore.analysis.cones``) a part of them once more. The stage's
peak resident memory rose, over what the process held when it began, by 19.7 times the initializers'
bytes with cones and 12.6 times without, on a chain of nine 2048 x 2048 MatMuls (144 MiB of weights; a
576 MiB chain: 20.8 times with cones, 11 980 MiB). A 2.4 GB model would need some 31 GB even without
cones. So the stage uses cones where ``WITH_CONES`` times the weights fit in the memory available,
whole-model runs where ``WITHOUT_CONES`` times fit, and is otherwise skipped, and the report says so.

Activations are not priced: they are held to ``quantcore.runtime.batching.EXPOSED_BYTES_PER_BATCH``. Memory
available is the machine's MemAvailable, lowered to what the process's cgroup (v2) still allows inside
a container.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from quantcore.errors import UnsupportedModelError
from quantcore.graph.protobuf import initializer_bytes

RUN_FACTOR = 4  # measured 4.25 and under 4.23 (module docstring): a refusal errs towards trying
WITH_CONES = 20  # measured 19.7, rounded up
WITHOUT_CONES = 13  # measured 12.6
MEMINFO = Path("/proc/meminfo")
STATUS = Path("/proc/self/status")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max and memory.current of this process's group


@dataclass(frozen=True)
class MemoryPlan:
    cones: bool  # whether the layer-wise runs may use cones
    skip: str | None  # why the analysis does not run at all, or None


def plan_memory(model: onnx.ModelProto, available: int | None = None) -> MemoryPlan:
    """The plan for ``model`` given ``available`` bytes (default: ``available_bytes()``; None there, an
    unknown amount, allows everything). Raises ``UnsupportedModelError`` when the run itself does not fit
    in ``available`` plus what this process holds."""
    available = available_bytes() if available is None else available
    weights = initializer_bytes(model)
    if available is None:
        return MemoryPlan(cones=True, skip=None)
    held = resident_bytes()
    if RUN_FACTOR * weights > available + held:
        raise UnsupportedModelError(
            f"quantizing this model needs about {_size(RUN_FACTOR * weights)} of memory ({RUN_FACTOR} times its"
            f" {_size(weights)} of weights, measured); this worker holds {_size(held)} and has {_size(available)}"
            " more available"
        )
    if WITH_CONES * weights <= available:
        return MemoryPlan(cones=True, skip=None)
    if WITHOUT_CONES * weights <= available:
        return MemoryPlan(cones=False, skip=None)
    return MemoryPlan(
        cones=False,
        skip=(
            f"the layer-wise analysis was skipped: with {_size(weights)} of weights it would need about"
            f" {_size(WITHOUT_CONES * weights)} of memory ({WITHOUT_CONES} times the weights, measured), and"
            f" {_size(available)} is available"
        ),
    )


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, lowered to what this process's cgroup (v2) still allows; None
    where neither can be read (not Linux)."""
    limits = [] if (machine := _proc_bytes(MEMINFO, "MemAvailable")) is None else [machine]
    try:
        maximum = (CGROUP / "memory.max").read_text().strip()
        if maximum != "max":
            limits.append(int(maximum) - int((CGROUP / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def resident_bytes() -> int:
    """This process's resident memory (VmRSS); 0 where it cannot be read."""
    return _proc_bytes(STATUS, "VmRSS") or 0


def _proc_bytes(path: Path, key: str) -> int | None:
    """The ``key: N kB`` line of a /proc file, in bytes; None where there is none."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{key}:")), None)


def _size(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
