"""Stage 6, evaluate: what quantization cost, measured on held-out inputs.

ONNX Runtime runs the FP32 model and the exported QDQ model batch by batch on the same inputs. The QDQ
model runs twice, because the two can differ:

- ``qdq_exact``: Q/DQ nodes executed as written (``session.disable_quant_qdq``), i.e. exact fake-quant
  arithmetic in float — what the quantization itself costs;
- ``qdq_deployed``: default graph optimizations, so ONNX Runtime fuses Q/DQ into integer kernels
  where it can — what a deployment on this runtime gets.

Per output and mode: SQNR, cosine, max/mean abs error, argmax agreement (``quantcore.metrics``).
With labels: top-1 accuracy of FP32 and of both QDQ modes on the first output of rank ≥ 2.
Also the model sizes (bytes, external data included), Q/DQ node counts, and the op types of the graph
ONNX Runtime runs in deployed mode (``qdq_deployed.kernels``: QLinearConv etc. show which layers really
run on integer kernels; a DequantizeLinear feeding a float op means that layer runs in float).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.batching import Batches, input_specs
from quantcore.config import QuantizeConfig
from quantcore.errors import InvalidDataError
from quantcore.graph import external_locations
from quantcore.metrics import OutputAgreement, TopOneAccuracy
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.session import open_session

STAGE = "evaluate"
MODES = ("qdq_exact", "qdq_deployed")


def model_bytes(path: str | Path) -> int:
    """Size of a model file plus the external data files it references."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    size = path.stat().st_size
    for location in external_locations(model):
        data = path.parent / location
        if location and data.is_file():
            size += data.stat().st_size
    return size


def kernel_histogram(path: Path) -> dict[str, int] | None:
    """Op types of the graph ONNX Runtime saved after optimization ("domain.Op" outside the default
    domain), i.e. the kernels the deployed session runs; None if it could not be saved or read."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # a missing or unreadable dump only loses this diagnostic
        return None
    counts: dict[str, int] = {}
    for node in model.graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def check_labels(labels: np.ndarray | None, total: int, used: int) -> np.ndarray | None:
    if labels is None:
        return None
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise InvalidDataError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    if len(labels) != total:
        raise InvalidDataError(f"labels has {len(labels)} entries but the evaluation data has {total} samples")
    return labels[:used]


def evaluate(
    fp32_model: str | Path,
    qdq_model: str | Path,
    evaluation: Mapping[str, np.ndarray],
    config: QuantizeConfig,
    *,
    labels: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
) -> dict[str, Any]:
    """Compare ``qdq_model`` with ``fp32_model`` on ``evaluation`` (``{input: array}``, first axis samples).

    Returns a JSON-ready dict (SQNR etc. may be None, see ``quantcore.metrics``). Raises
    ``InvalidDataError`` if the data or labels don't fit, ``Canceled`` between batches.
    """
    monitor = Monitor(progress, should_cancel)
    fp32_proto = onnx.load(str(fp32_model), load_external_data=False)
    batches = Batches(evaluation, input_specs(fp32_proto), config.batch_size, what="evaluation")
    labels = check_labels(labels, batches.total_samples, batches.num_samples)
    output_names = [o.name for o in fp32_proto.graph.output]
    del fp32_proto

    agreement = {mode: {name: OutputAgreement() for name in output_names} for mode in MODES}
    top1 = {mode: TopOneAccuracy() for mode in ("fp32", *MODES)}
    top1_output: str | None = None
    scratch = tempfile.TemporaryDirectory(prefix="quantcore-eval-")
    deployed_graph = Path(scratch.name) / "deployed.onnx"
    with (
        scratch,
        open_session(fp32_model, device=config.device) as fp32,
        open_session(qdq_model, device=config.device, exact_qdq=True) as exact,
        open_session(qdq_model, device=config.device, optimized_model_path=deployed_graph) as deployed,
    ):
        deployed_kernels = kernel_histogram(deployed_graph)
        sessions = {"qdq_exact": exact, "qdq_deployed": deployed}
        start = 0
        total = len(batches)
        for i, batch in enumerate(batches):
            monitor.check(STAGE)
            size = len(next(iter(batch.values())))
            reference = dict(zip(output_names, fp32.run(output_names, batch), strict=True))
            if labels is not None and top1_output is None:
                top1_output = next((n for n in output_names if reference[n].ndim >= 2), None)
                if top1_output is None:
                    raise InvalidDataError("labels were given but no model output has rank >= 2 to take argmax of")
            batch_labels = labels[start : start + size] if labels is not None else None
            if batch_labels is not None:
                top1["fp32"].update(reference[top1_output], batch_labels)
            for mode, session in sessions.items():
                outputs = dict(zip(output_names, session.run(output_names, batch), strict=True))
                for name in output_names:
                    agreement[mode][name].update(reference[name], outputs[name])
                if batch_labels is not None:
                    top1[mode].update(outputs[top1_output], batch_labels)
            start += size
            monitor.report(STAGE, (i + 1) / total, f"batch {i + 1}/{total}")

    qdq_proto = onnx.load(str(qdq_model), load_external_data=False)
    report: dict[str, Any] = {
        "model": {
            "fp32_bytes": model_bytes(fp32_model),
            "qdq_bytes": model_bytes(qdq_model),
            "quantize_linear_nodes": sum(n.op_type == "QuantizeLinear" for n in qdq_proto.graph.node),
            "dequantize_linear_nodes": sum(n.op_type == "DequantizeLinear" for n in qdq_proto.graph.node),
        },
        "num_samples": batches.num_samples,
        "batch_size": batches.batch_size,
        "top1_output": top1_output,
        "fp32": {"top1": top1["fp32"].result()},
    }
    for mode in MODES:
        report[mode] = {
            "top1": top1[mode].result(),
            "outputs": {name: agreement[mode][name].result() for name in output_names},
        }
    report["qdq_deployed"]["kernels"] = deployed_kernels
    return report
