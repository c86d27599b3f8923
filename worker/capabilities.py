"""What this machine can do for the engine stage: a CUDA device and an importable TensorRT, or why not.

The worker's parent process must never initialise CUDA (its forked pool processes would inherit a
broken context), so ``probe()`` asks a child interpreter, ``python -m worker.capabilities``, which
imports torch and tensorrt, prints one JSON object and exits:

    {"engine_capable": true, "reason": null, "tensorrt_version": "10.13.0",
     "gpu": {"name": "NVIDIA L4", "compute_capability": "8.9", ...}}

``QUANT_FAKE_ENGINE_PROBE`` (a JSON object of that shape) replaces the child's answer. Only the tests
set it, to stand in for a GPU this machine does not have; the answer is then marked
``"simulated": true`` and the build itself still runs for real (and says it found no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

FAKE_PROBE_ENV = "QUANT_FAKE_ENGINE_PROBE"
PROBE_TIMEOUT = 120.0  # seconds; importing torch and tensorrt on a cold disk takes a while


def _inspect() -> dict[str, Any]:
    """Runs in the child: the facts, with the reason whenever an engine cannot be built here."""
    from quantcore.tensorrt.build import tensorrt_module
    from quantcore.tensorrt.metadata import cuda_status, gpu_info

    usable, cuda_reason = cuda_status()
    trt, trt_reason = tensorrt_module()
    reasons = [reason for reason in (cuda_reason, trt_reason) if reason]
    return {
        "engine_capable": not reasons,
        "reason": "; ".join(reasons) or None,
        "tensorrt_version": None if trt is None else trt.__version__,
        "gpu": gpu_info() if usable else None,
    }


def probe() -> dict[str, Any]:
    """This machine's capabilities, asked of a child process (CUDA stays out of the caller)."""
    fake = os.environ.get(FAKE_PROBE_ENV)
    if fake:
        answer = json.loads(fake)
        return {"engine_capable": True, "reason": None, **answer, "simulated": True}
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "worker.capabilities"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"engine_capable": False, "reason": f"the capability probe did not answer within {PROBE_TIMEOUT} s"}
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"engine_capable": False, "reason": f"the capability probe failed: {tail}"}
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_inspect()) + "\n")
