"""The onnxruntime platform measured beside a model no TensorRT engine was built for
(``QuantizeConfig.cpu_alternative``, stage ``cpu_alternative``).

A model quantized by the tensorrt rules that gets no engine runs, if anywhere, on a CPU, where ONNX
Runtime computes most of its Q/DQ in float (the latency stage says so). This stage measures what the
onnxruntime platform gives instead, on the same prepared model and calibration data: the model
annotated by the onnxruntime rules (the run's other options kept; ``cpu_objective`` accuracy: every
region the rules quantize, no placement, whose default ``latency`` objective would only return slower
regions to float), calibrated on the full calibration data, exported into a scratch directory that is
removed after, evaluated as the kept model was (``evaluate``: the deployed main output's cosine to
FP32), and timed interleaved with FP32 (the prepared model) and the kept model at the config's batch
sizes and threads (``paired_latency.interleaved_times``: load from other processes falls on all three).

It runs only when the engine stage was skipped: with an engine, TensorRT is where the model runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantcore.annotate.annotation import annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.evaluate.cpu_latency import fixed_batch, resolved_threads
from quantcore.evaluate.evaluation import evaluate
from quantcore.evaluate.paired_latency import Timing, interleaved_times
from quantcore.export.qdq import build_qdq_model
from quantcore.pipeline.run import Run
from quantcore.report.stage_results import Evaluated, PreparedInputs
from quantcore.runtime.batching import input_specs
from quantcore.tensorrt.engine import EngineResult

STAGE = "cpu_alternative"
PLATFORM = "onnxruntime"
BUDGET_S = 1.0  # seconds of interleaved runs per batch size: three models, as many runs each
LABELS = ("fp32", "default", PLATFORM)  # the models timed, in this order


def main_output(evaluation: dict[str, Any]) -> str | None:
    """The output the top-1 is read from, else the model's first: the one a summary quotes."""
    outputs = list((evaluation.get("qdq_deployed") or {}).get("outputs") or {})
    top1 = evaluation.get("top1_output")
    return top1 if top1 in outputs else (outputs[0] if outputs else None)


def _cosine(evaluation: dict[str, Any], output: str | None) -> float | None:
    metrics = ((evaluation.get("qdq_deployed") or {}).get("outputs") or {}).get(output) or {}
    return metrics.get("cosine")


def cpu_alternative_stage(
    run: Run, inputs: PreparedInputs, evaluated: Evaluated, engine: EngineResult | None
) -> dict[str, Any] | None:
    """With ``config.cpu_alternative`` and a skipped engine stage: the report section the module
    describes (``jobs.report_schema.CpuAlternative``). Otherwise None, and the stage does not run."""
    model = evaluated.model
    if not model.config.cpu_alternative or engine is None or engine.status != "skipped":
        return None
    started = run.clock.begin(STAGE)
    config = replace(
        model.config, platform=PLATFORM, cpu_objective="accuracy", tensorrt_engine=False, cpu_alternative=False
    )
    annotation = annotate(model.prepared, config)
    calibrated = calibrate(
        model.prepared, annotation, inputs.calibration, config, should_cancel=run.monitor.should_cancel
    )
    alternative = build_qdq_model(model.prepared, calibrated)
    with tempfile.TemporaryDirectory(prefix="quantcore-alternative-") as scratch:
        path = Path(scratch) / "model.qdq.onnx"
        path.write_bytes(alternative.SerializeToString())
        evaluation = evaluate(
            run.model_path, path, run.evaluation, config, labels=run.labels, should_cancel=run.monitor.should_cancel
        )
    run.monitor.check(STAGE)
    threads = resolved_threads(config.cpu_threads)
    specs = input_specs(model.prepared.model)
    fixed = fixed_batch(specs)
    batch_sizes = (fixed,) if fixed is not None else config.cpu_batch_sizes
    models = [
        model.prepared.model.SerializeToString(),
        model.exported.model_path.read_bytes(),
        alternative.SerializeToString(),
    ]
    sample = next(iter(inputs.evaluation), None)
    raw = interleaved_times(models, batch_sizes, specs=specs, sample=sample, threads=threads, budget_s=BUDGET_S)
    timings: dict[str, dict[str, Any]] = {}
    speedups: dict[str, dict[str, float | None]] = {"default": {}, PLATFORM: {}}
    for batch, times in raw.items():
        key = f"batch_{batch}"
        summary = {label: None if isinstance(t, str) else Timing.of(t) for label, t in zip(LABELS, times, strict=True)}
        timings[key] = {label: None if t is None else t.to_dict() for label, t in summary.items()}
        fp32 = summary["fp32"]
        for label in ("default", PLATFORM):
            timed = summary[label]
            speedups[label][key] = None if fp32 is None or timed is None else fp32.p50_ms / timed.p50_ms
    output = main_output(evaluated.evaluation)
    section = {
        "platform": PLATFORM,
        "why": f"no TensorRT engine was built ({engine.reason or 'skipped'}) and the recipe named no platform",
        "objective": "accuracy (every region the onnxruntime rules quantize; no placement)",
        "threads": threads,
        "batch_sizes": list(raw),
        "timings": timings,
        "speedup_p50": speedups,
        "output": output,
        "cosine": {"default": _cosine(evaluated.evaluation, output), PLATFORM: _cosine(evaluation, output)},
    }
    run.clock.end(STAGE, started, f"platform {PLATFORM} measured beside the kept model on this CPU")
    return section
