"""Engine outputs against ONNX Runtime: the QDQ model run as exact Q/DQ arithmetic (the simulation the
report measured) and the FP32 model, on the same evaluation inputs.

Metrics per output are ``quantcore.numerics.metrics.OutputAgreement``'s (SQNR dB, cosine, max/mean abs error,
argmax agreement), streamed batch by batch; nothing is buffered beyond one batch. ``run_engine`` is
any ``feeds -> outputs`` callable (``EngineRunner.run``), so this module needs no TensorRT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.numerics.metrics import OutputAgreement
from quantcore.runtime.batching import InputSpec, output_batch_axes, take_window
from quantcore.runtime.session import open_session

RunEngine = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def compare_with_references(
    run_engine: RunEngine,
    references: Mapping[str, tuple[str | Path, bool]],
    inputs: Mapping[str, np.ndarray],
    batch_size: int,
    specs: Sequence[InputSpec],
) -> dict[str, Any]:
    """``{"num_samples", "batch_size", "vs_<label>": {output: metrics}}`` for each reference
    ``label -> (model path, exact_qdq)``; ``inputs`` hold samples along each input's batch axis
    (``specs``, ``quantcore.runtime.batching``), a constant input is fed whole with every batch."""
    axes = {spec.name: spec.batch_axis for spec in specs}
    counts = [int(a.shape[axes[name]]) for name, a in inputs.items() if axes[name] is not None]
    if not counts:
        raise ValueError("no inputs to compare on")
    samples = min(counts)
    first_reference = next(iter(references.values()))[0]
    sample_axes = output_batch_axes(onnx.load(str(first_reference), load_external_data=False))
    agreements: dict[str, dict[str, OutputAgreement]] = {label: {} for label in references}
    with contextlib.ExitStack() as stack:
        sessions = {
            label: stack.enter_context(open_session(path, exact_qdq=exact))
            for label, (path, exact) in references.items()
        }
        for start in range(0, samples, batch_size):
            feeds = {
                name: a if axes[name] is None else np.ascontiguousarray(take_window(a, axes[name], start, batch_size))
                for name, a in inputs.items()
            }
            engine_out = run_engine(feeds)
            for label, session in sessions.items():
                names = [o.name for o in session.get_outputs()]
                for name, value in zip(names, session.run(names, feeds), strict=True):
                    if name in engine_out:
                        agreement = agreements[label].setdefault(
                            name, OutputAgreement(sample_axis=sample_axes.get(name, 0))
                        )
                        agreement.update(np.asarray(value), np.asarray(engine_out[name], dtype=np.asarray(value).dtype))
    result: dict[str, Any] = {"num_samples": samples, "batch_size": batch_size}
    for label, per_output in agreements.items():
        result[f"vs_{label}"] = {name: agreement.result() for name, agreement in per_output.items()}
    return result
