"""``quantize``: the five stages in one call, with progress, cancellation and atomic outputs.

    prepare → annotate → calibrate → export → evaluate

Each stage reports ``progress(stage, 0.0, ...)`` at its start and ``progress(stage, 1.0, ...)`` at its
end (calibrate and evaluate also once per batch); ``should_cancel`` is polled before every stage and
between batches. Files appear in ``out_dir`` only complete (written under a temporary name, then
renamed): ``model.qdq.onnx`` (+ ``model.qdq.onnx.data`` beyond 2 GB), ``tqc.json``, ``checkpoint.json``
(what a resumed run may reuse, ``quantcore.checkpoint``), ``report.json``.
A run canceled or failed after export leaves the exported files in place; ``report.json`` is written
last, so its presence marks a finished run.

Deployed accuracy equals reported accuracy: after evaluate, ``quantcore.parity`` compares the
exported model run as exact Q/DQ with the same model on ONNX Runtime's integer kernels. When they
disagree beyond its tolerance and the platform knows the cause (u8s8 saturation without VNNI on the
onnxruntime platform), the model is re-annotated, re-calibrated, re-exported and re-evaluated with the
remedy (7-bit weights), inside the evaluate stage; the report's ``parity`` section says what was
measured, what was done and why, and ``config`` is the configuration of the files written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore import atomic, checkpoint
from quantcore.annotation import annotate
from quantcore.batching import Batches, input_specs
from quantcore.calibration import calibrate
from quantcore.config import QuantizeConfig
from quantcore.engine import build_engine, cpu_latency
from quantcore.engine.profiles import observed_shapes
from quantcore.evaluation import check_labels, evaluate
from quantcore.parity import check_parity, remedy
from quantcore.preparation import prepare
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.qdq import export
from quantcore.report import REPORT_FORMAT, jsonable

STAGES = ("prepare", "annotate", "calibrate", "export", "evaluate", "latency", "engine")
REPORT_FILE = "report.json"


@dataclass(frozen=True)
class QuantizeResult:
    model_path: Path  # the QDQ ONNX model
    tqc_path: Path  # every quantized tensor's config, JSON
    report_path: Path  # the report below, JSON
    report: dict[str, Any]
    engine_path: Path | None = None  # the TensorRT engine, when one was built
    engine_metadata_path: Path | None = None  # its engine.json


class _Stages:
    """Runs the stage protocol: cancel check, start/end progress, wall-clock time per stage."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.seconds: dict[str, float] = {}

    def begin(self, stage: str) -> float:
        self.monitor.check(stage)
        self.monitor.report(stage, 0.0, f"{stage} started")
        return time.perf_counter()

    def end(self, stage: str, started: float, message: str) -> None:
        self.seconds[stage] = round(time.perf_counter() - started, 3)
        self.monitor.report(stage, 1.0, message)


def quantize(
    model_path: str | Path,
    calibration: Mapping[str, np.ndarray],
    evaluation: Mapping[str, np.ndarray],
    config: QuantizeConfig,
    out_dir: str | Path,
    *,
    labels: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
    resume_from: str | Path | None = None,
) -> QuantizeResult:
    """Quantize the FP32 ONNX model at ``model_path`` to a QDQ model for ``config.platform`` in ``out_dir``.

    calibration / evaluation: ``{input name: array}``, first axis samples (batched by
    ``config.batch_size`` or the model's fixed batch dimension). labels: optional (N_eval,) integer
    class ids for top-1 accuracy. Raises ``InvalidModelError``, ``UnsupportedModelError``,
    ``InvalidDataError`` (checked before any slow stage), or ``Canceled``.

    After export, ``checkpoint.json`` records the exported files (``quantcore.checkpoint``). With
    ``resume_from`` (a directory an earlier run of the same model, calibration data and config wrote
    into, usually ``out_dir`` itself), a valid checkpoint there replaces calibrate and export: those
    stages neither run nor report progress, and the report's ``resumed`` lists them.
    """
    monitor = Monitor(progress, should_cancel)
    stages = _Stages(monitor)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    started = stages.begin("prepare")
    # The first calibration batch lets prepare fold Ifs that depend on input shapes or flag inputs.
    source_specs = input_specs(onnx.load(str(model_path), load_external_data=False))
    sample = next(iter(Batches(calibration, source_specs, config.batch_size, what="calibration")), None)
    prepared = prepare(model_path, sample=sample)
    specs = input_specs(prepared.model)
    calibration_batches = Batches(calibration, specs, config.batch_size, what="calibration")
    evaluation_batches = Batches(evaluation, specs, config.batch_size, what="evaluation")
    check_labels(labels, evaluation_batches.total_samples, evaluation_batches.num_samples)
    stages.end(
        "prepare",
        started,
        f"folded {len(prepared.folded_batchnorms)} BatchNormalization, {prepared.folded_constants} constant nodes",
    )

    started = stages.begin("annotate")
    annotation = annotate(prepared, config)
    stages.end(
        "annotate",
        started,
        f"{len(annotation.activations)} activations, {len(annotation.parameters)} weights to quantize",
    )

    key = checkpoint.fingerprint(Path(model_path), calibration, config)
    exported = checkpoint.load(Path(resume_from), out_dir, key) if resume_from is not None else None
    resumed = ["calibrate", "export"] if exported is not None else []
    if exported is None:
        started = stages.begin("calibrate")
        calibrated = calibrate(
            prepared, annotation, calibration_batches, config, progress=progress, should_cancel=should_cancel
        )
        stages.end("calibrate", started, f"calibrated on {calibration_batches.num_samples} samples")

        started = stages.begin("export")
        exported = export(prepared, calibrated, out_dir, platform=config.platform)
        checkpoint.save(out_dir, key, exported)
        stages.end(
            "export",
            started,
            f"{exported.quantize_linear_nodes} QuantizeLinear, {exported.dequantize_linear_nodes} DequantizeLinear",
        )

    started = stages.begin("evaluate")
    evaluation_report = evaluate(
        model_path,
        exported.model_path,
        evaluation,
        config,
        labels=labels,
        progress=progress,
        should_cancel=should_cancel,
    )
    verdict = check_parity(evaluation_report)
    parity: dict[str, Any] = {**verdict.to_dict(), "remedy": None, "before_remedy": None}
    fix = remedy(config) if verdict.agree is False else None
    if fix is not None:
        config, reason = fix
        annotation = annotate(prepared, config)
        calibrated = calibrate(prepared, annotation, calibration_batches, config, should_cancel=should_cancel)
        exported = export(prepared, calibrated, out_dir, platform=config.platform)
        evaluation_report = evaluate(
            model_path, exported.model_path, evaluation, config, labels=labels, should_cancel=should_cancel
        )
        parity = {
            **check_parity(evaluation_report).to_dict(),
            "remedy": reason,
            "before_remedy": verdict.to_dict(),
        }
    stages.end("evaluate", started, f"evaluated on {evaluation_report['num_samples']} samples")

    latency = None
    if config.cpu_latency:
        started = stages.begin("latency")
        sample = next(iter(evaluation_batches), None)
        latency = cpu_latency(model_path, exported.model_path, sample=sample)
        stages.end("latency", started, "FP32 vs quantized on the CPU EP")

    engine = None
    if config.tensorrt_engine:
        started = stages.begin("engine")
        engine = build_engine(
            exported.model_path,
            out_dir / "engine",
            fp32_model_path=model_path,
            evaluation=evaluation,
            calibration_shapes=observed_shapes(calibration, calibration_batches.batch_size),
            progress=progress,
            should_cancel=should_cancel,
        )
        stages.end("engine", started, f"engine {engine.status}" + (f": {engine.reason}" if engine.reason else ""))

    report = jsonable(
        {
            "format": REPORT_FORMAT,
            "config": config.to_dict(),
            "prepare": {
                "source_opset": prepared.source_opset,
                "opset": prepared.opset,
                "folded_batchnorms": [
                    {"node": f.node, "batchnorm": f.batchnorm, "output": f.output} for f in prepared.folded_batchnorms
                ],
                "folded_constants": prepared.folded_constants,
                "renamed_nodes": prepared.renamed_nodes,
            },
            "annotation": annotation.summary(),
            "calibration": {
                "num_samples": calibration_batches.num_samples,
                "batch_size": calibration_batches.batch_size,
                "num_batches": len(calibration_batches),
            },
            "evaluation": evaluation_report,
            "parity": parity,
            "latency": {"cpu": latency},
            "engine": engine.to_dict() if engine is not None else None,
            "stage_seconds": stages.seconds,
            "resumed": resumed,
            "warnings": [*prepared.warnings, *annotation.warnings, *exported.warnings],
        }
    )
    report_path = out_dir / REPORT_FILE
    atomic.write_json(report_path, report)
    built = engine is not None and engine.status == "built"
    return QuantizeResult(
        model_path=exported.model_path,
        tqc_path=exported.tqc_path,
        report_path=report_path,
        report=report,
        engine_path=engine.engine_path if built else None,
        engine_metadata_path=engine.metadata_path if built else None,
    )
