"""Stage 6, evaluate: what quantization cost, measured on held-out inputs.

ONNX Runtime runs the FP32 model and the exported QDQ model batch by batch on the same inputs. The QDQ
model runs twice, because the two can differ:

- ``qdq_exact``: Q/DQ nodes executed as written (``session.disable_quant_qdq``), i.e. exact fake-quant
  arithmetic in float — what the quantization itself costs;
- ``qdq_deployed``: default graph optimizations, so ONNX Runtime fuses Q/DQ into integer kernels
  where it can — what a deployment on this runtime gets.

Per output and mode: SQNR, cosine, max/mean abs error, argmax agreement (``quantcore.numerics.metrics``);
``deployed_vs_exact``: the same metrics of the deployed outputs against the exact ones (the input of
``quantcore.evaluate.parity``). If ONNX Runtime cannot build the deployed session (its optimizer has no kernel
for a sub-8-bit type, for example), ``qdq_deployed.skipped`` says why and its metrics are None.
With labels: every task metric (``quantcore.numerics.metrics.TASK_METRICS``: top-1, top-5, ...) of FP32 and
of both QDQ modes on the first output of rank ≥ 2, under ``task_metrics`` (``top1`` also on its own).
``latency_ms_per_sample``: wall time of ``session.run`` per sample for FP32 and both modes, summed over
the evaluation batches on this machine (a rough figure: no warm-up, other load included).
Also the model sizes (bytes, external data included), Q/DQ node counts, and the op types of the graph
ONNX Runtime runs in deployed mode (``qdq_deployed.kernels``: QLinearConv etc. show which layers really
run on integer kernels; a DequantizeLinear feeding a float op means that layer runs in float), counted
as ``integer_kernels`` and ``float_compute_kernels``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.config import QuantizeConfig
from quantcore.errors import InvalidDataError, QuantcoreError
from quantcore.export.qdq import QUANTIZERS, count_ops
from quantcore.graph.index import external_locations
from quantcore.numerics.metrics import TASK_METRICS, OutputAgreement, TaskMetric, as_array
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.runtime.batching import Batches, describe, input_specs, output_batch_axes
from quantcore.runtime.session import RUNTIME_ERRORS, open_session, runtime_message

STAGE = "evaluate"
# Kernels in ONNX Runtime's optimized graph: integer ones (the Q/DQ fused) and float compute ones
# (a Conv/Gemm/MatMul that still runs in float32, i.e. its Q/DQ were not fused).
INTEGER_KERNELS = frozenset(
    {
        "com.microsoft.QLinearConv",
        "com.microsoft.QGemm",
        "QLinearMatMul",
        "QLinearConv",
        "MatMulInteger",
        "ConvInteger",
        "com.microsoft.MatMulIntegerToFloat",
        "com.microsoft.QLinearAdd",
        "com.microsoft.QLinearMul",
        "com.microsoft.QLinearConcat",
        "com.microsoft.QLinearAveragePool",
        "com.microsoft.QLinearGlobalAveragePool",
        "com.microsoft.QLinearSigmoid",
        "com.microsoft.QLinearLeakyRelu",
        "com.microsoft.QLinearConvTranspose",
    }
)
FLOAT_COMPUTE = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "com.microsoft.FusedConv",
        "com.microsoft.FusedGemm",
        "com.microsoft.FusedMatMul",
        "com.microsoft.nchwc.Conv",
    }
)
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


def _scores(value: Any) -> np.ndarray | None:
    """An output as class scores for the task metrics: an array of rank >= 2 (``as_array``: a ZipMap's
    probabilities too), else None."""
    array = as_array(value)
    return array if array is not None and array.ndim >= 2 else None


def _task_results(metrics: dict[str, TaskMetric], labels: np.ndarray | None) -> dict[str, float | None]:
    """Each task metric's result; empty without labels (nothing was scored)."""
    return {} if labels is None else {name: metric.result() for name, metric in metrics.items()}


def evaluate(
    fp32_model: str | Path,
    qdq_model: str | Path,
    evaluation: Mapping[str, np.ndarray],
    config: QuantizeConfig,
    *,
    labels: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
    reference: onnx.ModelProto | None = None,
) -> dict[str, Any]:
    """Compare ``qdq_model`` with ``fp32_model`` on ``evaluation`` (``{input: array}``, samples along
    each input's batch axis, ``quantcore.runtime.batching``). ``reference``: what computes the FP32 outputs in
    place of ``fp32_model`` (a half-precision model's float32 computation, ``quantcore.prepare.half_precision``),
    with the same inputs and outputs; sizes are still ``fp32_model``'s.

    Returns a JSON-ready dict (SQNR etc. may be None, see ``quantcore.numerics.metrics``). Raises
    ``InvalidDataError`` if the data or labels don't fit, ``Canceled`` between batches.
    """
    monitor = Monitor(progress, should_cancel)
    fp32_proto = onnx.load(str(fp32_model), load_external_data=False)
    batches = Batches(evaluation, input_specs(fp32_proto), config.batch_size, what="evaluation")
    labels = check_labels(labels, batches.total_samples, batches.num_samples)
    output_names = [o.name for o in fp32_proto.graph.output]
    sample_axes = output_batch_axes(fp32_proto)
    del fp32_proto

    agreement = {
        mode: {name: OutputAgreement(sample_axis=sample_axes[name]) for name in output_names} for mode in MODES
    }
    parity = {name: OutputAgreement(sample_axis=sample_axes[name]) for name in output_names}
    seconds = {"fp32": 0.0, **{mode: 0.0 for mode in MODES}}  # wall time of session.run, summed
    task: dict[str, dict[str, TaskMetric]] = {
        mode: {name: factory() for name, factory in TASK_METRICS.items()} for mode in ("fp32", *MODES)
    }
    top1_output: str | None = None
    scratch = tempfile.TemporaryDirectory(prefix="quantcore-eval-")
    deployed_graph = Path(scratch.name) / "deployed.onnx"
    with contextlib.ExitStack() as stack:
        stack.enter_context(scratch)
        fp32 = stack.enter_context(open_session(fp32_model if reference is None else reference, device=config.device))
        exact = stack.enter_context(open_session(qdq_model, device=config.device, exact_qdq=True))
        sessions = {"qdq_exact": exact}
        skipped = fallback = None
        try:
            sessions["qdq_deployed"] = stack.enter_context(
                open_session(
                    qdq_model,
                    device=config.device,
                    optimized_model_path=deployed_graph,
                    disabled_optimizers=config.disabled_optimizers,
                )
            )
        except QuantcoreError as error:
            try:
                sessions["qdq_deployed"] = stack.enter_context(
                    open_session(
                        qdq_model,
                        device=config.device,
                        optimization=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                        optimized_model_path=deployed_graph,
                        disabled_optimizers=config.disabled_optimizers,
                    )
                )
                fallback = (
                    f"ONNX Runtime's full optimization cannot build this model ({str(error)[:300]}); deployed "
                    f"at basic optimization: Q/DQ run as float ops, no integer kernels"
                )
            except QuantcoreError as second:
                skipped = f"ONNX Runtime cannot build the deployed model: {second}"
        deployed_kernels = kernel_histogram(deployed_graph) if skipped is None else None
        start = 0
        total = len(batches)
        for i, batch in enumerate(batches):
            monitor.check(STAGE)
            size = min(batches.batch_size, batches.num_samples - start)
            started = time.perf_counter()
            try:
                reference = dict(zip(output_names, fp32.run(output_names, batch), strict=True))
            except RUNTIME_ERRORS as error:  # the FP32 model itself: the data does not fit it
                raise InvalidDataError(
                    f"evaluation data: the FP32 model does not run on samples {start} to {start + size - 1} "
                    f"({describe(batch)}): {runtime_message(error)}"
                ) from error
            seconds["fp32"] += time.perf_counter() - started
            if labels is not None and top1_output is None:
                top1_output = next((n for n in output_names if _scores(reference[n]) is not None), None)
                if top1_output is None:
                    raise InvalidDataError("labels were given but no model output has rank >= 2 to take argmax of")
            batch_labels = labels[start : start + size] if labels is not None else None
            if batch_labels is not None:
                for metric in task["fp32"].values():
                    metric.update(_scores(reference[top1_output]), batch_labels)
            results = {}
            for mode, session in sessions.items():
                started = time.perf_counter()
                results[mode] = dict(zip(output_names, session.run(output_names, batch), strict=True))
                seconds[mode] += time.perf_counter() - started
                for name in output_names:
                    agreement[mode][name].update(reference[name], results[mode][name])
                if batch_labels is not None:
                    for metric in task[mode].values():
                        metric.update(_scores(results[mode][top1_output]), batch_labels)
            if "qdq_deployed" in results:
                for name in output_names:
                    parity[name].update(results["qdq_exact"][name], results["qdq_deployed"][name])
            start += size
            monitor.report(STAGE, (i + 1) / total, f"batch {i + 1}/{total}")

    qdq_proto = onnx.load(str(qdq_model), load_external_data=False)
    report: dict[str, Any] = {
        "model": {
            "fp32_bytes": model_bytes(fp32_model),
            "qdq_bytes": model_bytes(qdq_model),
            "quantize_linear_nodes": count_ops(qdq_proto, *QUANTIZERS),
            "dequantize_linear_nodes": count_ops(qdq_proto, "DequantizeLinear"),
        },
        "num_samples": batches.num_samples,
        "batch_size": batches.batch_size,
        "top1_output": top1_output,
        "fp32": {"top1": task["fp32"]["top1"].result(), "task_metrics": _task_results(task["fp32"], labels)},
    }
    for mode in MODES:
        measured = mode in sessions
        report[mode] = {
            "top1": task[mode]["top1"].result() if measured else None,
            "task_metrics": _task_results(task[mode], labels if measured else None),
            "outputs": {name: agreement[mode][name].result() for name in output_names} if measured else {},
        }
    report["qdq_deployed"]["kernels"] = deployed_kernels
    report["qdq_deployed"]["integer_kernels"] = (
        None if deployed_kernels is None else sum(n for op, n in deployed_kernels.items() if op in INTEGER_KERNELS)
    )
    report["qdq_deployed"]["float_compute_kernels"] = (
        None if deployed_kernels is None else sum(n for op, n in deployed_kernels.items() if op in FLOAT_COMPUTE)
    )
    report["qdq_deployed"]["skipped"] = skipped
    report["qdq_deployed"]["fallback"] = fallback
    report["qdq_deployed"]["disabled_optimizers"] = list(config.disabled_optimizers)
    report["latency_ms_per_sample"] = {
        mode: 1000.0 * seconds[mode] / batches.num_samples if mode == "fp32" or mode in sessions else None
        for mode in seconds
    }
    report["deployed_vs_exact"] = (
        {name: parity[name].result() for name in output_names} if "qdq_deployed" in sessions else {}
    )
    return report
