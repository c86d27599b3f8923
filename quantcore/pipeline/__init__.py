"""``quantize``: the stages in one call, with progress, cancellation and atomic outputs.

    prepare → annotate → calibrate → clip → reconstruct → mixed_precision → qat → export → place → evaluate
    → analyze → target → latency → engine → cpu_alternative

One function per stage, each in the module of its concept: prepare to export (and resuming from a
checkpoint) in ``quantization``, place, evaluate with the parity remedy, latency and engine in ``deployment``,
analyze and target in ``diagnosis``; each takes and returns the typed results of
``quantcore.report.stage_results``, from which ``quantcore.report.document`` assembles the report.

Each stage reports ``progress(stage, 0.0, ...)`` at its start and ``progress(stage, 1.0, ...)`` at its
end (calibrate and evaluate also once per batch); ``should_cancel`` is polled before every stage and
between batches (``quantcore.pipeline.run.StageClock``). Files appear in ``out_dir`` only complete
(written under a temporary name, then renamed): ``model.qdq.onnx`` (+ ``model.qdq.onnx.data`` beyond
2 GB), ``tqc.json``, ``checkpoint.json`` (what a resumed run may reuse, ``quantcore.export.checkpoint``),
``report.html``, ``report.json``. A run canceled or failed after export leaves the exported files in
place; ``report.json`` is written last, so its presence marks a finished run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantcore.config import WEIGHT_ONLY_PLATFORM, QuantizeConfig
from quantcore.export import checkpoint
from quantcore.export.qdq import ExportResult
from quantcore.pipeline.cpu_alternative import cpu_alternative_stage
from quantcore.pipeline.deployment import engine_stage, evaluate_stage, latency_stage, place_stage
from quantcore.pipeline.diagnosis import analyze_stage, target_stage
from quantcore.pipeline.quantization import (
    annotate_stage,
    calibrate_stage,
    clip_stage,
    export_stage,
    mixed_precision_stage,
    prepare_stage,
    qat_stage,
    reconstruct_stage,
    restore_checkpoint,
)
from quantcore.pipeline.run import Run, StageClock
from quantcore.pipeline.weight_only import quantize_weight_only
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.report.document import build_report, write_report
from quantcore.tensorrt.engine import EngineResult, build_engine

STAGES = (
    "auto",  # strategy auto only: the search before the stages (``quantcore.auto``)
    "prepare",
    "annotate",
    "calibrate",
    "clip",
    "reconstruct",
    "mixed_precision",  # reports itself skipped unless config.mixed_precision (``quantcore.analysis.mixed_precision``)
    "qat",  # reports itself skipped unless config.qat (``quantcore.qat``)
    "export",
    "place",  # cpu_objective latency only: regions kept float where faster (``quantcore.analysis.placement``)
    "evaluate",
    "analyze",
    "target",
    "latency",
    "engine",
    "cpu_alternative",  # the onnxruntime platform measured beside a model no engine was built for
)


@dataclass(frozen=True)
class QuantizeResult:
    model_path: Path  # the QDQ ONNX model
    tqc_path: Path  # every quantized tensor's config, JSON
    report_path: Path  # the report below, JSON
    # (report.html beside it: the same report as a standalone page, ``quantcore.report.html``)
    report: dict[str, Any]
    model_data_path: Path | None = None  # the model's external data (``model.qdq.onnx.data``), beyond 2 GB
    engine_path: Path | None = None  # the TensorRT engine, when one was built
    engine_metadata_path: Path | None = None  # its engine.json

    @classmethod
    def of(
        cls, exported: ExportResult, engine: EngineResult | None, report_path: Path, report: dict[str, Any]
    ) -> QuantizeResult:
        """The paths of a finished run: the kept model's files, and the engine's when one was built."""
        built = engine is not None and engine.status == "built"
        return cls(
            model_path=exported.model_path,
            tqc_path=exported.tqc_path,
            report_path=report_path,
            report=report,
            model_data_path=next((f for f in exported.files if f.name == f"{exported.model_path.name}.data"), None),
            engine_path=engine.engine_path if built else None,
            engine_metadata_path=engine.metadata_path if built else None,
        )


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
    engine_builder: Callable[..., EngineResult] = build_engine,
    resume_from: str | Path | None = None,
    auto: Mapping[str, Any] | None = None,
    calibration_labels: np.ndarray | None = None,
) -> QuantizeResult:
    """Quantize the FP32 ONNX model at ``model_path`` to a QDQ model for ``config.platform`` in ``out_dir``.

    calibration / evaluation: ``{input name: array}``, samples along each input's batch axis
    (``quantcore.runtime.batching``: usually the first; a constant input's array is its value), batched by
    ``config.batch_size`` or the model's fixed batch dimension. labels: optional (N_eval,) integer
    class ids for top-1 accuracy. calibration_labels: optional (N_calibration,) class ids of the
    calibration samples, for QAT's label loss (``QatConfig.label_weight``). engine_builder: called like
    ``build_engine`` for the engine stage (a service passes one that builds where a GPU is, or skips with
    the reason). Raises
    ``InvalidModelError``, ``UnsupportedModelError``, ``InvalidDataError`` (checked before any slow
    stage), or ``Canceled``.

    After export, ``checkpoint.json`` records the exported files (``quantcore.export.checkpoint``). With
    ``resume_from`` (a directory an earlier run of the same model, calibration data and config wrote
    into, usually ``out_dir`` itself), a valid checkpoint there replaces calibrate and export (their
    calibrated configs are read back from its ``tqc.json``): those stages neither run nor report
    progress, and the report's ``resumed`` lists them. Runs with reconstruction always recompute (the
    checkpoint does not hold the learned model); QAT resumes from its own training checkpoint there
    (``quantcore.qat.checkpoint``).

    ``config.strategy`` must be ``fixed``: ``strategy="auto"`` runs through ``quantcore.auto.quantize_auto``,
    which calls this with the config it chose and its search's report section as ``auto`` (the report's
    ``auto``; None otherwise).

    Platform ``onnxruntime-weight-only`` runs its own stages (``quantcore.pipeline.weight_only``: the
    weights at 4 or 8 bits blockwise, activations float, ``config.weight_only``); ``resume_from`` and
    ``engine_builder`` do not apply to it.
    """
    if config.strategy != "fixed":
        raise ValueError(f"quantize runs strategy 'fixed'; strategy {config.strategy!r} runs through quantize_auto")
    monitor = Monitor(progress, should_cancel)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(model_path, calibration, evaluation, labels, out_dir, monitor, StageClock(monitor), calibration_labels)
    if config.platform == WEIGHT_ONLY_PLATFORM:
        exported, report = quantize_weight_only(run, config)
        return QuantizeResult.of(exported, None, write_report(out_dir, report), report)

    inputs = prepare_stage(run, config)
    annotation = annotate_stage(run, inputs, config)
    key = checkpoint.fingerprint(Path(model_path), calibration, config)  # the config as given: a rerun matches
    model = restore_checkpoint(run, inputs, annotation, config, key, resume_from)
    if model is None:
        calibrated = calibrate_stage(run, inputs, annotation, config)
        calibrated = clip_stage(run, inputs, calibrated)
        calibrated = reconstruct_stage(run, inputs, calibrated)
        promoted, calibrated = mixed_precision_stage(run, inputs, annotation, calibrated)
        calibrated = qat_stage(run, inputs, calibrated, key, resume_from)
        model = export_stage(run, promoted, calibrated, key)
    model = place_stage(run, inputs, model)
    evaluated = evaluate_stage(run, inputs, model)
    analyzed = analyze_stage(run, inputs, evaluated)
    evaluated = target_stage(run, inputs, evaluated, analyzed)
    latency = latency_stage(run, inputs, evaluated)
    engine = engine_stage(run, inputs, evaluated, engine_builder)
    alternative = cpu_alternative_stage(run, inputs, evaluated, engine)

    report = build_report(
        inputs, evaluated, analyzed, latency, engine, run.clock.seconds, auto, cpu_alternative=alternative
    )
    report_path = write_report(out_dir, report)
    return QuantizeResult.of(evaluated.model.exported, engine, report_path, report)
